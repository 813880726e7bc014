"""Client throughput: N chat completions at concurrency C against a loopback endpoint that answers after 50 ms.

Run: .venv/bin/python bench/bench_client.py [--calls 2000] [--concurrency 32] [--delay 0.05] [--reps 3]
The endpoint (`dars_nb.testing.FixedEndpoint`) runs in its own process, so the client and the
server do not share an interpreter. Ideal wall time = calls x delay / concurrency; the goal is a
measured/ideal ratio of at most 1.3. Each repetition is a fresh `Client` (connections included);
the median is reported with every run.
"""
import argparse, asyncio, multiprocessing as mp, os, statistics, sys, time, urllib.request

from dars_nb.collect.client import Client
from dars_nb.pool.models import Limits, ModelSpec, Pool
from dars_nb.pool.server import free_port
from dars_nb.testing import FixedEndpoint

from summary import emit

MESSAGES = [{'role': 'system', 'content': "Answer briefly. End with a line 'Final Answer: <answer>'."},
            {'role': 'user', 'content': 'Which planet is known as the Red Planet?\nA) Venus\nB) Mars\nC) Jupiter\nD) Saturn'}]


def serve(port, delay):
    FixedEndpoint(text='Mars is red.\nFinal Answer: B', delay_s=delay, port=port).serve_forever()


def run_queue_wait():
    "Seconds this process has spent runnable but waiting for a CPU (Linux schedstat; None elsewhere)."
    try:
        with open('/proc/self/schedstat') as f: return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError): return None


async def one_run(base_url, calls, concurrency):
    pool = Pool({'bench': ModelSpec('bench', base_url, price_in=0.15, price_out=0.6, concurrency=concurrency)},
                limits=Limits(timeout_s=30, max_retries=0))
    t, cpu, waited = time.perf_counter(), time.process_time(), run_queue_wait()
    async with Client(pool) as client:
        out = await asyncio.gather(*[client.complete('bench', MESSAGES, max_tokens=16) for _ in range(calls)])
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    waited = None if waited is None else run_queue_wait() - waited
    c = client.counters
    assert c.completed == calls == len(out) and c.failures == 0 and c.retries == 0
    return wall, cpu, waited


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--calls', type=int, default=2000)
    ap.add_argument('--concurrency', type=int, default=32)
    ap.add_argument('--delay', type=float, default=0.05)
    ap.add_argument('--reps', type=int, default=3)
    a = ap.parse_args(argv)
    port = free_port()
    server = mp.get_context('spawn').Process(target=serve, args=(port, a.delay), daemon=True)
    server.start()
    base_url = f'http://127.0.0.1:{port}/v1'
    for _ in range(200):
        try:
            urllib.request.urlopen(base_url + '/models', timeout=1).read(); break
        except OSError: time.sleep(0.05)
    try:
        ideal = a.calls * a.delay / a.concurrency
        runs = [asyncio.run(one_run(base_url, a.calls, a.concurrency)) for _ in range(a.reps)]
    finally:
        server.terminate(); server.join()
    walls = [r[0] for r in runs]
    wall = statistics.median(walls)
    cpu = statistics.median(r[1] for r in runs)
    waits = [r[2] for r in runs if r[2] is not None]
    print(f"client: {a.calls} calls, concurrency {a.concurrency}, endpoint delay {a.delay * 1000:.0f} ms "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"  runs (s):            {', '.join(f'{w:.3f}' for w in walls)}")
    print(f"  measured wall time:  {wall:.3f} s (median of {a.reps})")
    print(f"  ideal wall time:     {ideal:.3f} s  (calls x delay / concurrency)")
    print(f"  ratio:               {wall / ideal:.3f}  (goal <= 1.3)")
    print(f"  client CPU per call: {cpu / a.calls * 1e3:.3f} ms ({cpu:.2f} s per run)")
    if waits:
        print(f"  waiting for a CPU:   {statistics.median(waits):.2f} s per run (runnable, but other processes had the cores)")
    emit(f"collection client, {a.calls:,} calls at concurrency {a.concurrency}, {a.delay * 1000:.0f} ms endpoint",
         f"{wall:.2f} s vs ideal {ideal:.3f} s ({wall / ideal:.2f}x)", '<= 1.3x', bool(wall / ideal <= 1.3))
    return 0


if __name__ == '__main__':
    sys.exit(main())
