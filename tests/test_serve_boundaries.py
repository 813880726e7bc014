"""The routing endpoint at its boundaries: the daily spend limit under concurrency, a model's concurrency under a burst,
slow and broken clients on raw sockets, request bodies that break parsers, malformed upstream streams, and
secrets in the access log.

Each test starts `dars_nb.serve` under uvicorn on a free loopback port (`BackgroundServer`) in front of
`FixedEndpoint`s and `FaultProxy`s from `dars_nb.testing`, and sends it what a careless or hostile client would.
"""
import asyncio
import json
import logging
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx2
import pytest

from dars_nb.pool.models import Limits, ModelSpec, Pool
from dars_nb.pool.server import BackgroundServer
from dars_nb.pool.usage import IMAGE_TOKENS, estimate_prompt_tokens
from dars_nb.serve.app import create_app
from dars_nb.serve.requests import ServeSettings
from dars_nb.testing import FaultProxy, FixedEndpoint, LoopbackEndpoint, chat_completion_body, chat_completion_events

KEY = 'client-key-0123456789abcdef'
USER = [{'role': 'user', 'content': 'What is 2 + 2?'}]


@contextmanager
def serving(pool, rank=None, header_timeout_s=10.0, body_timeout_s=30.0, quiet=True, **settings):
    "The endpoint (routing to the pool's first model unless `rank` says otherwise) and an HTTP client on its root."
    rank = rank or (lambda texts, lam=None: [list(pool.models)] * len(texts))
    app = create_app(rank, pool, ServeSettings(port=0, **settings))
    with BackgroundServer(app, quiet=quiet, header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s) as srv, \
         httpx2.Client(base_url=srv.base_url.removesuffix('/v1'), timeout=60) as http:
        yield srv, http


def burst(base_url, bodies, headers=None):
    "Send every body at once (one connection each); the responses, in order."
    async def go():
        limits = httpx2.Limits(max_connections=len(bodies), max_keepalive_connections=0)
        async with httpx2.AsyncClient(timeout=120, limits=limits) as c:
            return await asyncio.gather(*[c.post(base_url + '/chat/completions', json=b, headers=headers)
                                          for b in bodies])
    return asyncio.run(go())


# --- the daily spend limit is a guarantee ------------------------------------------------------------------------

PRICE_IN, PRICE_OUT = 5.0, 15.0   # $ per million tokens
IMAGE = {'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,' + 'A' * 400}}
LONG = 'Explain, step by step: ' + 'why is the sky blue? ' * 140   # 2,963 bytes


def case(kind):
    "(request body, the usage its upstream reports) for a request whose usage passes the typical estimate."
    if kind == 'image':   # a picture billed at the provider's worst case, one completion token
        text = 'What is in this picture?'
        body = {'max_tokens': 1, 'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': text}, IMAGE]}]}
        return body, dict(prompt_tokens=IMAGE_TOKENS + len(text), completion_tokens=1)
    if kind == 'long_prompt':   # a prompt reported at one token per byte, four times the typical estimate
        return {'max_tokens': 1, 'messages': [{'role': 'user', 'content': LONG}]}, \
            dict(prompt_tokens=len(LONG.encode()), completion_tokens=1)
    if kind == 'no_usage':   # an upstream that reports no usage at all
        return {'max_tokens': 64, 'messages': [{'role': 'user', 'content': LONG}]}, dict(usage=False)
    raise ValueError(kind)


@pytest.mark.parametrize('kind', ['image', 'long_prompt', 'no_usage'])
def test_the_daily_limit_holds_under_50_concurrent_requests_that_cost_more_than_estimated(kind):
    body, usage = case(kind)
    typical = estimate_prompt_tokens(body['messages'], 'typical')
    if 'prompt_tokens' in usage: assert usage['prompt_tokens'] > 3 * typical   # usage well past the typical estimate
    limit = 0.05
    with FixedEndpoint('ok', delay_s=0.2, **usage) as up, \
         serving(Pool({'m': ModelSpec('m', up.base_url, price_in=PRICE_IN, price_out=PRICE_OUT, concurrency=50)}),
                 daily_spend_usd=limit) as (srv, http):
        codes = [r.status_code for r in burst(srv.base_url, [body] * 50)]
        m = http.get('/metrics').json()
    assert set(codes) == {200, 429} and codes.count(200) == up.requests > 0
    assert m['spend_today_usd'] <= limit                                  # the guarantee
    assert m['in_flight_reserved_usd'] == 0 and m['models']['m']['answered'] == up.requests
    if 'prompt_tokens' in usage:   # charged what the upstream reported, nothing invented
        each = (usage['prompt_tokens'] * PRICE_IN + usage['completion_tokens'] * PRICE_OUT) / 1e6
        assert m['spend_today_usd'] == pytest.approx(up.requests * each, rel=1e-9)
    else:   # no usage reported: charged the worst case it reserved, said to be estimated
        assert m['models']['m']['usage_estimated'] == up.requests


