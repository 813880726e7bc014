"""`dars serve --workers 2`: two processes on one port share one daily spend ledger — the limit's guarantee holds over
both against upstreams that report more usage than was held for them — their counts are summed in /metrics and in the
Prometheus text, and a stop signal stops both gracefully. And runs one after another share it too: a run killed with
attempts in flight leaves them to be charged by the next, which starts from the day's spend."""
import os
import signal
import subprocess
import sys
import time

import httpx2
import pytest

from dars_nb.pool.server import free_port
from test_serve import bundle_file  # noqa: F401  (the saved TF-IDF + kNN bundle `dars serve` routes with)
from test_serve_boundaries import LIE_IN, LIE_OUT, ONE_ANSWER, USER, LyingEndpoint, burst, stream_burst

# one worker runs them, one after another: each starts three processes of about 140 MB (the supervisor and two workers)
pytestmark = pytest.mark.xdist_group('serve_workers')


def start_workers(bundle_file, pool_file, port, *options, workers=2):
    "`dars serve --workers 2` (or `workers`) on `port`, once its workers answer /health; the process."
    cmd = [sys.executable, '-m', 'dars_nb', 'serve', '--router', str(bundle_file), '--pool', str(pool_file),
           '--port', str(port), '--workers', str(workers), *options]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate(timeout=30)
        try:
            if httpx2.get(f'http://127.0.0.1:{port}/health', timeout=2).status_code == 200: return proc
        except httpx2.HTTPError: pass
        assert time.monotonic() < deadline, f'dars serve --workers {workers} did not answer within 120 s'
        time.sleep(0.2)


def children(pid: int) -> list:
    "The processes whose parent is `pid` (Linux /proc)."
    out = []
    for d in filter(str.isdigit, os.listdir('/proc')):
        try: stat = open(f'/proc/{d}/stat').read()
        except OSError: continue
        if int(stat.rsplit(')', 1)[1].split()[1]) == pid: out.append(int(d))
    return out


def alive(pid: int) -> bool:
    "Whether process `pid` runs (exists and is not a zombie)."
    try: return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError: return False


def stop(proc) -> tuple:
    "SIGTERM, then (exit code, stdout, stderr) once it has stopped."
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def counts_once_settled(url, n_workers=2, timeout_s=30):
    "/metrics once nothing is held and both workers have posted their counts of every request."
    deadline = time.monotonic() + timeout_s
    while True:
        m = httpx2.get(url + '/metrics', timeout=10).json()
        if (m['in_flight_reserved_usd'] == 0 and len(m['workers']) == n_workers) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize('limit', [0.01, 0.3])
@pytest.mark.parametrize('mode', ['plain', 'streamed'])
def test_two_workers_keep_the_daily_limit_against_an_upstream_reporting_100k_prompt_tokens(bundle_file, tmp_path, mode,
                                                                                        limit):
    from dars_nb.bundle import load_bundle
    models = load_bundle(bundle_file).models
    with LyingEndpoint(lambda i: 100_000, delay_s=0.1) as up:
        pool_file = tmp_path / 'pool.toml'
        pool_file.write_text(''.join(f'[models."{m}"]\nbase_url = "{up.base_url}"\nprice_in = {LIE_IN}\n'
                                     f'price_out = {LIE_OUT}\nconcurrency = 200\n' for m in models))
        port = free_port()
        proc = start_workers(bundle_file, pool_file, port, '--daily-spend-usd', str(limit), '--quiet')
        try:
            url = f'http://127.0.0.1:{port}'
            if mode == 'plain': codes = [r.status_code for r in burst(url + '/v1', [{'messages': USER}] * 200)]
            else: codes = stream_burst(url + '/v1', 200, {'messages': USER, 'stream': True}, hang_up=lambda i: False)
            time.sleep(1.0)   # each worker posts its counts every half second
            m = counts_once_settled(url)
            scraped = httpx2.get(url + '/metrics', headers={'accept': 'text/plain;version=0.0.4'}, timeout=10).text
        finally:
            code, out, err = stop(proc)
    spent, over = m['spend_today_usd'], m['over_reserved_today_usd']
    answered = sum(c['answered'] for c in m['models'].values())
    lost = sum(c['lost'] for c in m['models'].values())
    assert set(codes) <= {200, 429} and 200 in codes, codes
    assert spent <= limit + over + 1e-12                      # the guarantee, over both workers
    assert spent <= limit + len(models) * ONE_ANSWER, spent   # at most one overbilling answer per model
    assert m['in_flight_reserved_usd'] == 0 and answered + lost == up.requests == codes.count(200)
    assert sorted(w['requests'] > 0 for w in m['workers']) == [True, True]   # both workers served
    assert m['requests'] == sum(w['requests'] for w in m['workers']) == 200
    assert f'dars_requests_total 200' in scraped and 'dars_workers 2' in scraped
    assert 'dars_request_duration_seconds_count 200' in scraped
    assert code == 0, err[-800:]
    if limit == 0.01: assert codes.count(200) <= len(models)   # a first answer per model at most: then no room


