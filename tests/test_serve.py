"""The routing endpoint over real HTTP: fixed-answer and fault-injecting upstreams, and one real local model.

Each test starts `dars_nb.serve` under uvicorn on a free loopback port (`BackgroundServer`) in front of
`FixedEndpoint`s (an answer after a fixed delay) and `FaultProxy`s (faults injected on the way), and talks
to it with plain HTTP or with the `openai` client, as a user would.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx2
import openai
import pytest

from dars_nb.bundle import RouterBundle, load_bundle, save_bundle
from dars_nb.pool.config import ConfigError
from dars_nb.pool.models import Limits, ModelSpec, Pool
from dars_nb.pool.server import BackgroundServer, free_port
from dars_nb.testing import FaultProxy, FixedEndpoint
from dars_nb.serve import serve_main
from dars_nb.serve.app import create_app
from dars_nb.serve.requests import ServeSettings, load_serve_config

KEY = 'client-key-0123456789abcdef'
OTHER_KEY = 'client-key-fedcba9876543210'
ASK = {'model': 'dars-router', 'messages': [{'role': 'system', 'content': 'Be brief.'},
                                            {'role': 'user', 'content': 'What is 2 + 2?'}]}


class RecordingEndpoint(FixedEndpoint):
    "A FixedEndpoint that keeps every chat request's headers and JSON body."
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    async def handle(self, request):
        if request.method == 'POST': self.seen.append((dict(request.headers), json.loads(await request.body())))
        return await super().handle(request)


def ranked(*order):
    "A router that ranks the pool in a fixed order for every text."
    return lambda texts, lam=None: [list(order)] * len(texts)


def by_lambda(texts, lam=None):
    "'big' first, unless cost weighs (λ >= 0.5): then 'small' first."
    return [['small', 'big'] if (lam or 0) >= 0.5 else ['big', 'small']] * len(texts)


def pool_of(timeout_s=120.0, **urls):
    "A pool of models at the given base URLs; `small` and `big` have prices 0.1/0.2 and 1/2 $ per M tokens."
    prices = {'small': (0.1, 0.2), 'big': (1.0, 2.0)}
    return Pool({m: ModelSpec(m, u, price_in=prices.get(m, (0.5, 0.5))[0], price_out=prices.get(m, (0.5, 0.5))[1],
                              concurrency=8) for m, u in urls.items()}, limits=Limits(timeout_s=timeout_s))


@contextmanager
def serving(rank, pool, lam=None, lam_setting=None, **settings):
    "The endpoint on a free loopback port, with an HTTP client on its root URL (`lam`: the router's, `lam_setting`: [serve] lam)."
    app = create_app(rank, pool, ServeSettings(port=0, lam=lam_setting, **settings), lam=lam)
    with BackgroundServer(app) as srv, httpx2.Client(base_url=srv.base_url.removesuffix('/v1'), timeout=30) as http:
        yield srv, http


def auth(key=KEY): return {'authorization': f'Bearer {key}'}


def assert_openai_error(resp, status, param=None):
    "The response is `status` with a JSON body in OpenAI's error shape (never a traceback)."
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers['content-type'].startswith('application/json')
    err = resp.json()['error']
    assert set(err) == {'message', 'type', 'param', 'code'} and err['message'] and 'Traceback' not in resp.text
    if param is not None: assert err['param'] == param, err
    return err


@pytest.fixture
def fixed():
    with RecordingEndpoint('four', delay_s=0) as ep: yield ep


@pytest.fixture
def fixed2():
    with RecordingEndpoint('four, from big', delay_s=0) as ep: yield ep


def test_missing_wrong_and_right_client_key(fixed):
    with serving(ranked('small'), pool_of(small=fixed.base_url), client_keys=(KEY, OTHER_KEY)) as (_, http):
        missing = http.post('/v1/chat/completions', json=ASK)
        wrong = http.post('/v1/chat/completions', json=ASK, headers=auth('client-key-0123456789abcdeX'))
        prefix = http.post('/v1/chat/completions', json=ASK, headers=auth(KEY[:-1]))
        not_bearer = http.post('/v1/chat/completions', json=ASK, headers={'authorization': f'Basic {KEY}'})
        for r in (missing, wrong, prefix, not_bearer):
            assert assert_openai_error(r, 401)['type'] == 'authentication_error'
            assert r.headers['www-authenticate'] == 'Bearer'
        assert fixed.requests == 0                        # nothing refused reached the upstream
        assert http.get('/metrics').status_code == 401    # the metrics need a key too
        assert http.get('/v1/models').status_code == 401
        for key in (KEY, OTHER_KEY):
            ok = http.post('/v1/chat/completions', json=ASK, headers=auth(key))
            assert ok.status_code == 200 and ok.json()['choices'][0]['message']['content'] == 'four'
        assert fixed.requests == 2
        assert http.get('/metrics', headers=auth()).json()['refused'] == {'401': 6}


def test_oversized_body_is_413_and_not_forwarded(fixed):
    with serving(ranked('small'), pool_of(small=fixed.base_url), max_body_bytes=2000) as (_, http):
        big = {**ASK, 'messages': [{'role': 'user', 'content': 'x' * 5000}]}
        assert_openai_error(http.post('/v1/chat/completions', json=big), 413)
        chunked = http.post('/v1/chat/completions', content=iter([json.dumps(big).encode()[i:i + 500] for i in range(0, 5100, 500)]),
                            headers={'content-type': 'application/json'})
        assert 'content-length' not in chunked.request.headers   # sent chunked: the cap holds without a declared length
        assert_openai_error(chunked, 413)
        assert http.post('/v1/chat/completions', json=ASK).status_code == 200   # a small one still goes through
    assert fixed.requests == 1


@pytest.mark.parametrize('field, value', [('base_url', 'http://127.0.0.1:1/v1'), ('api_base', 'http://evil/v1'),
                                          ('api_key', 'sk-stolen'), ('extra_headers', {'authorization': 'Bearer x'})])
def test_a_request_that_chooses_its_upstream_is_refused(fixed, field, value):
    with FaultProxy(fixed.base_url) as proxy, serving(ranked('small'), pool_of(small=proxy.base_url)) as (_, http):
        err = assert_openai_error(http.post('/v1/chat/completions', json={**ASK, field: value}), 400, param=field)
        assert repr(field) in err['message']
    assert proxy.log == [] and fixed.requests == 0    # the upstream saw no request at all


def test_bad_json_and_other_malformed_requests_get_json_errors(fixed):
    with serving(ranked('small'), pool_of(small=fixed.base_url)) as (_, http):
        post = lambda body: http.post('/v1/chat/completions', content=body, headers={'content-type': 'application/json'})
        assert 'not valid JSON' in assert_openai_error(post(b'{"messages": ['), 400)['message']
        assert_openai_error(post(b'[]'), 400)
        assert_openai_error(post(json.dumps({'model': 'dars-router'}).encode()), 400, param='messages')
        assert_openai_error(post(json.dumps({**ASK, 'model': 'gpt-9'}).encode()), 404, param='model')
        assert_openai_error(post(json.dumps({**ASK, 'max_tokens': -3}).encode()), 400, param='max_tokens')
        assert_openai_error(http.get('/v1/nowhere'), 404)
        assert_openai_error(http.get('/v1/chat/completions'), 405)
    assert fixed.requests == 0


@pytest.mark.parametrize('fault', ['down', '500', '503', 'drop', 'slow', 'malformed'])
def test_a_failing_upstream_falls_back_to_the_next_model(fixed, fixed2, fault):
    with FaultProxy(fixed2.base_url, plan=[fault] if fault != 'down' else [], slow_s=5) as proxy:
        first = f'http://127.0.0.1:{free_port()}/v1' if fault == 'down' else proxy.base_url
        with serving(ranked('big', 'small'), pool_of(big=first, small=fixed.base_url, timeout_s=1.0)) as (_, http):
            r = http.post('/v1/chat/completions', json=ASK)
            assert r.status_code == 200, r.text
            assert (r.headers['x-dars-model'], r.json()['model']) == ('small', 'small')
            assert r.headers['x-dars-fallback-from'] == 'big'
            assert r.json()['choices'][0]['message']['content'] == 'four'
            m = http.get('/metrics').json()
    assert (m['models']['big']['failures'], m['models']['small']['answered'], m['fallbacks']) == (1, 1, 1)


def test_every_upstream_down_is_a_502_naming_each_failure():
    dead = {m: f'http://127.0.0.1:{free_port()}/v1' for m in ('big', 'small')}
    with serving(ranked('big', 'small'), pool_of(**dead, timeout_s=1.0)) as (_, http):
        err = assert_openai_error(http.post('/v1/chat/completions', json=ASK), 502)
    assert "model 'big'" in err['message'] and "model 'small'" in err['message']


def test_a_request_error_from_the_upstream_is_not_retried_elsewhere(fixed):
    with FaultProxy(fixed.base_url, plan=['400']) as proxy, \
         serving(ranked('big', 'small'), pool_of(big=proxy.base_url, small=fixed.base_url)) as (_, http):
        assert_openai_error(http.post('/v1/chat/completions', json=ASK), 400)
    assert fixed.requests == 0   # only the proxy's injected 400; `small` was not asked


def test_streaming_relays_events_and_names_the_model(fixed, fixed2):
    with serving(ranked('big', 'small'), pool_of(big=f'http://127.0.0.1:{free_port()}/v1', small=fixed.base_url)) as (srv, http):
        client = openai.OpenAI(base_url=srv.base_url, api_key='unused', max_retries=0)
        chunks = list(client.chat.completions.create(model='dars-router', messages=ASK['messages'], stream=True))
        text = ''.join(c.choices[0].delta.content or '' for c in chunks if c.choices)
        assert text == 'four' and {c.model for c in chunks} == {'small'}
        assert all(c.usage is None for c in chunks)    # the client did not ask for usage: the endpoint's own is kept back
        with_usage = list(client.chat.completions.create(model='dars-router', messages=ASK['messages'], stream=True,
                                                         stream_options={'include_usage': True}))
        assert with_usage[-1].usage.completion_tokens == 5
        with http.stream('POST', '/v1/chat/completions', json={**ASK, 'stream': True}) as r:
            assert r.headers['content-type'].startswith('text/event-stream') and r.headers['x-dars-model'] == 'small'
            assert r.headers['x-dars-fallback-from'] == 'big'
            lines = [l for l in r.iter_lines() if l.startswith('data:')]
        assert lines[-1] == 'data: [DONE]'
        m = http.get('/metrics').json()['models']['small']
    # upstream usage (10 + 5 tokens) counted for all three streams, none estimated
    assert (m['answered'], m['prompt_tokens'], m['completion_tokens'], m['usage_estimated']) == (3, 30, 15, 0)
    assert fixed.seen[0][1]['stream_options'] == {'include_usage': True}


def test_lambda_per_request_changes_the_routing(fixed, fixed2):
    with serving(by_lambda, pool_of(small=fixed.base_url, big=fixed2.base_url)) as (_, http):
        default = http.post('/v1/chat/completions', json=ASK)
        cheap = http.post('/v1/chat/completions', json={**ASK, 'metadata': {'dars_lambda': 0.9}})
        cheap_header = http.post('/v1/chat/completions', json=ASK, headers={'x-dars-lambda': '0.9'})
        costly = http.post('/v1/chat/completions', json={**ASK, 'metadata': {'dars_lambda': 0.1}})
        assert_openai_error(http.post('/v1/chat/completions', json={**ASK, 'metadata': {'dars_lambda': 'cheap'}}), 400, param='metadata')
        assert_openai_error(http.post('/v1/chat/completions', json={**ASK, 'metadata': {'dars_lambda': -0.5}}), 400, param='metadata')
        assert_openai_error(http.post('/v1/chat/completions', json={**ASK, 'dars_lambda': 0.5}), 400, param='dars_lambda')   # no spelling: refused
    assert [r.headers['x-dars-model'] for r in (default, cheap, cheap_header, costly)] == ['big', 'small', 'small', 'big']
    assert (cheap.headers['x-dars-lambda'], cheap_header.headers['x-dars-lambda']) == ('0.9', '0.9')
    assert all('dars_lambda' not in json.dumps(body) for _, body in fixed.seen + fixed2.seen)   # λ is the endpoint's, not the upstream's


@pytest.mark.parametrize('settings_lam, router_lam', [(0.3, 0.05), (None, 0.05), (0.0, 0.05), (None, None)])
def test_a_request_is_ranked_at_the_lambda_its_header_reports(fixed, settings_lam, router_lam):
    "One λ per request: its own, else the endpoint's ([serve] lam), else the router's; ranked at it and reported."
    asked_at = []
    def recording(texts, lam=None):
        asked_at.extend([lam] * len(texts)); return [['small']] * len(texts)
    with serving(recording, pool_of(small=fixed.base_url), lam=router_lam, lam_setting=settings_lam) as (_, http):
        health = http.get('/health').json()
        sent = [http.post('/v1/chat/completions', json=ASK),
                http.post('/v1/chat/completions', json={**ASK, 'metadata': {'dars_lambda': 0.7}}),
                http.post('/v1/chat/completions', json=ASK, headers={'x-dars-lambda': '0.0'}),
                http.post('/v1/chat/completions', json={**ASK, 'model': 'dars-router-0.2'})]
    default = settings_lam if settings_lam is not None else router_lam
    assert asked_at == [default, 0.7, 0.0, 0.2]
    assert [r.headers.get('x-dars-lambda') for r in sent] == [None if default is None else f'{default:g}', '0.7', '0', '0.2']
    assert health['lam'] == default


def test_metrics_count_requests_and_spend(fixed, fixed2):
    with serving(by_lambda, pool_of(small=fixed.base_url, big=fixed2.base_url)) as (_, http):
        for lam in (0.9, 0.9, 0.0):
            assert http.post('/v1/chat/completions', json={**ASK, 'metadata': {'dars_lambda': lam}}).status_code == 200
        http.post('/v1/chat/completions', content=b'nope', headers={'content-type': 'application/json'})
        m = http.get('/metrics').json()
    # FixedEndpoint reports 10 prompt + 5 completion tokens; prices are $ per million tokens
    small, big = (10 * 0.1 + 5 * 0.2) / 1e6, (10 * 1.0 + 5 * 2.0) / 1e6
    assert (m['requests'], m['refused'], m['fallbacks']) == (4, {'400': 1}, 0)
    assert (m['models']['small']['answered'], m['models']['big']['answered']) == (2, 1)
    assert m['models']['small']['spend_usd'] == pytest.approx(2 * small, rel=1e-12)
    assert m['spend_today_usd'] == pytest.approx(2 * small + big, rel=1e-12)
    assert m['in_flight_reserved_usd'] == 0


def test_daily_spend_limit_refuses_with_429(fixed):
    # one request may cost at most (one token per byte of its ~130-byte JSON + 100 completion tokens) at 0.1/0.2 $/M,
    # about 3.3e-5 $, and costs 2e-6 $ (10 + 5 tokens reported): some fit under 5e-5 $, then none
    with serving(ranked('small'), pool_of(small=fixed.base_url), daily_spend_usd=5e-5, max_tokens=100) as (_, http):
        codes = [http.post('/v1/chat/completions', json=ASK).status_code for _ in range(15)]
        last = http.post('/v1/chat/completions', json=ASK)
        spent = http.get('/metrics').json()['spend_today_usd']
    assert codes[0] == 200 and 429 in codes and codes.index(429) == codes.count(200)   # refused from some point on
    assert assert_openai_error(last, 429)['type'] == 'insufficient_quota'
    assert 0 < int(last.headers['retry-after']) <= 86400
    assert spent <= 5e-5


def test_max_tokens_is_capped_and_only_allowed_fields_go_upstream(fixed):
    pool = Pool({'small': ModelSpec('small', fixed.base_url, remote_name='org/small-v2')})
    with serving(ranked('small'), pool, max_tokens=64) as (_, http):
        big = http.post('/v1/chat/completions', json={**ASK, 'max_tokens': 5000, 'temperature': 0.2}, headers=auth())
        none = http.post('/v1/chat/completions', json=ASK)
    assert big.headers['x-dars-max-tokens'] == '64' and none.headers['x-dars-max-tokens'] == '64'
    (h1, b1), (_, b2) = fixed.seen
    assert (b1['model'], b1['max_tokens'], b1['temperature'], b2['max_tokens']) == ('org/small-v2', 64, 0.2, 64)
    assert 'authorization' not in h1


def test_the_client_key_never_reaches_the_upstream(fixed, monkeypatch):
    monkeypatch.setenv('DARS_TEST_UPSTREAM_KEY', 'upstream-secret')
    with FaultProxy(fixed.base_url) as open_proxy, FaultProxy(fixed.base_url) as keyed_proxy:
        pool = Pool({'small': ModelSpec('small', open_proxy.base_url),
                     'big': ModelSpec('big', keyed_proxy.base_url, api_key_env='DARS_TEST_UPSTREAM_KEY')})
        with serving(by_lambda, pool, client_keys=(KEY,)) as (srv, http):
            client = openai.OpenAI(base_url=srv.base_url, api_key=KEY, max_retries=0)
            for lam in (0.9, 0.0):
                client.chat.completions.create(model='dars-router', messages=ASK['messages'], metadata={'dars_lambda': str(lam)})
            list(client.chat.completions.create(model='dars-router', messages=ASK['messages'], stream=True))
    assert open_proxy.auth == [None]                                   # a model without a key variable gets no key
    assert keyed_proxy.auth == ['Bearer upstream-secret'] * 2          # a keyed model gets the pool's key, only that
    assert all(KEY not in json.dumps(h) for h, _ in fixed.seen)


def test_listening_beyond_loopback_needs_client_keys(tmp_path, fixed):
    with pytest.raises(ConfigError, match='refusing to listen on 0.0.0.0 without client keys'):
        ServeSettings(host='0.0.0.0')
    cfg = tmp_path / 'pool.toml'
    cfg.write_text(f'[models.small]\nbase_url = "{fixed.base_url}"\n')
    with pytest.raises(ConfigError, match='refusing to listen on 0.0.0.0'):
        serve_main(tmp_path / 'no-router.dars', cfg, host='0.0.0.0', quiet=True)   # refused before anything loads
    cfg.write_text(f'[models.small]\nbase_url = "{fixed.base_url}"\n[serve]\nclient_keys_env = "DARS_TEST_NO_SUCH_VAR"\n')
    with pytest.raises(ConfigError, match='DARS_TEST_NO_SUCH_VAR, which is not set'):
        load_serve_config(cfg, host='0.0.0.0', env={})
    _, settings = load_serve_config(cfg, host='0.0.0.0', env={'DARS_TEST_NO_SUCH_VAR': KEY})
    assert settings.client_keys == (KEY,)


def test_models_lists_the_router_and_the_pool(fixed):
    with serving(ranked('small'), pool_of(small=fixed.base_url, big=fixed.base_url)) as (srv, _):
        ids = [m.id for m in openai.OpenAI(base_url=srv.base_url, api_key='unused').models.list()]
    assert ids == ['dars-router', 'small', 'big']


def test_a_chat_request_reaches_a_real_local_model(local_server):
    pool = local_server.pool()
    with serving(ranked('smollm2', 'gemma3'), pool) as (srv, http):
        client = openai.OpenAI(base_url=srv.base_url, api_key='unused', max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model='dars-router', max_tokens=24, temperature=0,
            messages=[{'role': 'user', 'content': 'What is the capital of France? Answer in one word.'}])
        m = http.get('/metrics').json()['models']['smollm2']
    answer = raw.parse()
    assert raw.headers['x-dars-model'] == 'smollm2' and answer.model == 'smollm2'
    assert answer.choices[0].message.content.strip()
    assert 0 < answer.usage.completion_tokens <= 24
    assert (m['answered'], m['usage_estimated'], m['completion_tokens']) == (1, 0, answer.usage.completion_tokens)
    assert m['spend_usd'] == pytest.approx(pool.models['smollm2'].cost(answer.usage.prompt_tokens, answer.usage.completion_tokens))


TEXTS = [f'question {i} about {w}' for i, w in enumerate(['algebra', 'history', 'chemistry', 'poetry'] * 10)]


@pytest.fixture(scope='module')
def bundle_file(tmp_path_factory):
    "A saved TF-IDF + kNN router bundle, trained on simulated DARS supervision for `TEXTS`."
    from dars_nb.features import TfidfFeaturizer
    from dars_nb.routers import ROUTERS
    from dars_nb.simulate import simulate
    from dars_nb.stats import supervision
    obs, _, _ = simulate('gpqa_like', n_train=len(TEXTS), n_test=5, seed=1)
    sup = supervision(obs, 'dars')
    tf = TfidfFeaturizer().fit(TEXTS)
    router = ROUTERS['kNN'](n_neighbors=5).fit(tf.transform(TEXTS), sup)
    b = RouterBundle(models=list(sup.models), lam=0.05, beta=0.2, mode='dars', featurizer=tf, router=router)
    return save_bundle(b, tmp_path_factory.mktemp('bundle') / 'router.zip')


def test_a_saved_bundle_routes_each_request_as_it_routes_the_text(bundle_file, fixed):
    b = load_bundle(bundle_file)
    lams = (0.0, 0.5, 10.0)
    # the requests must include questions whose choice moves with λ, or the check below could not tell λ was used
    moving = [t for t in TEXTS if len({b.route([t], lam)[0] for lam in lams}) > 1]
    assert moving, 'no question of this bundle changes model with λ'
    asked = list(dict.fromkeys(moving[:3] + TEXTS[:5]))
    pool = Pool({m: ModelSpec(m, fixed.base_url, price_in=1.0, price_out=2.0) for m in b.models})
    got, want = [], []
    with serving(b.rank, pool, lam=b.lam) as (_, http):
        default = http.post('/v1/chat/completions', json={'messages': [{'role': 'user', 'content': moving[0]}]})
        for lam in lams:
            for t in asked:
                r = http.post('/v1/chat/completions', json={'model': 'dars-router', 'metadata': {'dars_lambda': lam},
                                                             'messages': [{'role': 'user', 'content': t}]})
                got.append((r.headers['x-dars-model'], r.json()['model'])); want.append((b.route([t], lam)[0],) * 2)
    assert got == want
    assert (default.headers['x-dars-model'], default.headers['x-dars-lambda']) == (b.route([moving[0]])[0], '0.05')
    assert [body['model'] for _, body in fixed.seen[1:]] == [m for m, _ in want]   # each went to the model it names


def test_serve_main_serves_a_saved_bundle_until_interrupted(bundle_file, fixed, tmp_path):
    b = load_bundle(bundle_file)
    cfg = tmp_path / 'pool.toml'
    cfg.write_text(''.join(f'[models."{m}"]\nbase_url = "{fixed.base_url}"\n' for m in b.models)
                   + '[serve]\nclient_keys_env = "DARS_TEST_SERVE_KEYS"\nmax_tokens = 32\nmax_header_bytes = 4096\n')
    port = free_port()
    code = f'import sys; from dars_nb.serve import serve_main; sys.exit(serve_main({str(bundle_file)!r}, {str(cfg)!r}, port={port}))'
    proc = subprocess.Popen([sys.executable, '-c', code], env={**os.environ, 'DARS_TEST_SERVE_KEYS': KEY},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = f'http://127.0.0.1:{port}', time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1][-500:]
            try:
                if httpx2.get(url + '/v1/models', headers=auth(), timeout=2).status_code == 200: break
            except httpx2.HTTPError: pass
            assert time.monotonic() < deadline, 'dars serve did not answer within 120 s'
            time.sleep(0.2)
        assert httpx2.post(url + '/v1/chat/completions', json=ASK, timeout=30).status_code == 401
        r = httpx2.post(url + '/v1/chat/completions', json=ASK, headers=auth(), timeout=30)
        assert r.status_code == 200 and r.headers['x-dars-model'] == b.route(['What is 2 + 2?'])[0]
        assert r.headers['x-dars-max-tokens'] == '32'
        padded = httpx2.post(url + '/v1/chat/completions', json=ASK, headers={**auth(), 'x-padding': 'a' * 5000}, timeout=30)
        assert padded.status_code == 431 and 'larger than 4096 bytes' in padded.json()['error']['message']
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-500:]
    assert f'at http://127.0.0.1:{port}/v1' in out and '1 client key(s)' in out
    assert KEY not in out + err


def _descendants(pid: int) -> set:
    "Every process below `pid`, from /proc."
    parents = {}
    for d in os.listdir('/proc'):
        if not d.isdigit(): continue
        try: stat = open(f'/proc/{d}/stat').read()
        except OSError: continue
        parents.setdefault(int(stat.rsplit(')', 1)[1].split()[1]), []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.add(child); todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try: return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError: return False


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_dars_local_stops_its_models_and_removes_its_folder(sig):
    import importlib.util
    from dars_nb.pool.local import LocalModelError, model_path
    try:
        model_path('smollm2')
        if importlib.util.find_spec('llama_cpp') is None: raise LocalModelError('llama-cpp-python is not installed')
    except LocalModelError as e:
        if os.environ.get('CI'): pytest.fail(f'no local LLM under CI: {e}')
        pytest.skip(f'no local LLM: {e}')
    port = free_port()
    proc = subprocess.Popen([sys.executable, '-m', 'dars_nb', 'local', '--port', str(port), '--models', 'smollm2'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()                 # printed once every model answers
        assert 'serving smollm2' in banner, banner + proc.stderr.read()[-500:]
        workdir = banner.split('logs in ')[1].split(';')[0]
        children = _descendants(proc.pid)
        assert children and os.path.isdir(workdir)
        assert httpx2.get(f'http://127.0.0.1:{port}/v1/models', timeout=10).status_code == 200
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None: proc.kill(); proc.wait()
    assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 0), proc.stderr.read()[-500:]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in children) and time.monotonic() < deadline: time.sleep(0.1)
    assert not [p for p in children if _alive(p)], 'a model process survived'
    if sig == signal.SIGKILL: shutil.rmtree(workdir, ignore_errors=True)   # nothing is left to remove it
    else: assert not os.path.exists(workdir)


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_dars_serve_shuts_down_gracefully_on_sigterm_and_sighup(bundle_file, fixed, tmp_path, sig):
    b = load_bundle(bundle_file)
    cfg = tmp_path / 'pool.toml'
    cfg.write_text(''.join(f'[models."{m}"]\nbase_url = "{fixed.base_url}"\n' for m in b.models))
    port = free_port()
    code = f'import sys; from dars_nb.serve import serve_main; sys.exit(serve_main({str(bundle_file)!r}, {str(cfg)!r}, port={port}))'
    proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1][-500:]
            try:
                if httpx2.get(f'http://127.0.0.1:{port}/v1/models', timeout=2).status_code == 200: break
            except httpx2.HTTPError: pass
            assert time.monotonic() < deadline, 'dars serve did not answer within 120 s'
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None: proc.kill(); proc.wait()
    assert proc.returncode == 0, err[-500:]
    assert 'Shutting down' in err or 'Finished server process' in err, err[-500:]


def test_an_upstream_that_echoes_the_operators_key_does_not_leak_it(monkeypatch):
    from dars_nb.testing import KeyEchoEndpoint
    secret = 'sk-operator-0123456789-secret'
    monkeypatch.setenv('DARS_TEST_UPSTREAM_KEY', secret)
    with KeyEchoEndpoint() as echo:
        pool = Pool({'small': ModelSpec('small', echo.base_url, api_key_env='DARS_TEST_UPSTREAM_KEY')})
        with serving(ranked('small'), pool) as (_, http):
            r = http.post('/v1/chat/completions', json=ASK)
            metrics = http.get('/metrics').text
    assert r.status_code == 502 and 'HTTP 401' in r.text, r.text
    assert secret not in r.text + metrics and '***' in r.text