def test_an_upstream_reporting_more_than_a_request_can_cost_is_charged_as_reported_and_named(capfd):
    with FixedEndpoint('ok', delay_s=0, prompt_tokens=1_000_000) as up, \
         serving(Pool({'m': ModelSpec('m', up.base_url, price_in=PRICE_IN, price_out=PRICE_OUT)})) as (srv, http):
        assert http.post('/v1/chat/completions', json={'messages': USER}).status_code == 200
        m = http.get('/metrics').json()['models']['m']
    assert m['spend_usd'] == pytest.approx((1_000_000 * PRICE_IN + 5 * PRICE_OUT) / 1e6)
    assert m['usage_over_reservation'] == 1
    err = capfd.readouterr().err
    assert err.count("model 'm' reported usage") == 1 and 'Traceback' not in err


# --- a burst: one timeout for the wait, another for the call -------------------------------------------------------

def test_a_burst_never_exceeds_a_models_concurrency_and_every_request_sent_is_charged():
    with FixedEndpoint('ok', delay_s=0.1) as up, \
         serving(Pool({'m': ModelSpec('m', up.base_url, price_in=PRICE_IN, price_out=PRICE_OUT, concurrency=4)},
                      limits=Limits(timeout_s=2.0))) as (srv, http):
        codes = [r.status_code for r in burst(srv.base_url, [{'messages': USER}] * 200)]
        m = http.get('/metrics').json()
    # 200 requests, 4 at a time, 0.1 s each: 5 s in all, more than the 2 s one upstream call may take
    assert up.max_in_flight <= 4
    assert codes == [200] * 200 and up.requests == 200
    charged = m['models']['m']['answered'] + m['models']['m']['lost']
    assert charged == up.requests
    assert m['spend_today_usd'] == pytest.approx(200 * (10 * PRICE_IN + 5 * PRICE_OUT) / 1e6, rel=1e-9)


def test_a_request_whose_answer_is_lost_is_charged_its_worst_case():
    with FixedEndpoint('ok', delay_s=0) as up, FaultProxy(up.base_url, plan=['slow'], slow_s=3) as proxy, \
         serving(Pool({'m': ModelSpec('m', proxy.base_url, price_in=PRICE_IN, price_out=PRICE_OUT)},
                      limits=Limits(timeout_s=0.5)), max_tokens=100) as (srv, http):
        r = http.post('/v1/chat/completions', json={'messages': USER})
        m = http.get('/metrics').json()
    assert r.status_code == 502
    body = {'messages': USER, 'max_tokens': 100}
    worst = (estimate_prompt_tokens(body) * PRICE_IN + 100 * PRICE_OUT) / 1e6
    assert (m['models']['m']['lost'], m['models']['m']['answered']) == (1, 0)
    assert m['spend_today_usd'] == pytest.approx(worst, rel=1e-9)


def test_a_model_that_stays_busy_is_a_503_and_nothing_is_sent():
    with FixedEndpoint('ok', delay_s=1.5) as up, \
         serving(Pool({'m': ModelSpec('m', up.base_url, concurrency=1)}), queue_timeout_s=0.3) as (srv, http):
        codes = sorted(r.status_code for r in burst(srv.base_url, [{'messages': USER}] * 3))
        m = http.get('/metrics').json()
    assert codes == [200, 503, 503] and up.requests == 1
    assert m['refused'] == {'503': 2} and m['models']['m']['lost'] == 0


# --- slow and broken clients ------------------------------------------------------------------------------------

def raw(port, data=b'', then_close=False, wait_s=15):
    "Send `data` on a new connection; (what came back, whether the server closed the connection)."
    s = socket.create_connection(('127.0.0.1', port))
    s.settimeout(wait_s)
    if data: s.sendall(data)
    if then_close: s.close(); return b'', True
    got = b''
    try:
        while chunk := s.recv(65536): got += chunk
    except TimeoutError: return got, False
    finally: s.close()
    return got, True


def post_head(port, length, extra=b''):
    return (b'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n' % port
            + b'content-length: %d\r\n' % length + extra + b'\r\n')


