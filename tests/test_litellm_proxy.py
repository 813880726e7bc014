"""The LiteLLM proxy as nbs/how_to/37_litellm_proxy.ipynb sets it up: its `config.yaml` and `dars_plugin.py`, copied as
they are, in a real `litellm --config` process on loopback, in front of fixed-answer models. Every spelling of λ routes
as `RouterBundle.route` does, a bad λ is a 400, a rate-limited pick leaves its requests to the next model, and with
both routed models stopped the fallback group answers."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import venv
from contextlib import contextmanager
from pathlib import Path

import httpx
import pandas as pd
import pytest

from dars_nb.testing import forced_test_flags

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / 'nbs' / 'how_to' / '37_litellm_proxy.ipynb'
START_LIMIT_S = 240          # LiteLLM imports a great deal: about a minute on two busy cores
WORDS = ['apple', 'river', 'stone', 'cloud', 'maple', 'tiger', 'piano', 'lemon', 'orbit', 'quartz']
QUESTIONS = [f'question {w}' for w in WORDS]
KEY = 'sk-dars-test-master-key'

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group('litellm_proxy')]


def page_block(first_line: str) -> str:
    "The fenced code block of the page whose first line is `first_line`, as the page shows it."
    text = '\n'.join(''.join(c['source']) for c in json.loads(PAGE.read_text())['cells'] if c['cell_type'] == 'markdown')
    blocks = [b for b in re.findall(r'```[a-z]*\n(.*?)```', text, re.S) if b.startswith(first_line + '\n')]
    assert len(blocks) == 1, f'the page has {len(blocks)} blocks starting {first_line!r}'
    return blocks[0]


def test_the_page_config_is_complete():
    import yaml
    config = yaml.safe_load(page_block('# config.yaml'))
    groups = [m['model_name'] for m in config['model_list']]
    assert groups.count('dars-router') == 2 and 'gpt-4o-mini' in groups
    settings = config['router_settings']
    assert settings['plugins'] == ['dars_plugin.dars_router']
    assert {'dars-router': ['gpt-4o-mini']} in settings['fallbacks']
    routed = [m['litellm_params'] for m in config['model_list'] if m['model_name'] == 'dars-router']
    assert all(p['cooldown_time'] == 0 for p in routed)   # a cooled-down pick would leave the plugin's narrowing nothing
    assert config['general_settings']['master_key'] == 'os.environ/LITELLM_MASTER_KEY'   # LiteLLM 1.110 needs one


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def trained_bundle():
    "Ten questions: gemma3 scores 0.05 to 0.50 more than smollm2 and costs five times as much."
    from dars_nb.bundle.training import train
    rows = [dict(dataset='d', split='train', view='grid', query_id=str(i), model=m, rewrite_id=0, sample_id=0,
                 score=q, cost=c, query_text=q_text)
            for i, q_text in enumerate(QUESTIONS) for m, q, c in (('gemma3', 0.45 + 0.05 * i, 1.0), ('smollm2', 0.4, 0.2))]
    return train(dict(observations=pd.DataFrame(rows), router=dict(family='kNN', n_neighbors=1),
                      guard=dict(enabled=False)), quiet=True)


@contextmanager
def running_proxy(litellm_cli: Path, work: Path, bundle, endpoints: dict, env: dict):
    "(base URL, seconds to start) of `litellm --config` run in `work` with the page's two files, stopped on exit."
    from dars_nb.bundle import save_bundle
    (work / 'runs').mkdir(exist_ok=True)
    save_bundle(bundle, work / 'runs' / 'local.router')
    (work / 'config.yaml').write_text(page_block('# config.yaml'))
    (work / 'dars_plugin.py').write_text(page_block('# dars_plugin.py, next to config.yaml'))
    port = _free_port()
    env = dict(env, LITELLM_MASTER_KEY=KEY, SMOLLM2_API_BASE=endpoints['smollm2'].base_url,
               GEMMA3_API_BASE=endpoints['gemma3'].base_url, OPENAI_API_KEY='unused',
               OPENAI_BASE_URL=endpoints['gpt-4o-mini'].base_url, LITELLM_LOCAL_MODEL_COST_MAP='True')
    log_path = work / 'proxy.log'
    with open(log_path, 'wb') as log:
        started = time.monotonic()
        proc = subprocess.Popen([str(litellm_cli), '--config', 'config.yaml', '--host', '127.0.0.1', '--port', str(port)],
                                cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f'http://127.0.0.1:{port}'
        try:
            while True:
                if proc.poll() is not None:
                    pytest.fail(f'litellm --config exited with {proc.returncode}:\n' + log_path.read_text()[-3000:])
                if time.monotonic() - started > START_LIMIT_S:
                    pytest.fail(f'litellm --config did not answer in {START_LIMIT_S} s:\n' + log_path.read_text()[-3000:])
                try:
                    if httpx.get(base + '/health/liveliness', timeout=2).status_code == 200: break
                except httpx.HTTPError: pass
                time.sleep(0.2)
            yield base, time.monotonic() - started
        finally:
            proc.terminate()
            try: proc.wait(timeout=30)
            except subprocess.TimeoutExpired: proc.kill(); proc.wait(timeout=30)


@pytest.fixture(scope='module')
def endpoints():
    "Fixed-answer stand-ins for the two routed models and the fallback group's model, each naming itself."
    from dars_nb.testing import FixedEndpoint
    running = {m: FixedEndpoint(f'{m} says 4', delay_s=0).start() for m in ('smollm2', 'gemma3', 'gpt-4o-mini')}
    yield running
    for e in running.values(): e.stop()


@pytest.fixture(scope='module')
def gemma3_gate(endpoints):
    "A fault proxy in front of gemma3: it passes every request until a test plans faults (a 429 asks for ten minutes)."
    from dars_nb.testing import FaultProxy
    gate = FaultProxy(endpoints['gemma3'].base_url, retry_after=600).start()
    yield gate
    gate.stop()


@pytest.fixture(scope='module')
def proxy(tmp_path_factory, endpoints, gemma3_gate):
    "(base URL, bundle, the fixed-answer endpoints, seconds to start) of the page's proxy, run from this checkout."
    litellm_cli = Path(sys.executable).with_name('litellm')
    if not litellm_cli.exists(): pytest.fail("the litellm command is missing: pip install 'dars_nb[proxy]' (make setup)")
    bundle = trained_bundle()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    routed = dict(endpoints, gemma3=gemma3_gate)
    with running_proxy(litellm_cli, tmp_path_factory.mktemp('litellm_proxy'), bundle, routed, env) as (base, start_s):
        yield base, bundle, endpoints, start_s


def ask(base: str, text: str, model: str = 'dars-router', headers=None, **body) -> httpx.Response:
    return httpx.post(base + '/v1/chat/completions', timeout=60,
                      headers={'Authorization': f'Bearer {KEY}', **(headers or {})},
                      json={'model': model, 'messages': [{'role': 'user', 'content': text}], **body})


def answered_by(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()['choices'][0]['message']['content'].split()[0]


def test_every_lambda_spelling_routes_as_the_bundle(proxy, capsys):
    base, bundle, _, start_s = proxy
    with capsys.disabled(): print(f'\nlitellm --config (the page config) started in {start_s:.1f} s')
    assert bundle.route(QUESTIONS).count('gemma3') == 10 and bundle.route(QUESTIONS, 0.5).count('gemma3') == 3
    default = [answered_by(ask(base, q)) for q in QUESTIONS]
    by_name = [answered_by(ask(base, q, model='dars-router-0.5')) for q in QUESTIONS]
    by_metadata = [answered_by(ask(base, q, metadata={'dars_lambda': 0.5})) for q in QUESTIONS]
    by_header = [answered_by(ask(base, q, headers={'x-dars-lambda': '0.5'})) for q in QUESTIONS]
    agreeing = [answered_by(ask(base, q, model='dars-router-0.5', metadata={'dars_lambda': '0.5'},
                                headers={'x-dars-lambda': '0.50'})) for q in QUESTIONS]
    assert default == bundle.route(QUESTIONS)
    for seen in (by_name, by_metadata, by_header, agreeing): assert seen == bundle.route(QUESTIONS, 0.5)
    assert answered_by(ask(base, QUESTIONS[0], model='gpt-4o-mini')) == 'gpt-4o-mini'   # another group: untouched


@pytest.mark.parametrize('kw, said', [
    (dict(metadata={'dars_lambda': 'cheap'}), "metadata.dars_lambda must be a finite number >= 0, got 'cheap'"),
    (dict(headers={'x-dars-lambda': '-1'}), 'the x-dars-lambda header must be a finite number >= 0'),
    (dict(model='dars-router-0.5', metadata={'dars_lambda': 0.2}), 'disagree (0.5 and 0.2)'),
    (dict(metadata={'dars_lambda': 0.2}, headers={'x-dars-lambda': '0.3'}), 'disagree (0.2 and 0.3)'),
])
def test_a_bad_lambda_is_a_400_naming_it_and_asks_no_model(proxy, kw, said):
    base, _, endpoints, _ = proxy
    sent = sum(e.requests for e in endpoints.values())
    r = ask(base, QUESTIONS[0], **kw)
    assert r.status_code == 400, r.text
    first, *rest = r.json()['error']['message'].splitlines()
    assert first.startswith('litellm.BadRequestError: dars-router: ') and said in first, first
    # what LiteLLM adds: its fallback group was tried and the plugin refused that hop alike
    assert all(said in line for line in rest if 'BadRequestError' in line), rest
    assert sum(e.requests for e in endpoints.values()) == sent          # no model was asked, none retried


def test_a_rate_limited_pick_sends_each_request_to_the_next_model(proxy, gemma3_gate):
    """A 429 that asks for ten minutes would cool gemma3 down and leave the plugin's narrowing nothing; with the page's
    `cooldown_time: 0` each request tries gemma3, LiteLLM's retry goes to smollm2, and gemma3 answers once it is lifted."""
    base, bundle, _, _ = proxy
    assert bundle.route(QUESTIONS[-3:]) == ['gemma3'] * 3
    tried = len(gemma3_gate.log)
    gemma3_gate.plan.extend(['429'] * 3)
    assert [answered_by(ask(base, q)) for q in QUESTIONS[-3:]] == ['smollm2'] * 3
    assert [action for _, action in gemma3_gate.log[tried:]] == ['429'] * 3     # each request tried its pick first
    assert answered_by(ask(base, QUESTIONS[-1])) == 'gemma3'


