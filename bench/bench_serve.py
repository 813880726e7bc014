"""Routing endpoint: the routing decision's latency, and the endpoint's throughput against a 50 ms upstream.

Run: .venv/bin/python bench/bench_serve.py [--quick] [--decisions 300] [--calls 2000] [--reps 3]

1. The routing decision (featurize one question + predict + rank) with a saved TF-IDF bundle and a saved
   sentence-embedding bundle (an MLP router on DARS supervision, loaded back with `load_bundle`), timed one
   question at a time, as a lone request sees it: p50 and p99. Goals: p50 <= 10 ms (TF-IDF), <= 30 ms (sentence).
2. The endpoint (`dars_nb.serve` under uvicorn, routing with the TF-IDF bundle) in front of a `FixedEndpoint`
   that answers after 50 ms, against calling that `FixedEndpoint` directly, at concurrency 1 and 32. The
   upstream and the endpoint run in processes of their own; the load comes from this process (one httpx2
   client). Direct and routed runs alternate, and medians of the repetitions are reported.
   Goal: throughput at concurrency 32 >= 0.9 x direct. Added latency at concurrency 1 is reported.
   CPU time per request is read from each server process (/proc/PID/stat, user + system), not from the clock, so
   that other load on the machine distorts it less: the endpoint's per routed request (goal <= 1.0 ms), and the
   fixed endpoint's per request beside it, the floor any server in front of it is compared with.
3. With --profile (needs py-spy): one more run at concurrency 32 with py-spy sampling the endpoint process while it
   holds the interpreter lock; prints where its time goes, grouped (ranking, thread hand-over, upstream client,
   HTTP server, ASGI framework, the endpoint's own code, event loop), and the heaviest lines.
Question texts are MATH-500 problems from $DARS_DATA when it is set (made-up questions otherwise, said so).
"""
import argparse, asyncio, json, multiprocessing as mp, os, statistics, sys, tempfile, threading, time
from pathlib import Path

import numpy as np

from summary import emit