@pytest.mark.parametrize('keys', [(), (KEY,)])
def test_idle_half_sent_and_unfinished_requests_are_closed(keys):
    with FixedEndpoint('ok', delay_s=0) as up, \
         serving(Pool({'m': ModelSpec('m', up.base_url)}), header_timeout_s=1, body_timeout_s=1,
                 client_keys=keys) as (srv, http):
        port = srv.port
        idle = raw(port)
        half_headers = raw(port, b'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n' % port)
        half_body = raw(port, post_head(port, 200) + b'{"messages": [')
        assert http.post('/v1/chat/completions', json={'messages': USER},
                         headers={'authorization': f'Bearer {KEY}'}).status_code == 200   # the server still serves
    assert idle == (b'', True) and half_headers == (b'', True)
    got, closed = half_body
    assert closed and got.startswith(b'HTTP/1.1 401' if keys else b'HTTP/1.1 408'), got[:200]
    assert up.requests == 1


def test_a_client_hanging_up_mid_body_is_one_log_line(capfd):
    with FixedEndpoint('ok', delay_s=0) as up, serving(Pool({'m': ModelSpec('m', up.base_url)})) as (srv, http):
        raw(srv.port, post_head(srv.port, 500) + b'{"messages": [{"role": "user", "content": "hel', then_close=True)
        deadline, err = time.monotonic() + 10, ''
        while 'hung up' not in err and time.monotonic() < deadline:
            time.sleep(0.05); err += capfd.readouterr().err
        assert http.get('/metrics').json()['refused'] == {}   # nothing to answer: no one is listening
    assert [l for l in err.splitlines() if l.strip()] == [l for l in err.splitlines() if 'hung up' in l]
    assert err.count('hung up') == 1 and 'Traceback' not in err and 'internal error' not in err.lower()


# --- bodies that break parsers -----------------------------------------------------------------------------------------

@contextmanager
def logged():
    "(logger name, message) of every record uvicorn's loggers emit in the block."
    records, loggers = [], [logging.getLogger(n) for n in ('uvicorn.access', 'uvicorn.error')]
    class Keep(logging.Handler):
        def emit(self, record): records.append((record.name, record.getMessage()))
    keep = Keep()
    for log in loggers: log.addHandler(keep)
    try: yield records
    finally:
        for log in loggers: log.removeHandler(keep)


@pytest.mark.parametrize('raw_body, says', [
    (b'{"messages": ' + b'[' * 5000 + b']' * 5000 + b'}', 'nested'),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 'surrogate'),
    (json.dumps({'model': ['dars-router'], 'messages': USER}).encode(), 'model'),
    (json.dumps({'model': {'name': 'x'}, 'messages': USER}).encode(), 'model'),
    *[pytest.param(b'{"messages": [{"role": "user", "content": "hi"}], "tools": ' + b'[' * n + b']' * n + b'}', 'nested',
                   id=f'{n + 1} levels')
      for n in (254, 600, 1023)],   # deeper than orjson writes (254 levels), not than it reads (1,024)
    pytest.param(b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": ' + b'[' * 300 + b']' * 300
                 + b'}]}]}', 'nested', id='deep in a content part'),
])
@pytest.mark.timeout(60)
def test_bodies_that_break_parsers_are_400s_with_one_log_line(raw_body, says, capfd):
    with FixedEndpoint('ok', delay_s=0) as up, serving(Pool({'m': ModelSpec('m', up.base_url)}), quiet=False) as (srv, http), \
         logged() as records:   # attached once the server has configured its loggers
        capfd.readouterr()
        r = http.post('/v1/chat/completions', content=raw_body, headers={'content-type': 'application/json'})
        lines = [f'{name}: {line}' for name, line in records]
        err = capfd.readouterr().err
    assert r.status_code == 400, r.text
    assert says in r.json()['error']['message']
    assert len(lines) == 1 and 'uvicorn.access' in lines[0] and ' 400' in lines[0], lines   # the access-log line
    assert 'Traceback' not in err and 'internal error' not in err and up.requests == 0
    assert [l for l in err.splitlines() if l.strip() and 'uvicorn' not in l] == [], err


# --- malformed upstream streams ---------------------------------------------------------------------------------

@pytest.mark.parametrize('fault', ['malformed', 'broken_stream'])
def test_a_malformed_stream_falls_back_to_the_next_model(fault):
    with FixedEndpoint('four', delay_s=0) as good, FixedEndpoint('bad', delay_s=0) as bad, \
         FaultProxy(bad.base_url, plan=[fault]) as proxy, \
         serving(Pool({'big': ModelSpec('big', proxy.base_url), 'small': ModelSpec('small', good.base_url)})) as (_, http):
        with http.stream('POST', '/v1/chat/completions', json={'messages': USER, 'stream': True}) as r:
            lines = [l for l in r.iter_lines() if l.startswith('data:')]
        m = http.get('/metrics').json()
    assert r.status_code == 200 and r.headers['x-dars-model'] == 'small' and r.headers['x-dars-fallback-from'] == 'big'
    text = ''.join(c['choices'][0]['delta'].get('content', '') for c in map(lambda l: json.loads(l[5:]), lines[:-1])
                   if c.get('choices'))
    assert text == 'four' and lines[-1] == 'data: [DONE]'
    assert (m['models']['big']['failures'], m['models']['big']['answered'], m['models']['small']['answered']) == (1, 0, 1)


