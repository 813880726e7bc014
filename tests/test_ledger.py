"""Money you can trust, against real local models: the spend ledger across kills and runs, one writer per store, SIGTERM.

Uses the fixtures of conftest.py (`local_server`, `fault_proxy`). Every chat request goes through a FaultProxy that
only passes requests on, so `proxy.log` counts what the endpoint was really asked — independent of the ledger under test.
"""
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path


from dars_nb.collect.command import EXIT_BUDGET
from dars_nb.collect.config import load_config
from dars_nb.collect.plan import plan_calls
from dars_nb.collect.store import Store
from dars_nb.testing import forced_test_flags
from test_collect import pool_toml, collection_toml, MMLU

RUNNER = 'import sys; from dars_nb.collect.command import collect_main; sys.exit(collect_main(sys.argv[1], quiet=True))'
ENV = {**os.environ, 'PYTHONUNBUFFERED': '1'}


def counts(db: Path) -> dict:
    "What a store holds right now, read without taking any lock (the writer may be running)."
    if not db.exists(): return dict(ledger=0, open=0, ok_generation=0, ok_rewrite=0, observations=0, answers=0)
    try:
        with sqlite3.connect(f'file:{db}?mode=ro', uri=True, timeout=5) as c:
            q = lambda sql: c.execute(sql).fetchone()[0]
            return dict(ledger=q('SELECT COUNT(*) FROM ledger'), open=q("SELECT COUNT(*) FROM ledger WHERE status = 'open'"),
                        ok_generation=q("SELECT COUNT(*) FROM ledger WHERE status = 'ok' AND kind = 'generation'"),
                        ok_rewrite=q("SELECT COUNT(*) FROM ledger WHERE status = 'ok' AND kind = 'rewrite'"),
                        observations=q('SELECT COUNT(*) FROM observations'), answers=q('SELECT COUNT(*) FROM rewriter_answers'))
    except sqlite3.OperationalError:            # the tables are not created yet
        return dict(ledger=0, open=0, ok_generation=0, ok_rewrite=0, observations=0, answers=0)


def start(cfg: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, '-c', RUNNER, str(cfg)], env=ENV, stdout=open(log, 'wb'),
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(proc, db: Path, ready, timeout=240) -> dict:
    "Poll the store until `ready(counts)` holds; fail if the collector ends first."
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, 'the collector ended before the moment it was to be stopped at'
        c = counts(db)
        if ready(c): return c
        time.sleep(0.02)
    raise AssertionError('the moment to stop the collector never came')


def in_flight(c: dict) -> int:
    "Requests whose answer is not (yet) stored: reserved and open, or settled but not yet written."
    return c['open'] + max(0, c['ok_generation'] - c['observations']) + max(0, c['ok_rewrite'] - c['answers'])


def config(tmp_path, url, attempts=2, limits='timeout_s = 300\nbackoff_s = 0.05', train=2, test=1) -> Path:
    cfg = tmp_path / 'collect.toml'
    cfg.write_text(pool_toml({'a': (url, 0.02, 0.04, 'smollm2', 1), 'b': (url, 0.05, 0.10, 'smollm2', 1)}, rewriter='a',
                             limits=limits)
                   + collection_toml(attempts=attempts, tr=2, td=2) + MMLU.format(train=train, test=test))
    return cfg


# ---------------------------------------------------------------------------------------------------------------
# kill -9 at five moments, two of them in the rewriter phase: nothing paid for is bought again, beyond what was in flight

MOMENTS = [('first request reserved', lambda c: c['ledger'] >= 1),
           ('rewriter phase, answers stored', lambda c: c['answers'] >= 2),
           ('rewriter phase, later', lambda c: c['answers'] >= 4 or c['observations'] >= 1),
           ('observations, early', lambda c: c['observations'] >= 4),
           ('observations, late', lambda c: c['observations'] >= 14)]


