"""Collection end to end against real local models (llama.cpp), a SIGKILL mid-run, and bad input through the CLI functions.

Uses the fixtures of conftest.py (`local_server`: SmolLM2-135M-Instruct and Gemma-3-270M behind one
OpenAI-compatible base URL; `fault_proxy`). The benchmark questions come from the samples in the repository's
data/ folder (each config's `data_dir`; the full sets are not needed). SmolLM2 is also the
rewriter: its rewrites are poor and the validity checks flag them — expected, and not what is tested here.
"""
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from dars_nb.observations import KEY_COLUMNS
from dars_nb.collect.command import collect_main, EXIT_OK, EXIT_ERROR
from dars_nb.collect.config import load_config
from dars_nb.collect.tasks import load_tasks
from dars_nb.collect.plan import plan_calls
from dars_nb.collect.store import Store

DATA = Path(__file__).resolve().parents[1] / 'data'   # the repository's samples of MMLU and MATH-500
MAX_TOKENS = 24


def _model(url, p_in, p_out, remote, conc):
    return [f'base_url = "{url}"', f'price_in = {p_in}', f'price_out = {p_out}', f'remote_name = "{remote}"',
            f'concurrency = {conc}', f'max_tokens = {{ choice = {MAX_TOKENS}, math = {MAX_TOKENS}, reading = {MAX_TOKENS} }}']


def pool_toml(models: dict, rewriter='smollm2', limits: str = 'timeout_s = 300\nbackoff_s = 0.05') -> str:
    """The pool part of a config: models = {name: (base_url, price_in, price_out, remote_name, concurrency)};
    rewriter = a model name, or (name, base_url, price_in, price_out, remote_name, concurrency) for a [rewriter] table."""
    out = [f'rewriter = "{rewriter}"'] if isinstance(rewriter, str) else []
    out += ['[limits]', limits]
    for name, spec in models.items(): out += [f'[models."{name}"]', *_model(*spec)]
    if isinstance(rewriter, tuple): out += ['[rewriter]', f'name = "{rewriter[0]}"', *_model(*rewriter[1:])]
    return '\n'.join(out) + '\n'


def collection_toml(store='store.sqlite', output='obs.parquet', n=2, m=2, tr=3, td=3, attempts=2, extra='') -> str:
    return (f'[collection]\nstore = "{store}"\noutput = "{output}"\nn_rewrites = {n}\nn_decodes = {m}\n'
            f'test_rewrites = {tr}\ntest_decodes = {td}\nrewrite_max_tokens = 64\nrewrite_attempts = {attempts}\n'
            f'similarity = "tfidf"\ndata_dir = "{DATA}"\n{extra}\n')


MMLU = '[[datasets]]\nsource = "mmlu"\ntrain = {train}\ntest = {test}\noptions = {{ subjects = ["high_school_physics"] }}\n'
MATH = '[[datasets]]\nsource = "math500"\ntrain = {train}\ntest = {test}\n'


def files_digest(path: Path) -> dict:
    "SHA-256 of a store and its WAL/SHM files (whatever exists; the writer lock file is not the store)."
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.parent.glob(path.name + '*'))
            if p.suffix != '.lock'}


# ---------------------------------------------------------------------------------------------------------------
# a real small collection: 2 real models, MMLU + MATH, 2x2 grid + both test views, faults on one endpoint