def test_a_stream_that_breaks_after_its_first_event_ends_in_an_error_event():
    with FixedEndpoint('bad', delay_s=0) as bad, FaultProxy(bad.base_url, plan=['cut_stream']) as proxy, \
         serving(Pool({'m': ModelSpec('m', proxy.base_url)})) as (_, http):
        with http.stream('POST', '/v1/chat/completions', json={'messages': USER, 'stream': True}) as r:
            lines = [l for l in r.iter_lines() if l.startswith('data:')]
        m = http.get('/metrics').json()
    last = json.loads(lines[-1][5:])
    assert 'error' in last and 'malformed' in last['error']['message'], lines
    assert (m['models']['m']['failures'], m['models']['m']['answered']) == (1, 0)


def test_a_malformed_stream_from_the_only_model_is_a_502():
    with FixedEndpoint('bad', delay_s=0) as bad, FaultProxy(bad.base_url, plan=['malformed']) as proxy, \
         serving(Pool({'m': ModelSpec('m', proxy.base_url)})) as (_, http):
        r = http.post('/v1/chat/completions', json={'messages': USER, 'stream': True})
    assert r.status_code == 502 and r.headers['content-type'].startswith('application/json')


# --- the access log ---------------------------------------------------------------------------------------------

def test_a_key_in_a_query_string_never_reaches_the_access_log():
    records = []
    class Keep(logging.Handler):
        def emit(self, record): records.append(record.getMessage())
    log, keep = logging.getLogger('uvicorn.access'), Keep()
    with FixedEndpoint('ok', delay_s=0) as up:
        app = create_app(lambda texts, lam=None: [['m']] * len(texts), Pool({'m': ModelSpec('m', up.base_url)}),
                         ServeSettings(port=0, client_keys=(KEY,)))
        with BackgroundServer(app, quiet=False) as srv:
            log.addHandler(keep)
            try:
                root = srv.base_url.removesuffix('/v1')
                assert httpx2.post(root + f'/v1/chat/completions?api_key={KEY}&x=1', json={'messages': USER}).status_code == 401
                assert httpx2.get(root + f'/v1/models?key={KEY}', headers={'authorization': f'Bearer {KEY}'}).status_code == 200
            finally: log.removeHandler(keep)
    assert len(records) == 2 and all(KEY not in r for r in records), records
    assert '/v1/chat/completions?' in records[0] and ' 401' in records[0]


# --- the daily limit against upstreams that report more than they could bill ----------------------------------------

class LyingEndpoint(LoopbackEndpoint):
    "An upstream whose i-th answer, plain or streamed (`pause_s` between events), reports `prompt_tokens(i)` prompt tokens."
    def __init__(self, prompt_tokens, delay_s=0.1, pause_s=0.0):
        super().__init__()
        self.prompt_tokens, self.delay_s, self.pause_s, self.requests = prompt_tokens, delay_s, pause_s, 0

    async def handle(self, request):
        from starlette.responses import Response, StreamingResponse
        self.requests += 1
        tokens = dict(prompt_tokens=self.prompt_tokens(self.requests), completion_tokens=5)
        streamed = json.loads(await request.body()).get('stream') is True
        await asyncio.sleep(self.delay_s)
        if not streamed: return Response(chat_completion_body('an answer', **tokens), media_type='application/json')
        events = [e + b'\n\n' for e in chat_completion_events('a longer answer than one word', **tokens).split(b'\n\n') if e]
        async def slowly():
            for e in events:
                yield e
                await asyncio.sleep(self.pause_s)
        return StreamingResponse(slowly(), media_type='text/event-stream')


def stream_burst(base_url, n, body, hang_up):
    "Open `n` streams at once (one connection each); client i closes after the first event if `hang_up(i)`. Statuses."
    async def one(c, i):
        async with c.stream('POST', base_url + '/chat/completions', json=body) as r:
            if r.status_code != 200: await r.aread(); return r.status_code
            async for line in r.aiter_lines():
                if line.startswith('data:') and hang_up(i): break
            return r.status_code
    async def go():
        limits = httpx2.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx2.AsyncClient(timeout=120, limits=limits) as c:
            return await asyncio.gather(*[one(c, i) for i in range(n)])
    return asyncio.run(go())


def settled(http, timeout_s=30):
    "/metrics once nothing is held any more (streams whose clients hung up settle a moment after)."
    deadline = time.monotonic() + timeout_s
    while (m := http.get('/metrics').json())['in_flight_reserved_usd'] > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    return m


