"""The client against a REAL local model (SmolLM2-135M-Instruct via llama.cpp) behind a fault-injecting proxy.

Every completion here is real generation with real token counts; only the failures are injected, by
`FaultProxy`, on the way between the client and the model server.
"""
import asyncio
import time
from collections import Counter

import pytest

from dars_nb.collect.client import BudgetExceeded, Client, PermanentError
from dars_nb.pool.local import LOCAL_MODELS
from dars_nb.pool.models import Limits, ModelSpec, Pool
from dars_nb.pool.server import free_port
from dars_nb.pool.usage import estimate_prompt_tokens

MODEL = 'smollm2'
MESSAGES = [{'role': 'system', 'content': "Answer briefly. End with a line 'Final Answer: <answer>'."},
            {'role': 'user', 'content': 'What is 2 + 2?'}]
MAX_TOKENS = 8
KIND_OF_ACTION = {'429': 'rate_limit', '500': 'server', '503': 'server', 'drop': 'connection',
                  'malformed': 'malformed', 'slow': 'timeout'}


def pool_at(base_url, **limits):
    "A one-model pool (SmolLM2 at its nominal prices) at `base_url`."
    m = LOCAL_MODELS[MODEL]
    lim = dict(timeout_s=60.0, backoff_s=0.05, backoff_max_s=0.5) | limits
    return Pool({MODEL: ModelSpec(MODEL, base_url, price_in=m.price_in, price_out=m.price_out, concurrency=2)},
                limits=Limits(**lim))


def run(coro):
    return asyncio.run(coro)


async def calls(pool, n=1, seed=0, ledger=None, **kw):
    "Make `n` calls concurrently; returns (results or exceptions, counters)."
    async with Client(pool, seed=seed, ledger=ledger) as client:
        out = await asyncio.gather(*[client.complete(MODEL, MESSAGES, max_tokens=MAX_TOKENS, **kw) for _ in range(n)],
                                   return_exceptions=True)
    return out, client.counters


def test_real_call_reports_usage_and_cost(llama_server):
    (done,), c = run(calls(pool_at(llama_server)))
    assert done.model == MODEL and done.attempts == 1
    assert done.prompt_tokens > 10 and 0 < done.completion_tokens <= MAX_TOKENS
    assert done.finish_reason in ('stop', 'length')
    spec = pool_at(llama_server).models[MODEL]
    assert done.cost_usd == pytest.approx(spec.cost(done.prompt_tokens, done.completion_tokens))
    assert (c.calls, c.completed, c.retries, c.errors, c.failures) == (1, 1, 0, 0, 0)
    assert c.spend_usd == pytest.approx(done.cost_usd)


def test_each_transient_fault_is_retried_and_counted(fault_proxy):
    plan = ['429', '500', 'drop', 'malformed', 'slow']
    proxy = fault_proxy(plan=plan, retry_after=0.2, slow_s=60)
    (done,), c = run(calls(pool_at(proxy.base_url, timeout_s=10.0)))
    assert not isinstance(done, BaseException), done
    assert done.attempts == 6 and done.completion_tokens > 0
    assert [a for _, a in proxy.log] == plan + ['pass']
    assert (c.calls, c.completed, c.retries, c.errors, c.failures) == (6, 1, 5, 5, 0)
    assert c.by_kind == {'rate_limit': 1, 'server': 1, 'connection': 1, 'malformed': 1, 'timeout': 1}
    assert c.spend_usd == pytest.approx(done.cost_usd) and c.completion_tokens == done.completion_tokens


def test_retry_after_is_honoured(fault_proxy):
    # backoff alone would wait 2.5-5 s; the server asks for 1 s, and the client waits that (plus <= 10 % jitter)
    proxy = fault_proxy(plan=['429', '429'], retry_after=1.0)
    (done,), c = run(calls(pool_at(proxy.base_url, backoff_s=5.0, backoff_max_s=5.0)))
    assert done.attempts == 3
    arrivals = [t for t, _ in proxy.log]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(gaps) == 2
    for g in gaps:
        assert 1.0 <= g < 2.4, gaps                  # honoured, and not the >= 2.5 s backoff
    assert c.by_kind == {'rate_limit': 2}