def test_kills_mid_run_rebuy_at_most_what_was_in_flight(fault_proxy, tmp_path):
    proxy = fault_proxy()                                  # passes everything on, and counts it
    cfg = config(tmp_path, proxy.base_url, attempts=3, train=3)
    db = tmp_path / 'store.sqlite'
    plan = plan_calls(load_config(cfg))
    flying, opens = [], []
    # make test kills at the first and the last moment; DARS_TEST_FLAGS=slow at all five
    moments = MOMENTS if 'slow' in forced_test_flags() else [MOMENTS[0], MOMENTS[-1]]
    for i, (moment, ready) in enumerate(moments):
        proc = start(cfg, tmp_path / f'run{i}.log')
        try: wait_for(proc, db, ready)
        finally:
            os.kill(proc.pid, signal.SIGKILL); proc.wait()
        c = counts(db)
        flying.append(in_flight(c)); opens.append(c['open'])
        assert c['open'] <= 2, (moment, c)                   # two models of concurrency 1 share the endpoint
    done = subprocess.run([sys.executable, '-c', RUNNER, str(cfg)], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-1000:]
    end = counts(db)
    assert end['observations'] == len(plan) and end['open'] == 0
    # every request the endpoint saw produced a stored answer, except those in flight at a kill
    sent = len(proxy.log)
    rebought = sent - end['observations'] - end['answers']
    assert 0 <= rebought <= sum(flying), (sent, end, flying)
    # and every request sent was in the ledger first (a killed reservation may not have been sent)
    assert end['ledger'] >= sent
    with Store(db) as s:
        t = s.ledger().totals()
    # the reservations open at the kills are settled 'lost' at their maximum by the next run, and nothing else is
    assert int(t['open'].sum()) == 0 and int(t['lost'].sum()) == sum(opens), (t, opens)


# ---------------------------------------------------------------------------------------------------------------
# two writers on one store

def test_a_second_writer_is_refused_with_the_holder_named(local_server, tmp_path):
    cfg = config(tmp_path, local_server.base_url)
    db = tmp_path / 'store.sqlite'
    first = start(cfg, tmp_path / 'first.log')
    try:
        wait_for(first, db, lambda c: c['ledger'] >= 1)
        second = subprocess.run([sys.executable, '-c', RUNNER, str(cfg)], env=ENV, capture_output=True, text=True, timeout=120)
        before = counts(db)['ledger']
    finally:
        os.kill(first.pid, signal.SIGKILL); first.wait()
    assert second.returncode == 1
    err = second.stderr
    assert err.count('\n') == 1 and 'Traceback' not in err, err
    assert err.startswith(f'dars collect: error: store {db} is being written by dars collect (pid {first.pid} on '), err
    assert 'started 20' in err
    # the refused run asked for nothing: every ledger entry is the first run's (it was killed, so at most its own)
    assert counts(db)['ledger'] == before
    # the lock died with its holder: a new run gets it at once and finishes the work
    done = subprocess.run([sys.executable, '-c', RUNNER, str(cfg)], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-1000:]


# ---------------------------------------------------------------------------------------------------------------
# the spend cap and the call budget are the store's, across runs

def test_spend_cap_holds_across_three_runs(fault_proxy, tmp_path):
    proxy = fault_proxy()
    cap = 4e-5
    cfg = config(tmp_path, proxy.base_url, limits=f'timeout_s = 300\nbackoff_s = 0.05\nspend_cap_usd = {cap}')
    db = tmp_path / 'store.sqlite'
    results = [subprocess.run([sys.executable, '-c', RUNNER, str(cfg)], env=ENV, capture_output=True, text=True, timeout=600)
               for _ in range(3)]
    sent = [len(proxy.log)]
    assert [r.returncode for r in results] == [EXIT_BUDGET] * 3, [r.stderr for r in results]
    for r in results:
        assert r.stderr.count('\n') == 1 and 'spend cap of $0.00004 reached' in r.stderr, r.stderr
        assert f'raise [limits] spend_cap_usd in {cfg}' in r.stderr and 'again' not in r.stderr, r.stderr
    with Store(db) as s:
        n, usd = s.ledger().spent()
        worst = s._q('SELECT MAX(max_usd) FROM ledger')[0][0]
    assert n == sent[0] and n > 0                            # the second and third runs sent nothing
    assert usd <= cap + worst, (usd, cap, worst)


def test_call_budget_holds_across_runs(fault_proxy, tmp_path):
    proxy = fault_proxy()
    cfg = config(tmp_path, proxy.base_url, limits='timeout_s = 300\nbackoff_s = 0.05\ncall_budget = 5')
    for _ in range(2):
        r = subprocess.run([sys.executable, '-c', RUNNER, str(cfg)], env=ENV, capture_output=True, text=True, timeout=600)
        assert r.returncode == EXIT_BUDGET, r.stderr
        assert 'call budget of 5 requests reached' in r.stderr and 'raise [limits] call_budget in' in r.stderr, r.stderr
    assert len(proxy.log) == 5
    with Store(tmp_path / 'store.sqlite') as s: assert s.ledger().spent()[0] == 5


# ---------------------------------------------------------------------------------------------------------------
# SIGTERM ends a run like Ctrl-C: one line, exit 130, resumable