LIE_IN, LIE_OUT = 0.5, 1.5                              # $ per million tokens
ONE_ANSWER = (100_000 * LIE_IN + 5 * LIE_OUT) / 1e6     # what each answer of the liar reports: $0.05


@pytest.mark.timeout(180)
@pytest.mark.parametrize('limit', [0.01, 0.3])
@pytest.mark.parametrize('mode', ['plain', 'streamed', 'hang_ups'])
def test_the_daily_limit_holds_when_200_requests_meet_an_upstream_reporting_100k_prompt_tokens(mode, limit):
    with LyingEndpoint(lambda i: 100_000, delay_s=0.1, pause_s=0.02 if mode == 'hang_ups' else 0.0) as up, \
         serving(Pool({'m': ModelSpec('m', up.base_url, price_in=LIE_IN, price_out=LIE_OUT, concurrency=200)}),
                 daily_spend_usd=limit) as (srv, http):
        if mode == 'plain': codes = [r.status_code for r in burst(srv.base_url, [{'messages': USER}] * 200)]
        else: codes = stream_burst(srv.base_url, 200, {'messages': USER, 'stream': True},
                                   hang_up=lambda i: mode == 'hang_ups' and i % 2 == 0)
        m = settled(http)
    spent, over, counts = m['spend_today_usd'], m['over_reserved_today_usd'], m['models']['m']
    assert set(codes) <= {200, 429} and 200 in codes, codes
    assert spent <= limit + ONE_ANSWER, spent                 # one answer's excess at most (was $0.91 against $0.01)
    assert spent <= limit + over + 1e-12                      # the guarantee as /metrics states it
    assert over <= ONE_ANSWER and counts['usage_over_reservation'] <= 1
    assert m['in_flight_reserved_usd'] == 0 and counts['answered'] + counts['lost'] == up.requests
    if limit == 0.01 and mode != 'hang_ups': assert codes.count(200) == 1   # the first answer alone: then no room
    if limit == 0.3: assert codes.count(200) >= 2                            # the learned ratio lets several through


@pytest.mark.timeout(180)
def test_the_guarantee_holds_whatever_an_upstream_reports():
    with LyingEndpoint(lambda i: 1_000 * (1 + (i * 7919) % 200), delay_s=0.05) as up, \
         serving(Pool({'m': ModelSpec('m', up.base_url, price_in=LIE_IN, price_out=LIE_OUT, concurrency=200)}),
                 daily_spend_usd=0.5) as (srv, http):   # the i-th answer reports 1,000 to 200,000 prompt tokens, in no order
        codes = [r.status_code for r in burst(srv.base_url, [{'messages': USER}] * 200)]
        m = settled(http)
    assert set(codes) <= {200, 429} and codes.count(200) >= 2
    assert m['spend_today_usd'] <= 0.5 + m['over_reserved_today_usd'] + 1e-12
    assert m['in_flight_reserved_usd'] == 0 and m['models']['m']['answered'] == up.requests


@pytest.mark.timeout(120)
def test_requests_waiting_for_a_models_first_report_fall_back_or_get_a_503_and_cost_nothing():
    with FixedEndpoint('slow', delay_s=1.5) as slow, FixedEndpoint('fast', delay_s=0) as fast:
        pool = Pool({'slow': ModelSpec('slow', slow.base_url, price_in=1.0, price_out=1.0),
                     'fast': ModelSpec('fast', fast.base_url, price_in=1.0, price_out=1.0)})
        with serving(pool, daily_spend_usd=1.0, queue_timeout_s=0.3) as (srv, http):
            routed = burst(srv.base_url, [{'messages': USER}] * 3)
            m = http.get('/metrics').json()
        with serving(pool, daily_spend_usd=1.0, queue_timeout_s=0.3) as (srv, http):   # a new endpoint: no report yet
            named = burst(srv.base_url, [{'messages': USER, 'model': 'slow'}] * 3)   # no other model to go to
            m2 = http.get('/metrics').json()
    assert sorted(r.headers.get('x-dars-model', '') for r in routed) == ['fast', 'fast', 'slow']
    assert all(r.headers['x-dars-fallback-from'] == 'slow' for r in routed if r.headers['x-dars-model'] == 'fast')
    assert sorted(r.status_code for r in named) == [200, 503, 503]
    busy = [r.json()['error'] for r in named if r.status_code == 503]   # busy, as a model whose slots are all taken
    assert all(e['code'] == 'busy' and 'no usage report from its attempt in flight' in e['message'] for e in busy)
    assert slow.requests == 2 and fast.requests == 2                    # what waited was never sent, nor charged
    assert (m['models']['slow']['answered'], m['models']['fast']['answered'], m2['models']['slow']['answered']) == (1, 2, 1)
    assert m2['refused'] == {'503': 2} and m2['spend_today_usd'] == pytest.approx(15 / 1e6)