def test_permanent_4xx_is_not_retried(fault_proxy):
    proxy = fault_proxy(plan=['400'])
    (err,), c = run(calls(pool_at(proxy.base_url)))
    assert isinstance(err, PermanentError)
    assert (err.status, err.kind, err.attempts) == (400, 'client', 1)
    assert len(proxy.log) == 1                      # sent once, never again
    assert (c.calls, c.retries, c.failures, c.completed) == (1, 0, 1, 0)
    assert str(err).splitlines() == [str(err)]      # one line


def test_unknown_model_is_a_real_404(llama_server):
    ghost = Pool({'ghost': ModelSpec('ghost', llama_server)}, limits=Limits(backoff_s=0.05))
    async def one():
        async with Client(ghost) as client:
            with pytest.raises(PermanentError) as e:
                await client.complete('ghost', MESSAGES, max_tokens=MAX_TOKENS)
            return e.value, client.counters
    err, c = run(one())
    assert (err.status, err.attempts, c.calls) == (404, 1, 1)


def test_the_local_front_reads_a_form_posted_body_and_answers_bad_fields_in_one_line(llama_server):
    """As `curl -d` sends it (a JSON body called a form) a request is answered; a field llama.cpp's own validation refuses
    is a 400 naming it, without the Python stack its server appends, and a wrong sampling field never reaches it."""
    import httpx2, json
    url = llama_server + '/chat/completions'
    body = {'model': 'smollm2', 'messages': MESSAGES, 'max_tokens': MAX_TOKENS, 'temperature': 0}
    as_form = {'content-type': 'application/x-www-form-urlencoded'}
    answered = httpx2.post(url, content=json.dumps(body), headers=as_form, timeout=120)
    assert answered.status_code == 200 and answered.json()['choices'][0]['message']['content'], answered.text
    stop = httpx2.post(url, json={**body, 'stop': 5}, timeout=120)              # refused by llama.cpp itself
    assert stop.status_code == 400 and 'File' not in stop.text, stop.text
    said = stop.json()['error']['message']   # pydantic names the union's members: stop.str, stop.list[str]
    assert said.startswith('stop.str: Input should be a valid string') and '\n' not in said, said
    hot = httpx2.post(url, json={**body, 'temperature': 'hot'}, timeout=120)    # refused by the front
    assert (hot.status_code, hot.json()['error']['param']) == (400, 'temperature')


def test_exhausted_retries_end_in_permanent_error(fault_proxy):
    proxy = fault_proxy(plan=['503'] * 3)
    (err,), c = run(calls(pool_at(proxy.base_url, max_retries=2)))
    assert isinstance(err, PermanentError)
    assert (err.kind, err.status, err.attempts) == ('server', 503, 3)
    assert (c.calls, c.retries, c.errors, c.failures) == (3, 2, 3, 1)


def test_run_finishes_under_random_faults_and_counters_add_up(fault_proxy):
    probs = {'429': 0.15, '500': 0.15, 'drop': 0.1, 'malformed': 0.1}
    proxy = fault_proxy(probabilities=probs, retry_after=0.1, seed=3)
    n = 12
    out, c = run(calls(pool_at(proxy.base_url, max_retries=10), n=n))
    errors = [o for o in out if isinstance(o, BaseException)]
    assert not errors, errors
    actions = Counter(a for _, a in proxy.log)
    injected = sum(v for a, v in actions.items() if a != 'pass')
    assert injected > 0                              # the faults really happened
    assert actions['pass'] == n and c.completed == n
    assert c.calls == len(proxy.log) == n + injected
    assert c.errors == c.retries == injected and c.failures == 0
    assert c.by_kind == {KIND_OF_ACTION[a]: v for a, v in actions.items() if a != 'pass'}
    assert sum(o.attempts for o in out) == c.calls
    assert c.spend_usd == pytest.approx(sum(o.cost_usd for o in out))
    assert c.prompt_tokens == sum(o.prompt_tokens for o in out)


def test_answer_without_final_line_arrives_as_text(fault_proxy):
    proxy = fault_proxy(plan=['no_answer'])
    (done,), c = run(calls(pool_at(proxy.base_url)))
    assert 'final answer' not in done.text.lower() and c.completed == 1