@pytest.mark.timeout(180)
def test_a_stop_signal_lets_both_workers_finish_their_requests_in_flight(bundle_file, tmp_path):
    from dars_nb.bundle import load_bundle
    from dars_nb.testing import FixedEndpoint
    models = load_bundle(bundle_file).models
    with FixedEndpoint('slow but sure', delay_s=1.5) as up:
        pool_file = tmp_path / 'pool.toml'
        pool_file.write_text(''.join(f'[models."{m}"]\nbase_url = "{up.base_url}"\nconcurrency = 50\n' for m in models))
        port = free_port()
        proc = start_workers(bundle_file, pool_file, port)
        import threading
        answers = []
        sender = threading.Thread(target=lambda: answers.extend(
            burst(f'http://127.0.0.1:{port}/v1', [{'messages': USER}] * 20)))
        sender.start()
        time.sleep(0.8)   # the requests are in flight upstream
        workers = children(proc.pid)
        code, out, err = stop(proc)
        sender.join(60)
    assert code == 0, err[-800:]
    assert [r.status_code for r in answers] == [200] * 20
    assert '2 worker processes, one spend ledger' in out and f'127.0.0.1:{port}/metrics' in out
    deadline = time.monotonic() + 10   # multiprocessing's resource tracker ends a moment after its parent
    while any(map(alive, workers)) and time.monotonic() < deadline: time.sleep(0.1)
    assert len(workers) >= 2 and not any(map(alive, workers)), [p for p in workers if alive(p)]


@pytest.mark.timeout(300)
def test_a_restart_keeps_the_days_spend_and_charges_what_a_killed_run_left_in_flight(bundle_file, tmp_path):
    import threading
    from dars_nb.testing import FixedEndpoint
    from dars_nb.serve.ledger import spend_ledger_path
    from dars_nb.bundle import load_bundle
    models = load_bundle(bundle_file).models
    with FixedEndpoint('slow but sure', delay_s=1.0) as up:
        pool_file = tmp_path / 'pool.toml'
        pool_file.write_text(''.join(f'[models."{m}"]\nbase_url = "{up.base_url}"\nprice_in = 2.0\nprice_out = 4.0\n'
                                     f'concurrency = 50\n' for m in models))
        url, limit = f'http://127.0.0.1:{free_port()}', '5.0'
        proc = start_workers(bundle_file, pool_file, url.rsplit(':', 1)[1], '--daily-spend-usd', limit, '--quiet',
                             workers=1)
        try:
            assert [r.status_code for r in burst(url + '/v1', [{'messages': USER}] * 3)] == [200] * 3
            spent = httpx2.get(url + '/metrics', timeout=10).json()['spend_today_usd']
            lost = []   # the two requests in flight when the run is killed: their clients are hung up on
            def send_two():
                try: burst(url + '/v1', [{'messages': USER}] * 2)
                except httpx2.HTTPError as e: lost.append(e)
            sender = threading.Thread(target=send_two, daemon=True)
            sender.start()
            deadline = time.monotonic() + 10
            while (m := httpx2.get(url + '/metrics', timeout=10).json())['in_flight_reserved_usd'] == 0:
                assert time.monotonic() < deadline, 'the two requests were never in flight'
                time.sleep(0.05)
            while up.in_flight < 2 and time.monotonic() < deadline: time.sleep(0.02)
            reached = up.in_flight   # both sent on: each holds its reservation until its answer
            held = httpx2.get(url + '/metrics', timeout=10).json()['in_flight_reserved_usd']
        finally:
            proc.kill(); proc.communicate(timeout=30)   # a crash: nothing settled, nothing said
        sender.join(30)
        assert spent > 0 and held > 0 and reached == 2 and len(lost) == 1   # gather stops at the first hang-up
        assert spend_ledger_path(pool_file).exists()   # the pool file's own ledger, in the state folder

        proc = start_workers(bundle_file, pool_file, url.rsplit(':', 1)[1], '--daily-spend-usd', limit, '--quiet',
                             workers=1)
        try: now = httpx2.get(url + '/metrics', timeout=10).json()
        finally: code, out, err = stop(proc)
        assert code == 0 and '2 attempt(s) were in flight' in err, err[-800:]
        assert abs(now['spend_today_usd'] - (spent + held)) <= 1e-12 and now['in_flight_reserved_usd'] == 0

        # the day's spend counts against the limit of the next run: under one more attempt's hold, nothing is sent
        sent = up.requests
        proc = start_workers(bundle_file, pool_file, url.rsplit(':', 1)[1], '--daily-spend-usd',
                             repr(now['spend_today_usd'] + held / 4), '--quiet', workers=1)
        try: codes = [r.status_code for r in burst(url + '/v1', [{'messages': USER}] * 3)]
        finally: stop(proc)
    assert codes == [429] * 3 and up.requests == sent