# --- a web page cannot make a key-less endpoint spend -----------------------------------------------------------------

def one_line_error(r) -> dict:
    "The error of a refusal, checked: a 4xx in OpenAI's JSON shape, its message on one line."
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    error = r.json()['error']
    assert set(error) == {'message', 'type', 'param', 'code'} and '\n' not in error['message']
    return error


@pytest.mark.timeout(120)
def test_a_web_page_cannot_make_a_keyless_endpoint_on_loopback_spend():
    with FixedEndpoint('ok', delay_s=0) as up:
        pool = Pool({'m': ModelSpec('m', up.base_url, price_in=1.0, price_out=1.0)})
        app = create_app(lambda texts, lam=None: [['m']] * len(texts), pool, ServeSettings(port=0), chat=True)
        with BackgroundServer(app) as srv, httpx2.Client(base_url=srv.base_url.removesuffix('/v1'), timeout=30) as http:
            port, body = srv.port, json.dumps({'messages': USER})
            evil = {'host': f'evil.example:{port}', 'origin': f'http://evil.example:{port}'}
            refused = {
                'rebinding, text/plain': http.post('/v1/chat/completions', content=body,
                                                   headers={**evil, 'content-type': 'text/plain'}),
                'rebinding, json': http.post('/v1/chat/completions', content=body,
                                             headers={**evil, 'content-type': 'application/json'}),
                'cross-site, text/plain': http.post('/v1/chat/completions', content=body,
                                                    headers={'origin': 'http://evil.example', 'content-type': 'text/plain'}),
                'form post': http.post('/v1/chat/completions', content=body,
                                       headers={'content-type': 'application/x-www-form-urlencoded'}),
                'no content type': http.post('/v1/chat/completions', content=body),
                **{f'GET {p}, rebinding': http.get(p, headers=evil) for p in
                   ('/metrics', '/metrics/prometheus', '/v1/models', '/health', '/chat')},
                'metrics, foreign host': http.get('/metrics', headers={'host': f'evil.example:{port}'}),
                'preflight': http.request('OPTIONS', '/v1/chat/completions', headers={
                    'origin': 'http://evil.example', 'access-control-request-method': 'POST'})}
            page = http.get('/chat')
            own = http.post('/v1/chat/completions', json={'messages': USER}, headers={'origin': f'http://127.0.0.1:{port}'})
            named = http.post('/v1/chat/completions', json={'messages': USER}, headers={'host': f'localhost:{port}'})
            m = http.get('/metrics').json()
    statuses = {k: r.status_code for k, r in refused.items()}
    assert statuses == {'rebinding, text/plain': 421, 'rebinding, json': 421, 'cross-site, text/plain': 403,
                        'form post': 415, 'no content type': 415, 'metrics, foreign host': 421, 'preflight': 403,
                        **{f'GET {p}, rebinding': 421 for p in ('/metrics', '/metrics/prometheus', '/v1/models', '/health', '/chat')}}
    for r in refused.values(): one_line_error(r)
    assert (page.status_code, own.status_code, named.status_code) == (200, 200, 200)   # the chat page still works
    assert up.requests == 2 and m['models']['m']['answered'] == 2                      # nothing refused was sent or charged
    assert m['spend_today_usd'] == pytest.approx(2 * 15 / 1e6)
    assert m['refused'] == {'421': 8, '403': 2, '415': 2}


@pytest.mark.timeout(120)
def test_allowed_hosts_and_origins_are_let_in():
    with FixedEndpoint('ok', delay_s=0) as up, \
         serving(Pool({'m': ModelSpec('m', up.base_url)}), allow_hosts=('dars.internal',),
                 allow_origins=('https://app.example',)) as (srv, http):
        ok = [http.post('/v1/chat/completions', json={'messages': USER}, headers=h).status_code for h in (
            {'host': f'dars.internal:{srv.port}'}, {'host': 'dars.internal'}, {'origin': 'https://app.example'},
            {'host': 'dars.internal', 'origin': 'https://dars.internal'})]
        not_ok = [http.post('/v1/chat/completions', json={'messages': USER}, headers=h).status_code for h in (
            {'host': f'other.internal:{srv.port}'}, {'origin': 'https://app.example.evil'})]
    assert ok == [200] * 4 and not_ok == [421, 403] and up.requests == 4