def test_unreachable_endpoint_gives_up_with_a_connection_error():
    pool = pool_at(f'http://127.0.0.1:{free_port()}/v1', max_retries=2)
    t = time.perf_counter()
    (err,), c = run(calls(pool))
    assert isinstance(err, PermanentError) and err.kind == 'connection' and err.attempts == 3
    assert time.perf_counter() - t < 10


def test_call_budget_stops_cleanly(llama_server):
    out, c = run(calls(pool_at(llama_server, call_budget=3), n=5))
    kinds = sorted(type(o).__name__ for o in out)
    assert kinds == ['BudgetExceeded'] * 2 + ['Completion'] * 3
    assert c.calls == 3 and c.completed == 3


def test_spend_cap_is_never_passed(llama_server):
    spec = pool_at(llama_server).models[MODEL]
    worst = spec.cost(estimate_prompt_tokens(MESSAGES), MAX_TOKENS)   # what the client reserves per call
    out, c = run(calls(pool_at(llama_server, spend_cap_usd=2.5 * worst), n=6))
    done = [o for o in out if not isinstance(o, BaseException)]
    assert all(isinstance(o, BudgetExceeded) for o in out if isinstance(o, BaseException))
    assert 1 <= len(done) < 6 and c.spend_usd <= 2.5 * worst


def test_api_key_is_sent_but_never_logged_or_kept(fault_proxy, monkeypatch, caplog):
    import logging
    secret = 'sk-test-0123456789-secret'
    monkeypatch.setenv('DARS_TEST_API_KEY', secret)
    proxy = fault_proxy(plan=['429'], retry_after=0.1)
    m = LOCAL_MODELS[MODEL]
    pool = Pool({MODEL: ModelSpec(MODEL, proxy.base_url, api_key_env='DARS_TEST_API_KEY', price_in=m.price_in,
                                  price_out=m.price_out)}, limits=Limits(backoff_s=0.05))
    caplog.set_level(logging.DEBUG)                 # openai, httpx2 and our own loggers at their most verbose
    async def one():
        async with Client(pool) as client:
            done = await client.complete(MODEL, MESSAGES, max_tokens=MAX_TOKENS)
            return done, repr(client) + repr(vars(client)) + repr(pool) + repr(pool.to_dict()) + repr(done)
    done, reprs = run(one())
    assert proxy.auth == [f'Bearer {secret}'] * 2   # sent with the first request and with the retry
    assert secret not in caplog.text and secret not in reprs


def test_an_endpoint_that_echoes_the_key_never_gets_it_printed(monkeypatch, capsys):
    import traceback
    from dars_nb.testing import KeyEchoEndpoint
    secret = 'sk-echo-0123456789-secret'
    monkeypatch.setenv('DARS_TEST_API_KEY', secret)
    with KeyEchoEndpoint() as echo:
        pool = Pool({'e': ModelSpec('e', echo.base_url, api_key_env='DARS_TEST_API_KEY')}, limits=Limits(backoff_s=0.01))
        async def one():
            async with Client(pool) as client:
                with pytest.raises(PermanentError) as e: await client.complete('e', MESSAGES, max_tokens=4)
                return e.value
        err = run(one())
    printed = ''.join(traceback.format_exception(err)) + repr(err) + str(err.args)
    assert (err.status, err.attempts) == (401, 1)
    assert secret not in printed and 'Bearer ***' in str(err), printed
    assert secret not in capsys.readouterr().err