def test_real_collection(local_server, fault_proxy, tmp_path, capsys):
    url = local_server.base_url
    # SmolLM2 goes through a proxy that injects a rate limit, a server error and an answer stripped of its
    # `Final Answer:` line; Gemma is reached directly.
    # The rewriter is SmolLM2 too, reached directly under its own name.
    proxy = fault_proxy(plan=['429', '500', 'no_answer'], retry_after=0.1)
    cfg = tmp_path / 'collect.toml'
    cfg.write_text(pool_toml({'smollm2': (proxy.base_url, 0.02, 0.04, 'smollm2', 1), 'gemma3': (url, 0.04, 0.08, 'gemma3', 1)},
                             rewriter=('rewriter', url, 0.02, 0.04, 'smollm2', 1))
                   + collection_toml(attempts=1) + MMLU.format(train=2, test=1) + MATH.format(train=1, test=1))

    assert collect_main(str(cfg), dry_run=True) == EXIT_OK
    dry = capsys.readouterr().out
    assert 'observations planned' in dry and 'cost estimate' in dry
    assert not (tmp_path / 'store.sqlite').exists()

    code = collect_main(str(cfg))
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err

    conf = load_config(cfg)
    plan = plan_calls(conf)
    # per model: MMLU 2 x (2x2) + 1 x (3 + 3), MATH 1 x (2x2) + 1 x (3 + 3) = 24
    assert len(plan) == 2 * 24
    with Store(tmp_path / 'store.sqlite') as store:
        obs = store.to_frame()
        assert store.keys() == set(map(tuple, plan[KEY_COLUMNS].itertuples(index=False)))
        rewrites = store.rewrites_frame()
    assert len(obs) == len(plan) and not obs.duplicated(KEY_COLUMNS).any()
    assert set(obs['model']) == {'smollm2', 'gemma3'}
    assert obs['score'].between(0, 1).all()
    assert (obs['prompt_tokens'] > 0).all() and (obs['completion_tokens'] <= MAX_TOKENS).all()
    assert (obs['latency_s'] > 0).all() and (obs['temperature'] == 0.7).all() and (obs['top_p'] == 0.95).all()
    price = {'smollm2': (0.02, 0.04), 'gemma3': (0.04, 0.08)}
    expected = [(p * price[m][0] + c * price[m][1]) / 1e6 for m, p, c in zip(obs['model'], obs['prompt_tokens'], obs['completion_tokens'])]
    assert obs['cost'].tolist() == pytest.approx(expected)
    assert obs['response'].map(type).eq(str).all()
    # unparseable answers are kept as score 0 / parsed False, never dropped
    assert (obs.loc[~obs['parsed'].astype(bool), 'score'] == 0).all()
    # the decode view asks the original question; every grid row asks a stored rewrite of its query
    tasks = load_tasks(conf)
    dec = obs[obs['view'] == 'decode'].merge(tasks[['dataset', 'query_id', 'question']], on=['dataset', 'query_id'])
    assert (dec['query_text'] == dec['question']).all()
    grid = obs[obs['view'] == 'grid'].merge(rewrites, on=['dataset', 'query_id', 'rewrite_id'], suffixes=('', '_rw'))
    assert len(grid) == (obs['view'] == 'grid').sum() and (grid['query_text'] == grid['text']).all()
    # 5 queries need rewrites: 3 train (2 each), 2 test (3 each); all slots are filled one way or another
    assert len(rewrites) == 3 * 2 + 2 * 3
    # the report: rewrite validity (expect flags from a 135M rewriter) and scoring validity are printed
    assert 'rewrite validity' in out and 'scoring validity' in out and 'similarity_backend' in out
    assert ', 2 retried, 0 failed' in out            # the injected 429 and 500 were retried
    assert [a for _, a in proxy.log[:3]] == ['429', '500', 'no_answer']
    assert (tmp_path / 'obs.parquet').exists()

    # run again: everything is stored, nothing is called
    assert collect_main(str(cfg)) == EXIT_OK
    again = capsys.readouterr().out
    assert again.startswith(f'0 observation(s) collected, {len(plan)} already stored, 0 missing')
    assert 'calls: 0 sent' in again


# ---------------------------------------------------------------------------------------------------------------
# kill -9 mid-run, then restart

RUNNER = 'import sys; from dars_nb.collect.command import collect_main; sys.exit(collect_main(sys.argv[1]))'


def _rows(db: Path) -> pd.DataFrame:
    with Store(db) as s: return s.to_frame()