@pytest.mark.timeout(120)
def test_dars_serve_help_states_the_spend_guarantee_and_the_door_options():
    run = subprocess.run([sys.executable, '-m', 'dars_nb', 'serve', '--help'], capture_output=True, text=True, timeout=60)
    text = ' '.join(run.stdout.split())
    assert run.returncode == 0, run.stderr
    for option in ('--daily-spend-usd', '--allow-host', '--allow-origin'): assert option in text
    assert 'beyond what was held for them' in text


# --- model names that cannot go in an HTTP header ------------------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize('toml_name, says', [(r'a\nb', r"model 'a\nb': it holds '\n'"), (r'a\u0000b', r"it holds '\x00'"),
                                             (r'caf\u00e9', "printable ASCII only"), (r'\u6a21\u578b', "printable ASCII only"),
                                             (' padded', 'begins or ends with white space')])
def test_a_model_name_that_cannot_go_in_a_header_is_refused_when_the_pool_is_read(tmp_path, toml_name, says):
    cfg = tmp_path / 'pool.toml'
    cfg.write_text(f'[models."{toml_name}"]\nbase_url = "http://127.0.0.1:9/v1"\n', encoding='utf-8')
    run = subprocess.run([sys.executable, '-m', 'dars_nb', 'serve', '--router', str(tmp_path / 'r.dars'), '--pool', str(cfg)],
                         capture_output=True, text=True, timeout=60)
    lines = [l for l in run.stderr.splitlines() if l.strip()]
    assert run.returncode != 0 and len(lines) == 1 and says in lines[0], run.stderr
    assert 'Traceback' not in run.stderr


# --- settings no server can run with: refused by the command in one line, before anything loads ----------------------

def _dars(*args):
    return subprocess.run([sys.executable, '-m', 'dars_nb', *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize('command', ['local', 'serve'])
@pytest.mark.parametrize('port', ['99999', '-5', '65536'])
def test_a_port_no_socket_can_bind_is_one_line_for_serve_and_local(tmp_path, command, port):
    "`dars local --port 99999` says what `dars serve --port 99999` says, before a model or a bundle loads."
    cfg = tmp_path / 'pool.toml'
    cfg.write_text('[models.small]\nbase_url = "http://127.0.0.1:9/v1"\n')
    extra = ['--router', str(tmp_path / 'no-router.dars'), '--pool', str(cfg)] if command == 'serve' else []
    run = _dars(command, *extra, f'--port={port}')
    assert run.returncode == 1 and 'Traceback' not in run.stderr and run.stderr.count('\n') == 1, run.stderr
    assert run.stderr == f'dars {command}: error: {command}: port must be an integer from 0 to 65535, got {port}\n'


@pytest.mark.parametrize('router_model, says', [
    ('small', "[serve] router_model 'small' is also a model of the pool: requests for it would be routed"),
    ('gpt', "[serve] router_model 'gpt' covers the pool's model 'gpt-4': its name reads as gpt-<λ>")])
def test_a_router_name_that_hides_a_pool_model_is_refused_when_the_pool_is_read(tmp_path, router_model, says):
    cfg = tmp_path / 'pool.toml'
    cfg.write_text(''.join(f'[models."{m}"]\nbase_url = "http://127.0.0.1:9/v1"\n' for m in ('small', 'gpt-4'))
                   + f'[serve]\nrouter_model = "{router_model}"\n')
    run = _dars('serve', '--router', str(tmp_path / 'no-router.dars'), '--pool', str(cfg))
    assert run.returncode == 1 and 'Traceback' not in run.stderr and run.stderr.count('\n') == 1, run.stderr
    assert run.stderr.startswith('dars serve: error: ') and says in run.stderr, run.stderr


# --- upstreams that never stop, stop in mid-stream, or answer twice ---------------------------------------------------

EVENT = b'data: {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a "}}]}\n\n'


def _chunk(data: bytes) -> bytes: return b'%x\r\n%s\r\n' % (len(data), data)


class RawUpstream:
    """An upstream on a raw asyncio socket server in a background thread, misbehaving as each request's model says
    (no ASGI server sends a 1xx or runs without end); it counts the connections it has open."""
    def __init__(self): self.open, self.requests, self.loop = 0, 0, None

    async def _handle(self, reader, writer):
        self.open += 1
        try:
            while True:
                head = await reader.readuntil(b'\r\n\r\n')
                length = next(int(l.split(b':')[1]) for l in head.split(b'\r\n') if l.lower().startswith(b'content-length'))
                model = json.loads(await reader.readexactly(length))['model']
                self.requests += 1
                await getattr(self, model)(writer, self.requests)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError): pass
        finally:
            self.open -= 1; writer.close()

    async def hinted(self, w, k):   # `103 Early Hints` before each answer, which names its request
        w.write(b'HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\n'); await w.drain()
        await asyncio.sleep(0.05)
        body = chat_completion_body(f'answer {k}')
        w.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n' % len(body) + body)

    async def firehose(self, w, k):   # a stream of events without pause and without end
        w.write(b'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n')
        while True: w.write(_chunk(EVENT * 50)); await w.drain()

    async def endless(self, w, k):   # a plain answer without end
        w.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n')
        while True: w.write(_chunk(b' ' * 65536)); await w.drain()

    async def stall(self, w, k):   # one event, then silence
        w.write(b'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n' + _chunk(EVENT))
        await w.drain(); await asyncio.sleep(3600)

    async def moved(self, w, k):   # a redirect
        w.write(b'HTTP/1.1 302 Found\r\nlocation: http://example.com/\r\ncontent-length: 0\r\n\r\n')

    @property
    def base_url(self): return f'http://127.0.0.1:{self.port}/v1'

    def __enter__(self):
        import threading
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, '127.0.0.1', 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        async def close():
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}: task.cancel()
        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop); self.thread.join(10); self.loop.close()