def test_cap_holds_across_three_runs_sharing_a_ledger(llama_server):
    from dars_nb.collect.client import MemoryLedger
    spec = pool_at(llama_server).models[MODEL]
    worst = spec.cost(estimate_prompt_tokens(MESSAGES), MAX_TOKENS)
    # the reservation is an upper bound (a token per byte sent) and a short answer costs far less, so a cap of
    # 2.5 worst cases admits at most two requests in flight at a time
    pool, ledger, stops = pool_at(llama_server, spend_cap_usd=2.5 * worst), MemoryLedger(), []
    for _ in range(3):
        async def one():
            async with Client(pool, ledger=ledger) as client:
                await asyncio.gather(*[client.complete(MODEL, MESSAGES, max_tokens=MAX_TOKENS) for _ in range(3)],
                                     return_exceptions=True)
            return client.stopped
        stops.append(run(one()))
    _, dollars = ledger.spent()
    assert dollars <= 2.5 * worst                            # a request is sent only if its worst case still fits
    assert all(e['status'] in ('ok', 'failed', 'lost') for e in ledger.entries)
    # a run whose calls settle before its third reserves may finish under the cap; the last run cannot
    assert stops[-1] and all('raise [limits] spend_cap_usd in the pool configuration' in s for s in stops if s)
    assert 'again' not in stops[-1]


def test_every_attempt_is_reserved_then_settled(fault_proxy):
    from dars_nb.collect.client import MemoryLedger
    proxy = fault_proxy(plan=['429', 'drop', 'slow'], retry_after=0.05, slow_s=30)
    ledger = MemoryLedger()
    async def one():
        async with Client(pool_at(proxy.base_url, timeout_s=2.0), ledger=ledger) as client:
            return await client.complete(MODEL, MESSAGES, max_tokens=MAX_TOKENS, purpose='rewrite')
    done = run(one())
    statuses = [(e['kind'], e['status']) for e in ledger.entries]
    assert statuses == [('rewrite', 'failed'), ('rewrite', 'lost'), ('rewrite', 'lost'), ('rewrite', 'ok')]
    worst = ledger.entries[0]['max_usd']
    assert [e['cost_usd'] for e in ledger.entries[:3]] == [0.0, worst, worst]   # lost: charged at the reserved max
    assert ledger.spent() == (4, pytest.approx(2 * worst + done.cost_usd))


def test_a_ledger_of_ones_own_is_used_as_it_is(llama_server):
    class Ledger:   # what a store provides: spent / reserve / settle
        def __init__(self, before): self.rows, self.before = [], before
        def spent(self):
            return self.before[0] + len(self.rows), self.before[1] + sum(r[2] if r[3] is None else r[3] for r in self.rows)
        def reserve(self, model, kind, max_usd):
            self.rows.append([model, kind, max_usd, None, None]); return len(self.rows) - 1
        def settle(self, entry, cost_usd, status): self.rows[entry][3:] = [cost_usd, status]
    ledger = Ledger(before=(9, 0.0))                            # nine requests of earlier runs
    out, c = run(calls(pool_at(llama_server, call_budget=10), n=2, ledger=ledger))
    assert sorted(type(o).__name__ for o in out) == ['BudgetExceeded', 'Completion']
    assert len(ledger.rows) == 1 and ledger.rows[0][4] == 'ok' and ledger.rows[0][1] == 'generation'
    assert 'raise [limits] call_budget' in str(next(o for o in out if isinstance(o, BudgetExceeded)))


def test_base_url_without_v1_says_so(llama_server):
    pool = Pool({'smollm2': ModelSpec('smollm2', llama_server.removesuffix('/v1'))}, limits=Limits(backoff_s=0.05))
    (err,), c = run(calls(pool))
    assert isinstance(err, PermanentError) and err.status == 404, err
    assert str(err).endswith(f'(try base_url = "{llama_server}")'), str(err)


def test_tokens_per_minute_are_taken_at_their_worst_case():
    from dars_nb.testing import FixedEndpoint
    with FixedEndpoint(delay_s=0) as ep:
        pool = Pool({'m': ModelSpec('m', ep.base_url, tpm=1000, rpm=100)})
        async def two():
            async with Client(pool) as client:
                for _ in range(2): await client.complete('m', MESSAGES, max_tokens=MAX_TOKENS)
                _, _, rpm, tpm = client._lane(client._specs['m'])
                return rpm.level, tpm.level
        rpm_left, tpm_left = run(two())
    worst = estimate_prompt_tokens(MESSAGES) + MAX_TOKENS
    assert 98 <= rpm_left < 99.5                         # two requests taken (plus what refilled meanwhile)
    assert 1000 - 2 * worst <= tpm_left < 1000 - 1.5 * worst