def question_texts(n):
    "n question texts: MATH-500 problems from $DARS_DATA, else made-up ones; and where they came from."
    if os.environ.get('DARS_DATA'):
        from dars_nb.sources.datasets import load_math500
        q = load_math500()['question'].tolist()
        return (q * (n // len(q) + 1))[:n], 'MATH-500 problems'
    topics = ['algebra', 'geometry', 'probability', 'number theory', 'calculus', 'combinatorics']
    return [f'Question {i}: a problem in {topics[i % 6]} about {i * 7 % 97} and {i * 13 % 89}; find the value.' for i in range(n)], \
        'made-up questions (DARS_DATA is not set)'


def build_bundle(kind, texts, path):
    "Fit a `kind` featurizer and an MLP router on simulated DARS supervision for `texts`; save it to `path`."
    from dars_nb.bundle import RouterBundle, save_bundle
    from dars_nb.features import make_featurizer
    from dars_nb.routers import ROUTERS
    from dars_nb.simulate import simulate
    from dars_nb.stats import supervision
    obs, _, _ = simulate('gpqa_like', n_train=len(texts), n_test=5, seed=0)
    sup = supervision(obs, 'dars')
    feat = make_featurizer(kind).fit(texts)
    router = ROUTERS['MLP'](random_state=0).fit(feat.transform(texts), sup)
    save_bundle(RouterBundle(models=list(sup.models), lam=0.05, beta=0.2, mode='dars', featurizer=feat, router=router),
                path)
    return path


def decision_times(path, texts, warm):
    "Milliseconds per routing decision, one text per call, with the bundle loaded from `path` (after `warm` texts)."
    from dars_nb.bundle import load_bundle
    b = load_bundle(path)
    if hasattr(b.featurizer, 'cache'): b.featurizer.cache = False   # as `dars serve` runs it: in memory, nothing written
    for t in warm: b.rank([t])
    out = []
    for t in texts:
        t0 = time.perf_counter()
        b.rank([t])
        out.append((time.perf_counter() - t0) * 1e3)
    return np.array(out)


def encoder_times(texts):
    "Milliseconds per question for the library's sentence encoder alone, loaded once (no disk cache)."
    from dars_nb.features.encoder import sentence_encoder
    enc = sentence_encoder()
    for t in texts[:5]: enc.encode([t])
    out = []
    for t in texts:
        t0 = time.perf_counter()
        enc.encode([t])
        out.append((time.perf_counter() - t0) * 1e3)
    return np.array(out)


def serve_fixed(port, delay):
    from dars_nb.testing import FixedEndpoint
    FixedEndpoint(text='The answer is 42.', delay_s=delay, port=port).serve_forever()


def serve_router(port, upstream, bundle_path):
    from dars_nb.bundle import load_bundle
    from dars_nb.pool.models import ModelSpec, Pool
    from dars_nb.pool.server import BackgroundServer
    from dars_nb.serve.app import create_app
    from dars_nb.serve.requests import ServeSettings
    b = load_bundle(bundle_path)
    pool = Pool({m: ModelSpec(m, upstream, price_in=0.1 * (i + 1), price_out=0.2 * (i + 1), concurrency=8)
                 for i, m in enumerate(b.models)})
    srv = BackgroundServer(create_app(b.rank, pool, ServeSettings(port=port), lam=b.lam), port=port).start()
    threading.Event().wait()


PROFILE_GROUPS = [   # (group, substrings of a py-spy frame); a sample counts for the innermost frame that matches
    ('ranking (bundle, router, sklearn, numpy, scipy)',
     ('dars_nb/bundle', 'dars_nb/routers', 'dars_nb/features', 'sklearn/', 'numpy/', 'scipy/', 'narwhals/',
      'RankBatcher._timed', 'threadpoolctl')),
    ('hand-over of the ranking to a worker thread', ('concurrent/futures', 'to_thread', 'asyncio/futures.py', 'queue.py')),
    ('upstream client (httpx2, httpcore2, anyio, h11)', ('httpx2/', 'httpcore2/', 'anyio/', 'sniffio/', 'h11/')),
    ('HTTP server (uvicorn, httptools)', ('uvicorn/', 'pool/server.py')),
    ('ASGI framework (starlette)', ('starlette/',)),
    ("the endpoint's own code (check, route, count, JSON)", ('dars_nb/serve', 'dars_nb/pool', 'orjson')),
    ('event loop (uvloop, asyncio)', ('asyncio/', 'uvloop', 'Runner.run', 'contextlib')),
]


def profile_summary(raw_path, top=12):
    "Lines describing a py-spy raw profile: the share of samples per group of `PROFILE_GROUPS`, then the heaviest lines."
    import collections
    groups, own, total = collections.Counter(), collections.Counter(), 0
    for line in Path(raw_path).read_text().splitlines():
        if not line.strip(): continue
        stack, n = line.rsplit(' ', 1)
        frames, n = stack.split(';'), int(n)
        total += n; own[frames[-1]] += n
        groups[next((g for f in reversed(frames) for g, keys in PROFILE_GROUPS if any(k in f for k in keys)), 'other')] += n
    if not total: return ['  py-spy took no samples']
    out = [f"  {n / total * 100:5.1f} %  {g}" for g, n in groups.most_common()]
    out += ['  heaviest lines (own time):'] + [f"  {n / total * 100:5.1f} %  {f}" for f, n in own.most_common(top)]
    return out


def wait_up(url):
    from dars_nb.pool.http import http_get, EndpointUnreachable
    for _ in range(600):
        try: http_get(url + '/models', timeout_s=1); return
        except EndpointUnreachable: time.sleep(0.05)
    raise RuntimeError(f'{url} did not start')


def _stat_cpu_seconds(stat: str) -> float:
    "User + system CPU seconds from the text of a /proc `stat` file."
    fields = stat.rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def cpu_seconds(pid):
    "User + system CPU seconds of process `pid` so far (Linux /proc)."
    return _stat_cpu_seconds(Path(f'/proc/{pid}/stat').read_text())


def thread_cpu_seconds(pid):
    "{thread id: user + system CPU seconds so far} of every thread of process `pid` (Linux /proc)."
    out = {}
    for task in Path(f'/proc/{pid}/task').iterdir():
        try: out[task.name] = _stat_cpu_seconds((task / 'stat').read_text())
        except OSError: continue   # the thread ended
    return out


def profiled_run(pid, url, bodies, concurrency, out_path):
    "One `load` run with py-spy sampling process `pid` while it holds the GIL; the summary lines (or why there are none)."
    import shutil, signal, subprocess
    spy = shutil.which('py-spy') or str(Path(sys.executable).with_name('py-spy'))
    if not Path(spy).exists(): return ['  py-spy is not installed (pip install py-spy): no profile']
    proc = subprocess.Popen([spy, 'record', '--pid', str(pid), '--gil', '--nonblocking', '--rate', '250',
                             '--format', 'raw', '--output', str(out_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)   # py-spy attaches
    asyncio.run(load(url, bodies, concurrency))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if not Path(out_path).exists():
        return [f"  py-spy recorded nothing: {(err.strip().splitlines() or ['no message'])[-1]}"]
    return profile_summary(out_path)


async def load(url, bodies, concurrency):
    "Send every body at `concurrency`; (wall seconds, latencies in ms)."
    import httpx2
    lat, queue = [], list(reversed(bodies))
    async with httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)) as c:
        async def worker():
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                r = await c.post(url + '/chat/completions', content=body, headers={'content-type': 'application/json'})
                lat.append((time.perf_counter() - t0) * 1e3)
                if r.status_code != 200: raise RuntimeError(f'{url}: HTTP {r.status_code}: {r.text[:200]}')
        await asyncio.gather(*[worker() for _ in range(min(3, concurrency))])   # warm the connections
        lat.clear(); queue[:] = list(reversed(bodies))
        t = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        return time.perf_counter() - t, np.array(lat)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='fewer decisions and calls')
    ap.add_argument('--decisions', type=int, default=300, help='routing decisions timed per bundle')
    ap.add_argument('--calls', type=int, default=2000, help='requests per run at concurrency 32')
    ap.add_argument('--calls1', type=int, default=60, help='requests per run at concurrency 1')
    ap.add_argument('--delay', type=float, default=0.05)
    ap.add_argument('--reps', type=int, default=3)
    ap.add_argument('--endpoint-only', action='store_true', help='skip the routing-decision timings')
    ap.add_argument('--profile', action='store_true', help='profile the endpoint with py-spy in one more run')
    a = ap.parse_args(argv)
    if a.quick: a.decisions, a.calls, a.calls1, a.reps = 100, 640, 30, 2
    texts, source = question_texts(305 + a.decisions)
    train, warm, probe = texts[:300], texts[300:305], texts[305:]
    tmp = Path(tempfile.mkdtemp(prefix='dars_bench_serve_'))
    os.environ['DARS_CACHE'] = str(tmp / 'cache')   # a fresh embedding cache: every timed question is new to it
    print(f"texts: {source}; bundles fitted on {len(train)}, timed on {len(probe)} others "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    goals = {'tfidf': 10.0, 'sentence': 30.0}
    paths = {}
    for kind in ('tfidf',) if a.endpoint_only else ('tfidf', 'sentence'):
        paths[kind] = build_bundle(kind, train, tmp / f'{kind}.router')
        if a.endpoint_only: break
        ms = decision_times(paths[kind], probe, warm)
        p50, p99 = np.percentile(ms, 50), np.percentile(ms, 99)
        print(f"routing decision, {kind} bundle: p50 {p50:.2f} ms, p99 {p99:.2f} ms (goal: p50 <= {goals[kind]:g} ms)")
        emit(f"routing decision (featurize + predict), {kind} bundle, one question", f"p50 {p50:.2f} ms, p99 {p99:.2f} ms",
             f"p50 <= {goals[kind]:g} ms", bool(p50 <= goals[kind]))
    enc = encoder_times(probe) if not a.endpoint_only else np.array([np.nan])
    if not a.endpoint_only: print(f"  for reference, the sentence encoder alone (all-MiniLM-L6-v2 on OpenVINO), loaded once: p50 {np.percentile(enc, 50):.2f} ms, "
          f"p99 {np.percentile(enc, 99):.2f} ms per question")

    from dars_nb.pool.server import free_port
    ctx = mp.get_context('spawn')
    fport, rport = free_port(), free_port()
    fixed = ctx.Process(target=serve_fixed, args=(fport, a.delay), daemon=True); fixed.start()
    direct = f'http://127.0.0.1:{fport}/v1'
    router = ctx.Process(target=serve_router, args=(rport, direct, str(paths['tfidf'])), daemon=True); router.start()
    routed = f'http://127.0.0.1:{rport}/v1'
    results = {(w, c): [] for w in ('direct', 'routed') for c in (1, 32)}
    cpu, cpu_fixed, cpu_client, profile, by_thread, n_routed = [], [], [], [], {}, 0
    try:
        wait_up(direct); wait_up(routed)
        ask = lambda t: json.dumps({'model': 'dars-router', 'max_tokens': 16,
                                    'messages': [{'role': 'user', 'content': t}]}).encode()
        for rep in range(a.reps):
            for c, n in ((1, a.calls1), (32, a.calls)):
                bodies = [ask(texts[i % len(texts)]) for i in range(n)]
                for who in (('direct', 'routed') if rep % 2 == 0 else ('routed', 'direct')):
                    c0, f0, t0, me0 = cpu_seconds(router.pid), cpu_seconds(fixed.pid), thread_cpu_seconds(router.pid), time.process_time()
                    wall, lat = asyncio.run(load(direct if who == 'direct' else routed, bodies, c))
                    if who == 'routed' and c == 32:
                        cpu.append((cpu_seconds(router.pid) - c0) / n * 1e3); n_routed += n
                        for tid, sec in thread_cpu_seconds(router.pid).items():
                            by_thread[tid] = by_thread.get(tid, 0.0) + sec - t0.get(tid, 0.0)
                    if who == 'direct' and c == 32:
                        cpu_client.append((time.process_time() - me0) / n * 1e3)
                        cpu_fixed.append((cpu_seconds(fixed.pid) - f0) / n * 1e3)
                    results[(who, c)].append((n / wall, np.percentile(lat, 50), np.percentile(lat, 99)))
        if a.profile:
            bodies = [ask(texts[i % len(texts)]) for i in range(a.calls)]
            profile = profiled_run(router.pid, routed, bodies, 32, tmp / 'endpoint.pyspy.txt')
    finally:
        router.terminate(); fixed.terminate(); router.join(); fixed.join()
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in results.items()}
    print(f"endpoint vs direct, FixedEndpoint answering after {a.delay * 1e3:.0f} ms "
          f"({a.calls1} / {a.calls} requests at concurrency 1 / 32, median of {a.reps}):")
    print(f"  {'':10s} {'concurrency':>11s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s}")
    for (who, c), (thr, p50, p99) in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"  {who:10s} {c:11d} {thr:8.1f} {p50:8.1f} {p99:8.1f}")
    added = med[('routed', 1)][1] - med[('direct', 1)][1]
    ratio = med[('routed', 32)][0] / med[('direct', 32)][0]
    print(f"  added latency at concurrency 1: {added:+.1f} ms (p50)")
    print(f"  throughput at concurrency 32: {ratio:.2f} x direct (goal >= 0.9)")
    cpu_ms, fixed_ms = statistics.median(cpu), statistics.median(cpu_fixed)
    print(f"  endpoint CPU per routed request at concurrency 32: {cpu_ms:.2f} ms (goal <= 1.0 ms); "
          f"the fixed endpoint's per request: {fixed_ms:.2f} ms (load average {os.getloadavg()[0]:.1f})")
    threads = sorted((sec / n_routed * 1e3 for sec in by_thread.values()), reverse=True)
    print(f"  the endpoint's CPU per routed request by thread: {', '.join(f'{ms:.2f}' for ms in threads if ms >= 0.01)} ms "
          "(the event loop, and the worker thread that ranks when a ranking is slow)")
    print(f"  for scale, on this machine now: the load generator's httpx2 client spends {statistics.median(cpu_client):.2f} ms "
          f"of CPU per request it sends, the fixed endpoint {fixed_ms:.2f} ms per request it answers")
    if a.profile:
        print(f"where the endpoint's time goes at concurrency 32 (py-spy, samples while it holds the GIL, {a.calls} requests):")
        print('\n'.join(profile))
    emit(f"routing endpoint vs direct, concurrency 32, {a.delay * 1e3:.0f} ms upstream",
         f"{med[('routed', 32)][0]:.0f} vs {med[('direct', 32)][0]:.0f} req/s ({ratio:.2f}x)", '>= 0.9x direct', bool(ratio >= 0.9))
    emit(f"routing endpoint, concurrency 1: added latency (p50)", f"{added:+.1f} ms", '', None)
    emit(f"routing endpoint CPU per routed request, concurrency 32", f"{cpu_ms:.2f} ms (fixed endpoint {fixed_ms:.2f} ms)",
         '<= 1.0 ms', bool(cpu_ms <= 1.0))
    return 0


if __name__ == '__main__':
    sys.exit(main())