@pytest.mark.timeout(60)
def test_a_start_whose_spend_ledger_another_process_keeps_locked_stops_with_one_line_and_no_hang(bundle_file, tmp_path):
    from dars_nb.bundle import load_bundle
    from dars_nb.serve.ledger import LOCK_WAIT_S
    pool_file = tmp_path / 'pool.toml'
    pool_file.write_text(''.join(f'[models."{m}"]\nbase_url = "http://127.0.0.1:9/v1"\n'
                                 for m in load_bundle(bundle_file).models))
    ledger = tmp_path / 'spend.ledger'
    holder = subprocess.Popen([sys.executable, '-c', 'import fcntl, os, sys, time\n'
                               f'fd = os.open({str(ledger) + ".lock"!r}, os.O_RDWR | os.O_CREAT)\n'
                               'fcntl.flock(fd, fcntl.LOCK_EX); print("locked", flush=True); time.sleep(120)'],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == 'locked\n'
        run = subprocess.run([sys.executable, '-m', 'dars_nb', 'serve', '--router', str(bundle_file), '--pool',
                              str(pool_file), '--port', str(free_port()), '--daily-spend-usd', '1', '--ledger',
                              str(ledger)], capture_output=True, text=True, timeout=LOCK_WAIT_S + 40)
    finally: holder.kill(); holder.wait()
    assert run.returncode != 0 and 'Traceback' not in run.stderr, run.stderr[-800:]
    assert f'is locked by another process for over {LOCK_WAIT_S:g} s' in run.stderr.strip().splitlines()[-1]


def statuses(url, n):
    "Send `n` requests at once; each one's status code, or the name of the error its connection ended with."
    import asyncio
    async def go():
        limits = httpx2.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx2.AsyncClient(timeout=120, limits=limits) as c:
            return await asyncio.gather(*[c.post(url + '/v1/chat/completions', json={'messages': USER})
                                          for _ in range(n)], return_exceptions=True)
    return [getattr(r, 'status_code', type(r).__name__) for r in asyncio.run(go())]


@pytest.mark.timeout(60)
def test_a_worker_killed_mid_flight_is_said_and_the_next_run_charges_its_attempts_each_answer_once(bundle_file, tmp_path):
    import threading
    from dars_nb.bundle import load_bundle
    from dars_nb.testing import FixedEndpoint
    models, ledger = load_bundle(bundle_file).models, tmp_path / 'spend.ledger'
    with FixedEndpoint('slow but sure', delay_s=2.0) as up:
        pool_file = tmp_path / 'pool.toml'
        pool_file.write_text(''.join(f'[models."{m}"]\nbase_url = "{up.base_url}"\nprice_in = 2.0\nprice_out = 4.0\n'
                                     f'concurrency = 50\n' for m in models))
        port = free_port()
        url, options = f'http://127.0.0.1:{port}', ('--daily-spend-usd', '5.0', '--ledger', str(ledger), '--quiet')
        proc = start_workers(bundle_file, pool_file, port, *options)
        codes = []
        try:
            assert statuses(url, 4) == [200] * 4   # reports of usage: the model's attempts need no longer go one at a time
            sender = threading.Thread(target=lambda: codes.extend(statuses(url, 12)), daemon=True)
            sender.start()
            deadline = time.monotonic() + 20
            while up.in_flight < 12: assert time.monotonic() < deadline, up.in_flight; time.sleep(0.02)
            killed = [p for p in children(proc.pid) if b'spawn_main' in open(f'/proc/{p}/cmdline', 'rb').read()][0]
            os.kill(killed, signal.SIGKILL)
            _, err = proc.communicate(timeout=40)
            sender.join(30)
        finally:
            if proc.poll() is None: proc.kill(); proc.communicate()
        assert proc.returncode == 1 and f'worker {killed} was killed (SIGKILL): stopping the others' in err, err[-800:]
        lines = [line.split() for line in ledger.read_text().splitlines()]
        settled = {int(f[2]) for f in lines if f[0] == 'S'}
        orphans = [f for f in lines if f[0] == 'R' and f[3].startswith(f'{killed}:') and int(f[2]) not in settled]
        proc = start_workers(bundle_file, pool_file, port, *options, workers=1)
        try: now = httpx2.get(url + '/metrics', timeout=10).json()
        finally: code, _, err = stop(proc)
    answered, cost = codes.count(200), (10 * 2.0 + 5 * 4.0) / 1e6   # FixedEndpoint reports 10 + 5 tokens
    assert len(codes) == 12 and 0 < answered < 12 and len(orphans) == 12 - answered == up.requests - 4 - answered, codes
    assert len(settled) == answered + 4   # each answer charged once, by the worker that gave it
    answered += 4
    assert f'{len(orphans)} attempt(s) were in flight' in err, err[-800:]
    held = sum(float(f[5]) for f in orphans)
    assert abs(now['spend_today_usd'] - (answered * cost + held)) <= 1e-12 and now['in_flight_reserved_usd'] == 0