def wait_for(check, timeout_s=15):
    "`check()` once it is true, or its last value after `timeout_s`."
    deadline = time.monotonic() + timeout_s
    while not (ok := check()) and time.monotonic() < deadline: time.sleep(0.05)
    return ok


@pytest.mark.timeout(60)
def test_an_upstream_sending_early_hints_gives_each_request_its_own_answer():
    with RawUpstream() as up, FixedEndpoint('the other model') as other, \
         serving(Pool({'hinted': ModelSpec('hinted', up.base_url, concurrency=1),
                       'plain': ModelSpec('plain', other.base_url)})) as (srv, http):
        said = [http.post('/v1/chat/completions', json={'model': 'hinted', 'messages': USER}) for _ in range(3)]
        plain = http.post('/v1/chat/completions', json={'model': 'plain', 'messages': USER})
    assert [(r.status_code, r.json()['choices'][0]['message']['content']) for r in said] == \
        [(200, 'answer 1'), (200, 'answer 2'), (200, 'answer 3')]
    assert plain.json()['choices'][0]['message']['content'] == 'the other model'


@pytest.mark.timeout(60)
def test_a_client_hanging_up_on_a_stream_that_never_pauses_frees_it_at_once():
    with RawUpstream() as up, \
         serving(Pool({'firehose': ModelSpec('firehose', up.base_url, price_in=1.0, price_out=2.0)})) as (srv, http):
        with http.stream('POST', '/v1/chat/completions', json={'model': 'firehose', 'messages': USER, 'stream': True}) as r:
            first = next(line for line in r.iter_lines() if line.startswith('data:'))
        assert first.startswith('data: {') and wait_for(lambda: up.open == 1)
        m = settled(http, timeout_s=15)   # what the stream held is settled once it is closed
        closed = wait_for(lambda: up.open == 0)
    assert m['in_flight_reserved_usd'] == 0 and m['models']['firehose']['answered'] == 1, m
    assert closed, 'the upstream connection of a stream whose client left is still open'


@pytest.mark.timeout(90)
def test_an_endless_answer_and_a_redirect_fail_over_and_a_silent_stream_ends_with_an_error_event():
    first_word = lambda texts, lam=None: [[t.split()[0], 'good'] for t in texts]
    with RawUpstream() as up, FixedEndpoint('Final Answer: 4') as good, \
         serving(Pool({**{m: ModelSpec(m, up.base_url, timeout_s=1) for m in ('endless', 'moved', 'stall')},
                       'good': ModelSpec('good', good.base_url)}), rank=first_word, max_answer_bytes=1_000_000) as (srv, http):
        ask = lambda word, **more: {'model': 'dars-router', 'messages': [{'role': 'user', 'content': f'{word} 2 + 2?'}], **more}
        over = {word: http.post('/v1/chat/completions', json=ask(word)) for word in ('endless', 'moved')}
        started = time.monotonic()
        silent = http.post('/v1/chat/completions', json=ask('stall', stream=True))
        took = time.monotonic() - started
        m = settled(http)
    for word, r in over.items():
        assert (r.status_code, r.headers['x-dars-model'], r.headers['x-dars-fallback-from']) == (200, 'good', word)
    events = [json.loads(l[6:]) for l in silent.text.splitlines() if l.startswith('data: {')]
    assert silent.status_code == 200 and events[0]['choices'][0]['delta']['content'] == 'a ', silent.text[:300]
    assert 'the upstream sent nothing for 1 s' in events[-1]['error']['message'] and took < 30, (took, events[-1])
    assert m['in_flight_reserved_usd'] == 0 and m['models']['stall']['lost'] == 1 and m['models']['endless']['lost'] == 1, m
