"""Fuzzing the routing endpoint's request parser with Hypothesis: any body gives a checked request or a 4xx, never
another exception, and the same holds over HTTP, where nothing a client sends gets a 500 or a traceback.

Bodies nest to every depth up to 3,000 levels, around the two limits of orjson (it writes 254 levels, reads 1,024): a
body it reads but cannot write back is a 400 too.

The examples are bounded in number and size (seeded, no deadline: the bound is the count, not a clock): 200 bodies
for the parser, 200 nested ones and 60 over HTTP in `make test` (21 s on a 2-core machine at load average 12), 1,000,
1,000 and 300 with DARS_TEST_FLAGS=slow.
"""
import itertools
import json

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dars_nb.pool.models import ModelSpec, Pool
from dars_nb.pool.server import BackgroundServer
from dars_nb.serve.app import create_app
from dars_nb.serve.requests import MAX_DEPTH, ChatRequest, RequestError, ServeSettings, parse_chat_request
from dars_nb.serve.upstreams import Upstreams
from dars_nb.testing import FixedEndpoint, forced_test_flags

SLOW = 'slow' in forced_test_flags()
MODELS = ['small', 'big']
SETTINGS = ServeSettings(max_tokens=64, daily_spend_usd=1.0)
FIELDS = ['model', 'messages', 'max_tokens', 'max_completion_tokens', 'n', 'stream', 'stream_options', 'dars_lambda',
          'metadata', 'temperature', 'tools', 'base_url', 'api_key', 'user']

# every character, lone surrogates included (JSON can carry them as \ud800 escapes)
chars = st.characters(codec=None, categories=None)
scalars = st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats() | st.text(chars, max_size=20)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(chars, max_size=8), inner,
                                                                                           max_size=4), max_leaves=12)
parts = st.fixed_dictionaries({'type': st.sampled_from(['text', 'image_url', 'file', 'input_audio', 'x'])},
                              optional={'text': st.text(chars, max_size=20) | values, 'image_url': values, 'file': values})
contents = st.text(chars, max_size=40) | st.lists(parts, max_size=3) | values
roles = st.sampled_from(['user', 'system', 'assistant']) | values
messages = st.lists(st.fixed_dictionaries({}, optional={'role': roles, 'content': contents}) | values, max_size=4)
# bodies close to a valid request, so that every check past the first is reached too
near = st.fixed_dictionaries(
    {'messages': st.lists(st.fixed_dictionaries({'role': roles, 'content': contents}), max_size=3).map(
        lambda ms: ms + [{'role': 'user', 'content': 'What is 2 + 2?'}])},
    optional={'model': st.sampled_from(MODELS + ['dars-router', 'gpt-x']) | values,
              'max_tokens': st.integers(-3, 10**6) | values, 'max_completion_tokens': st.integers(-3, 200) | values,
              'n': st.integers(-1, 10) | values, 'stream': st.booleans() | values, 'stream_options': values,
              'dars_lambda': st.floats() | values,
              'metadata': st.fixed_dictionaries({}, optional={'dars_lambda': st.floats() | values}) | values,
              'temperature': st.floats(0, 2) | values, 'tools': values,
              'extra': values})
bodies = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), values, max_size=6).flatmap(
    lambda d: st.fixed_dictionaries({**{k: st.just(v) for k, v in d.items()}, 'messages': messages}))


def dumps(body) -> bytes:
    "JSON as a client might send it: NaN and Infinity allowed, lone surrogates escaped."
    return json.dumps(body).encode()


# nesting anywhere in a body, around the depths where parsers and encoders stop (orjson: writes 254, reads 1,024)
NESTS = [b'{"messages": @}', b'{"messages": [{"role": "user", "content": "hi"}], "tools": @}',
         b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": @}]}]}',
         b'{"messages": [{"role": "user", "content": "hi"}, @]}', b'{"model": @, "messages": [{"role": "user", "content": "hi"}]}']
depths = st.integers(1, 1100) | st.sampled_from([253, 254, 255, 256, 1022, 1023, 1024, 1025, 3000])
nested = st.builds(lambda where, n, kind: where.replace(b'@', (b'[' * n + b']' * n) if kind else (b'{"a":' * n + b'1' + b'}' * n)),
                   st.sampled_from(NESTS), depths, st.booleans())
raws = near.map(dumps) | st.binary(max_size=300) | bodies.map(dumps) | values.map(dumps) | \
    st.builds(lambda d, cut: dumps(d)[:cut], near, st.integers(0, 200)) | nested


def check(raw: bytes, header):
    "A `ChatRequest` whose body is ready to send, or a 4xx `RequestError`; anything else escapes."
    try: req = parse_chat_request(raw, SETTINGS, MODELS, header)
    except RequestError as e:
        assert 400 <= e.status < 500 and str(e), (e.status, str(e))
        return None
    assert isinstance(req, ChatRequest) and isinstance(req.text, str)
    assert json.loads(req.data) == json.loads(json.dumps(req.body))   # what is sent is the checked body
    assert req.prompt_tokens >= len(req.data) - 1 or b'image' in req.data
    assert 1 <= req.max_tokens <= SETTINGS.max_tokens and req.model in (None, *MODELS)
    return req


UPSTREAMS = Upstreams(Pool({m: ModelSpec(m, 'http://127.0.0.1:9/v1') for m in MODELS}))   # builds requests only


@pytest.mark.timeout(300)
@settings(max_examples=1000 if SLOW else 200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(raw=raws, header=st.none() | st.text(max_size=12))
def test_any_body_is_a_checked_request_or_a_4xx(raw, header):
    req = check(raw, header)
    if req is not None:   # and the upstream request is built without a fault
        sent = json.loads(UPSTREAMS.request(UPSTREAMS.pool.models[req.model or 'small'], req.data).content)
        assert sent['model'] == (req.model or 'small') and sent['messages'] == req.body['messages']


@pytest.fixture(scope='module')
def endpoint():
    with FixedEndpoint('ok', delay_s=0) as up:
        app = create_app(lambda texts, lam=None: [MODELS] * len(texts),
                         Pool({m: ModelSpec(m, up.base_url, price_in=1.0, price_out=2.0) for m in MODELS}),
                         ServeSettings(port=0, max_tokens=64, daily_spend_usd=1.0))
        with BackgroundServer(app) as srv, httpx2.Client(base_url=srv.base_url, timeout=30) as http:
            yield http


@pytest.mark.timeout(300)
@settings(max_examples=1000 if SLOW else 200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(raw=nested, header=st.none() | st.just('0.5'))
def test_any_nesting_is_a_checked_request_or_a_400(raw, header):
    levels = max(itertools.accumulate(1 if c in b'[{' else -1 if c in b']}' else 0 for c in raw))   # no brackets in strings here
    req = check(raw, header)
    if levels > MAX_DEPTH: assert req is None, levels   # refused, never sent on (nor a TypeError when encoded)


@pytest.mark.timeout(300)
@settings(max_examples=300 if SLOW else 60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(raw=raws | nested)
def test_no_body_gets_a_500_from_the_endpoint(endpoint, raw, capfd):
    r = endpoint.post('/chat/completions', content=raw, headers={'content-type': 'application/json'})
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 200: assert set(r.json()['error']) == {'message', 'type', 'param', 'code'}
    err = capfd.readouterr().err
    assert 'Traceback' not in err and 'internal error' not in err, err[-2000:]