def test_sigterm_is_a_clean_resumable_stop(local_server, tmp_path):
    cfg = config(tmp_path, local_server.base_url)
    db = tmp_path / 'store.sqlite'
    proc = subprocess.Popen([sys.executable, '-c', RUNNER, str(cfg)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try: wait_for(proc, db, lambda c: c['observations'] >= 2)
    finally: proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.startswith('dars collect: interrupted: ') and err.count('\n') == 1 and 'Traceback' not in err, err
    c = counts(db)
    assert c['open'] == 0                                    # the request in flight was settled as lost on the way out
    with sqlite3.connect(db) as con: assert con.execute('PRAGMA integrity_check').fetchone()[0] == 'ok'
    done = subprocess.run([sys.executable, '-c', RUNNER, str(cfg)], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-1000:]
    # `dars status`: the plan of the last run against what is stored, and the ledger of both runs
    st = subprocess.run([sys.executable, '-c', f'import sys; from dars_nb.collect.store import status_main; sys.exit(status_main({str(db)!r}))'],
                        env=ENV, capture_output=True, text=True, timeout=120)
    assert st.returncode == 0, st.stderr
    assert 'last run: complete' in st.stdout and '| mmlu | a |' in st.stdout and 'spend ledger (all runs)' in st.stdout, st.stdout


# ---------------------------------------------------------------------------------------------------------------
# the dry run is an upper bound of what a run sends and spends, rewriter rounds included

def test_the_dry_run_bounds_what_a_run_sends_and_spends(local_server, tmp_path, capsys):
    import re
    from dars_nb.collect.command import collect_main, EXIT_OK
    cfg = config(tmp_path, local_server.base_url, attempts=3)     # up to three rewriter rounds per query
    assert collect_main(str(cfg), dry_run=True) == EXIT_OK
    total = re.search(r'total: at most (\d+) calls to make \(retries not counted\), at most \$([\d.,]+)',
                      capsys.readouterr().out)
    calls, dollars = int(total[1]), float(total[2].replace(',', ''))
    assert collect_main(str(cfg), quiet=True) == EXIT_OK
    with Store(tmp_path / 'store.sqlite') as s: t = s.ledger().totals()
    # no fault on this endpoint, so every request is a first attempt; the printed maximum has three
    # significant digits, so it may be up to 0.5 % below the exact one
    assert int(t['requests'].sum()) == int(t['ok'].sum()) <= calls, (t, calls)
    assert float(t['usd'].sum()) <= dollars * 1.005, (t, dollars)
    assert t.loc['rewrite', 'requests'].sum() >= 1


# ---------------------------------------------------------------------------------------------------------------
# the dry run's bound holds for prompts a tokenizer splits finely: the spend cap it calls enough does not stop the run

def test_the_dry_run_bound_holds_where_four_characters_a_token_undercounts(local_server, tmp_path, capsys):
    import json
    import re
    from dars_nb.collect.command import collect_main, EXIT_OK
    # SmolLM2 gives each digit a token of its own: these prompts take about twice the typical estimate
    (tmp_path / 'digits.jsonl').write_text(''.join(
        json.dumps(dict(query_id=f'q{i}', kind='math', gold='1',
                        question='Add: ' + ' + '.join(str(10**15 + 7919 * i * k) for k in range(1, 12)))) + '\n'
        for i in range(2)))
    cfg = tmp_path / 'collect.toml'
    def write(decodes, limits='timeout_s = 300\nbackoff_s = 0.05'):
        cfg.write_text(pool_toml({'a': (local_server.base_url, 0.02, 0.04, 'smollm2', 1)}, rewriter='a', limits=limits)
                       + collection_toml(td=decodes, tr=0)
                       + '[[datasets]]\nname = "digits"\npath = "digits.jsonl"\ntrain = 0\ntest = 2\n')
    write(decodes=1)
    assert collect_main(str(cfg), quiet=True) == EXIT_OK
    with Store(tmp_path / 'store.sqlite') as s: before = s.ledger().spent()[1]
    # more decodes of the same prompts: no rewriter round is left to pad the total
    write(decodes=3)
    assert collect_main(str(cfg), dry_run=True) == EXIT_OK
    most = float(re.search(r'at most \d+ calls to make \(retries not counted\), at most \$([\d.,]*\d)',
                           capsys.readouterr().out)[1].replace(',', ''))
    cap = before + most * 1.01                          # the printed bound has three significant digits
    write(decodes=3, limits=f'timeout_s = 300\nbackoff_s = 0.05\nspend_cap_usd = {cap}')
    assert collect_main(str(cfg), dry_run=True) == EXIT_OK
    assert 'spend_cap_usd' in (dry := capsys.readouterr().out) and 'enough for the whole plan' in dry, dry
    assert collect_main(str(cfg), quiet=True) == EXIT_OK, capsys.readouterr().err
    with Store(tmp_path / 'store.sqlite') as s: after = s.ledger().spent()[1]
    assert after - before <= most * 1.005, (after - before, most)