def test_sigkill_and_resume(local_server, tmp_path):
    url = local_server.base_url
    # two pool names for the same SmolLM2 process: the fastest real model, so the test stays short
    cfg = tmp_path / 'kill.toml'
    cfg.write_text(pool_toml({'a': (url, 0.02, 0.04, 'smollm2', 1), 'b': (url, 0.05, 0.10, 'smollm2', 1)}, rewriter='a')
                   + collection_toml(attempts=1, tr=2, td=2) + MMLU.format(train=2, test=1))
    plan = plan_calls(load_config(cfg))
    keys = set(map(tuple, plan[KEY_COLUMNS].itertuples(index=False)))
    db = tmp_path / 'store.sqlite'
    env = {**os.environ, 'PYTHONUNBUFFERED': '1'}

    log = open(tmp_path / 'first_run.log', 'wb')
    proc = subprocess.Popen([sys.executable, '-c', RUNNER, str(cfg)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    n = 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                try:
                    with sqlite3.connect(f'file:{db}?mode=ro', uri=True, timeout=5) as c:
                        n = c.execute('SELECT COUNT(*) FROM observations').fetchone()[0]
                except sqlite3.OperationalError: n = 0
            if n >= 6: break
            time.sleep(0.05)
        assert proc.poll() is None, f"the collector ended before it could be killed: {(tmp_path / 'first_run.log').read_text()[-500:]}"
        assert n >= 6, 'the collector did not store 6 observations in time'
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None: os.kill(proc.pid, signal.SIGKILL)
        proc.wait(); log.close()
    assert proc.returncode == -signal.SIGKILL

    before = _rows(db)
    assert 6 <= len(before) < len(plan)
    assert not before.duplicated(KEY_COLUMNS).any()

    # restart: same command, to the end
    done = subprocess.run([sys.executable, '-c', RUNNER, str(cfg)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-1000:]
    assert done.stdout.startswith(f'{len(plan) - len(before)} observation(s) collected, {len(before)} already stored, 0 missing')
    after = _rows(db)
    # zero lost, zero duplicated, the complete key set
    assert len(after) == len(plan) and not after.duplicated(KEY_COLUMNS).any()
    assert set(map(tuple, after[KEY_COLUMNS].astype({c: str for c in KEY_COLUMNS[:5]}).itertuples(index=False))) == keys
    # every row written before the kill is unchanged
    cols = [c for c in before.columns]
    b = before[cols].astype(str).set_index(KEY_COLUMNS).sort_index()
    a = after[cols].astype(str).set_index(KEY_COLUMNS).loc[b.index]
    pd.testing.assert_frame_equal(a, b)
    # the rewriter was not asked again: every query already had its rewrites (asked before any observation)
    assert 'rewriter: 0 call(s)' in done.stdout


# ---------------------------------------------------------------------------------------------------------------
# bad input through the function `dars collect` calls: one line, exit code != 0, the store untouched

def _good_store(tmp_path) -> Path:
    "A store holding a few rows already, to check that a refused run leaves it byte for byte as it was."
    from dars_nb.observations import example_observations
    db = tmp_path / 'store.sqlite'
    with Store(db) as s: s.insert_many(example_observations().head(6).to_dict('records'))
    return db


def _tasks_file(path: Path, rows) -> Path:
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return path


GOOD_TASKS = [dict(query_id=f'q{i}', kind='math', question=f'What is {i} + {i}?', gold=str(2 * i)) for i in range(4)]


@pytest.mark.parametrize('case', ['unknown model', 'unknown rewriter', 'missing key variable', 'negative price',
                                  'bad data file', 'unreachable endpoint', 'unparseable config', 'zero call budget',
                                  'zero spend cap'])
def test_bad_input_is_one_line_and_leaves_the_store_alone(tmp_path, capsys, monkeypatch, case):
    from dars_nb.pool.server import free_port
    monkeypatch.delenv('DARS_TEST_MISSING_KEY', raising=False)
    db = _good_store(tmp_path)
    digest = files_digest(db)
    dead = f'http://127.0.0.1:{free_port()}/v1'
    tasks = _tasks_file(tmp_path / 'tasks.jsonl', GOOD_TASKS)
    models = {'m1': (dead, 0.1, 0.2, 'm1', 1), 'm2': (dead, 0.1, 0.2, 'm2', 1)}
    dataset = f'[[datasets]]\nname = "mine"\npath = "{tasks.name}"\ntrain = 2\ntest = 1\n'
    expect = {'unknown model': "unknown model 'm3'", 'unknown rewriter': "rewriter 'm9' is not a model",
              'missing key variable': 'environment variable DARS_TEST_MISSING_KEY (api_key_env) is not set',
              'negative price': "model 'm2': price_in must be a non-negative number",
              'bad data file': "tasks.jsonl line 3: missing field 'gold'",
              'unreachable endpoint': f"cannot reach model 'm1' at {dead}",
              'unparseable config': 'cannot parse collect.toml',
              'zero call budget': 'limits: call_budget must be a positive integer',
              'zero spend cap': 'limits: spend_cap_usd must be a positive number of dollars'}[case]
    text = pool_toml(models, rewriter='m1') + collection_toml() + dataset
    if case == 'unknown model': text = text.replace('[collection]\n', '[collection]\nmodels = ["m1", "m3"]\n')
    if case == 'unknown rewriter': text = text.replace('rewriter = "m1"', 'rewriter = "m9"')
    if case == 'missing key variable': text = text.replace('[models."m2"]\n', '[models."m2"]\napi_key_env = "DARS_TEST_MISSING_KEY"\n')
    if case == 'negative price': text = text.replace('[models."m2"]\nbase_url = "' + dead + '"\nprice_in = 0.1', '[models."m2"]\nbase_url = "' + dead + '"\nprice_in = -0.1')
    if case == 'bad data file': _tasks_file(tasks, GOOD_TASKS[:2] + [{k: v for k, v in GOOD_TASKS[2].items() if k != 'gold'}])
    if case == 'unparseable config': text = text.replace('[collection]', '[collection')
    if case == 'zero call budget': text = text.replace('[limits]\n', '[limits]\ncall_budget = 0\n')
    if case == 'zero spend cap': text = text.replace('[limits]\n', '[limits]\nspend_cap_usd = 0.0\n')
    cfg = tmp_path / 'collect.toml'
    cfg.write_text(text)

    code = collect_main(str(cfg))
    out, err = capsys.readouterr()
    assert code == EXIT_ERROR
    assert err.startswith('dars collect: error: ') and err.count('\n') == 1 and 'Traceback' not in err, err
    assert expect in err, err
    assert out == ''
    assert files_digest(db) == digest


def test_dry_run_needs_no_key_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv('DARS_TEST_MISSING_KEY', raising=False)
    tasks = _tasks_file(tmp_path / 'tasks.jsonl', GOOD_TASKS)
    text = (pool_toml({'m1': ('http://127.0.0.1:9/v1', 1.0, 2.0, 'm1', 1)}, rewriter='m1')
            .replace('[models."m1"]\n', '[models."m1"]\napi_key_env = "DARS_TEST_MISSING_KEY"\n')
            + collection_toml(store='sub/store.sqlite') + f'[[datasets]]\npath = "{tasks.name}"\ntrain = 2\ntest = 1\n')
    (tmp_path / 'c.toml').write_text(text)
    assert collect_main(str(tmp_path / 'c.toml'), dry_run=True) == EXIT_OK
    out = capsys.readouterr().out
    # 2 train x 2 x 2 + 1 test x (3 + 3) = 14 observations; rewriter, 2 rounds: 2 x (1 + 2) + (1 + 3) = 10 calls at most
    assert 'total: at most 24 calls to make' in out
    assert not (tmp_path / 'sub').exists()


def test_data_folder_on_the_command_line_overrides_the_config(tmp_path, capsys):
    cfg = tmp_path / 'c.toml'
    cfg.write_text(pool_toml({'m1': ('http://127.0.0.1:9/v1', 1.0, 2.0, 'm1', 1)}, rewriter='m1')
                   + collection_toml().replace(f'data_dir = "{DATA}"', 'data_dir = "no/such/folder"') + MMLU.format(train=1, test=1))
    assert collect_main(str(cfg), dry_run=True) == EXIT_ERROR
    assert 'no/such/folder' in capsys.readouterr().err
    assert collect_main(str(cfg), dry_run=True, data=str(DATA)) == EXIT_OK
    assert 'observations planned' in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# a config that is bound to fail is refused by the `dars` command itself, --dry-run or not, before any call

from dars_command import DARS_SCRIPT as DARS


@pytest.mark.parametrize('case', ['output type', 'path not a string', 'gpqa path not a string', 'absurd grid'])
def test_dars_collect_refuses_a_config_bound_to_fail_before_any_call(tmp_path, case):
    from dars_nb.pool.server import free_port
    _tasks_file(tmp_path / 'tasks.jsonl', GOOD_TASKS)
    dead = f'http://127.0.0.1:{free_port()}/v1'            # a real run would name it if it got as far as a call
    dataset = '[[datasets]]\npath = "tasks.jsonl"\ntrain = 2\ntest = 1\n'
    collection = collection_toml()
    if case == 'output type': collection = collection_toml(output='x.txt')
    if case == 'path not a string': dataset = dataset.replace('path = "tasks.jsonl"', 'name = "mine"\npath = 5')
    if case == 'gpqa path not a string': dataset = '[[datasets]]\nsource = "gpqa"\noptions = { path = 5 }\ntrain = 2\n'
    if case == 'absurd grid': collection = collection_toml(n=1000000, m=1000000)
    expect = {'output type': "[collection] output: unknown observation file type '.txt' (use .parquet, .jsonl or .csv)",
              'path not a string': '[[datasets]] #1: path must be a path string (a JSONL task file), got 5',
              'gpqa path not a string': '[[datasets]] #1 (gpqa): options.path must be a path string (your own GPQA copy), got 5',
              'absurd grid': 'the config plans 4,000,000,000,012 observations, more than one run takes (10,000,000)'}[case]
    (tmp_path / 'c.toml').write_text(pool_toml({'m1': (dead, 0.1, 0.2, 'm1', 1), 'm2': (dead, 0.1, 0.2, 'm2', 1)},
                                               rewriter='m1') + collection + dataset)
    for dry in (['--dry-run'], []):
        res = subprocess.run([DARS, 'collect', 'c.toml', *dry], capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert res.returncode == 1, (dry, res.returncode, res.stderr)
        assert 'Traceback' not in res.stderr and res.stderr.count('\n') == 1, res.stderr
        assert res.stderr.startswith('dars collect: error: ') and expect in res.stderr, res.stderr
        assert res.stdout == '' and not (tmp_path / 'store.sqlite').exists()


@pytest.mark.parametrize('example', ['hosted_pool.toml', 'local_pool.toml'])
def test_each_collection_example_dry_runs_as_its_header_says(example, tmp_path):
    "`dars collect examples/X.toml --dry-run`, run from a copy of the repository's examples/ and data/, plans and prices."
    import shutil
    root = Path(__file__).parent.parent
    for folder in ('examples', 'data'): shutil.copytree(root / folder, tmp_path / folder)
    command = f'dars collect examples/{example} --dry-run'
    header = (root / 'examples' / example).read_text()
    assert command in header   # the command the file tells its reader to run
    env = {k: v for k, v in os.environ.items() if k != 'DARS_DATA'}
    run = subprocess.run([sys.executable, '-m', 'dars_nb', *command.split()[1:]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-500:]
    assert 'total: at most' in run.stdout and not (tmp_path / 'runs').exists()   # a dry run writes nothing