def test_a_stopped_pick_is_retried_on_the_next_model_then_the_fallback_group_answers(proxy):
    base, bundle, endpoints, _ = proxy
    assert bundle.rank([QUESTIONS[-1]])[0] == ['gemma3', 'smollm2']
    endpoints['gemma3'].stop()                                   # the pick: LiteLLM retries on the next model
    assert answered_by(ask(base, QUESTIONS[-1])) == 'smollm2'
    endpoints['smollm2'].stop()                                  # both: the fallback group answers
    before = endpoints['gpt-4o-mini'].requests
    assert answered_by(ask(base, QUESTIONS[-1])) == 'gpt-4o-mini'
    assert answered_by(ask(base, QUESTIONS[0], model='dars-router-0.5')) == 'gpt-4o-mini'
    assert answered_by(ask(base, QUESTIONS[1], metadata={'dars_lambda': 0.5})) == 'gpt-4o-mini'
    assert endpoints['gpt-4o-mini'].requests == before + 3


@pytest.mark.slow
@pytest.mark.skipif('slow' not in forced_test_flags(), reason="minutes, from the package index: DARS_TEST_FLAGS=slow")
@pytest.mark.timeout(1800)
def test_a_clean_virtualenv_installs_the_proxy_in_one_command(tmp_path, capsys):
    "`pip install '.[proxy]'` into a new virtualenv, as the page says, and the page's proxy routes a request."
    from dars_nb.testing import FixedEndpoint
    env_dir = tmp_path / 'venv'
    venv.create(env_dir, with_pip=True)
    user_env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}
    started = time.monotonic()
    res = subprocess.run([str(env_dir / 'bin' / 'python'), '-m', 'pip', 'install', '-q', f'{ROOT}[proxy]'],
                         capture_output=True, text=True, timeout=1500, env=user_env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    installed_s = time.monotonic() - started
    stand_ins = {m: FixedEndpoint(f'{m} says 4', delay_s=0).start() for m in ('smollm2', 'gemma3', 'gpt-4o-mini')}
    try:
        work = tmp_path / 'proxy'
        work.mkdir()
        with running_proxy(env_dir / 'bin' / 'litellm', work, trained_bundle(), stand_ins, user_env) as (base, start_s):
            assert answered_by(ask(base, QUESTIONS[-1], headers={'x-dars-lambda': '0.5'})) == 'gemma3'
            assert answered_by(ask(base, QUESTIONS[0], headers={'x-dars-lambda': '0.5'})) == 'smollm2'
    finally:
        for e in stand_ins.values(): e.stop()
    with capsys.disabled(): print(f'\npip install .[proxy] took {installed_s:.0f} s; the proxy started in {start_s:.1f} s')
