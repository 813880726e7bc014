"""Routing endpoint: the routing decision's latency, and the endpoint against the floor of its stack and a 50 ms upstream.

Run: .venv/bin/python bench/bench_serve.py [--quick] [--decisions 300] [--calls 2000] [--reps 5] [--profile]

1. The routing decision, one question per call, with the guard, as a lone request sees it: guarded TF-IDF bundles of
   kNN, MLP and AvengersPro (trained with `train`, saved, loaded back) ranked by the fast path `dars serve` uses
   (`FastRanker`, numpy) and by `RouterBundle.rank` (scikit-learn) beside it; a sentence-embedding MLP bundle
   beside them. p50 and p99. Goal: p50 <= 0.3 ms (TF-IDF, fast path).
2. Against a `FixedEndpoint` that answers after 50 ms, in processes of their own, the load from this process (one
   httpx2 client; direct and the others alternate; medians of the repetitions), at concurrency 1 and 32 and
   streamed at 32:
   - direct: the upstream called directly;
   - floor: the same server stack as the endpoint (uvicorn + httptools + Starlette) as a bare pass-through proxy
     with the same upstream client (`dars_nb.serve.connections.HTTPPool`), no ranking and no accounting;
     `floor-httpx2` the same with httpx2 as its client (the client the endpoint used before: the choice measured);
     `server alone` the same stack answering a fixed body without any upstream (CPU only);
   - endpoint: `dars serve --workers 1` (TF-IDF kNN bundle, guarded), and `--workers 2`;
   - endpoint, no ranking: the same endpoint with every request given the bundle's model order
     (`serve_parts.py --no-ranking`): what the endpoint costs without its ranking.
   CPU time per request of each server (/proc: its threads and its children's, to the nanosecond; the floor and the
   endpoint run back to back, --pairs times in each repetition, and their ratio is the median of the pairs' own
   ratios: the machine's speed drifts between pairs by more than the difference measured; printed with scipy's 90%
   bootstrap interval of that median), and the endpoint's split by part: server + framework (the `server alone`),
   upstream client (floor - server alone), then parsing, ranking and accounting timed inside one more endpoint under
   the same load (`serve_parts.py`: the thread's CPU time of each call; beside them, the same parts timed in a loop in
   this process, which understates them), and the rest (the endpoint's own glue). The ranking's cost is also read
   without any clock in the server: the endpoint minus the endpoint without ranking, per repetition.
   Goals: endpoint CPU per routed request <= 1.0 ms and <= 1.5 x the floor's, rate >= 0.9 x direct at c = 32.
3. With --profile (needs py-spy): one more run at concurrency 32 with py-spy sampling the endpoint.
Question texts are MATH-500 problems from $DARS_DATA when it is set (made-up questions otherwise, said so).
"""
import argparse, asyncio, json, math, multiprocessing as mp, os, statistics, sys, tempfile, threading, time
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


def build_bundle(family, texts, path, features='tfidf'):
    "A guarded `family` bundle trained with `train` on simulated DARS outcomes for `texts`, saved to `path`."
    from dars_nb.bundle import save_bundle
    from dars_nb.bundle.training import TrainConfig, train
    from dars_nb.simulate import simulate
    obs, _, _ = simulate('gpqa_like', n_train=len(texts), n_test=5, seed=0)
    ids = {q: i for i, q in enumerate(obs['query_id'].unique())}
    text = obs['query_id'].map(ids).map(lambda i: texts[i % len(texts)])
    seeded = {} if family == 'kNN' else {'random_state': 0}
    cfg = TrainConfig(observations=obs.assign(query_text=text, original_text=text), family=family,
                      router_params=seeded, features=features)
    return save_bundle(train(cfg, quiet=True), path)


def decision_times(path, texts, warm):
    "{path name: milliseconds per routing decision}, one text per call, for the fast path and the bundle's own `rank`."
    from dars_nb.bundle import load_bundle
    from dars_nb.bundle.fast import FastRanker
    b = load_bundle(path)
    if hasattr(b.featurizer, 'cache'): b.featurizer.cache = False   # as `dars serve` runs it: in memory, nothing written
    fast = FastRanker(b)
    out = {}
    for name, rank in (('fast path', fast), ('RouterBundle.rank', b.rank)):
        for t in warm: rank([t])
        ms = []
        for t in texts:
            t0 = time.perf_counter()
            rank([t])
            ms.append((time.perf_counter() - t0) * 1e3)
        out[name] = np.array(ms)
    return out, fast.fast, b.guard is not None


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


ANSWER = (b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":'
          b'{"role":"assistant","content":"The answer is 42."},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}')


def floor_app(upstream, client):
    "The endpoint's server stack as a bare pass-through proxy to `upstream` with `client` ('pool', 'httpx2'), or none."
    from starlette.applications import Starlette
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route
    if client is None:
        async def answer(request):
            await request.body()
            return Response(ANSWER, media_type='application/json')
    elif client == 'pool':
        from dars_nb.serve.connections import HTTPPool
        pool = HTTPPool(upstream, 64)
        async def answer(request):
            body = await request.body()
            conn = await pool.connection()
            resp = await pool.send(conn, '/chat/completions', body)
            if b'"stream":true' in body:
                return StreamingResponse((line + '\n' async for line in resp.aiter_lines()), media_type='text/event-stream')
            return Response(await resp.read(), resp.status, media_type='application/json')
    else:
        import httpx2
        http = httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=64, max_keepalive_connections=64))
        async def answer(request):
            body = await request.body()
            if b'"stream":true' in body:
                req = http.build_request('POST', upstream + '/chat/completions', content=body,
                                         headers={'content-type': 'application/json'})
                resp = await http.send(req, stream=True)
                async def lines():
                    try:
                        async for line in resp.aiter_lines(): yield line + '\n'
                    finally: await resp.aclose()
                return StreamingResponse(lines(), media_type='text/event-stream')
            r = await http.post(upstream + '/chat/completions', content=body, headers={'content-type': 'application/json'})
            return Response(r.content, r.status_code, media_type='application/json')
    async def models(request): return Response(b'{"data":[]}', media_type='application/json')
    return Starlette(routes=[Route('/v1/chat/completions', answer, methods=['POST']), Route('/v1/models', models)])


def serve_floor(port, upstream, client):
    "Serve `floor_app` on `port` under uvicorn with the endpoint's own server settings, until terminated."
    import uvicorn
    from dars_nb.pool.server import listening_socket, server_config
    uvicorn.Server(server_config(floor_app(upstream, client), True)).run(sockets=[listening_socket('127.0.0.1', port)])


def start_endpoint(port, upstream, bundle_path, tmp, workers):
    "`dars serve` (TF-IDF bundle) on `port` in front of `upstream`, with `workers` processes; the process."
    import subprocess
    from dars_nb.bundle import load_bundle
    pool = tmp / f'pool{workers}.toml'
    pool.write_text(''.join(f'[models."{m}"]\nbase_url = "{upstream}"\nprice_in = {0.1 * (i + 1)}\n'
                            f'price_out = {0.2 * (i + 1)}\nconcurrency = 64\n'
                            for i, m in enumerate(load_bundle(bundle_path).models)))
    return subprocess.Popen([sys.executable, '-m', 'dars_nb', 'serve', '--router', str(bundle_path), '--pool', str(pool),
                             '--port', str(port), '--workers', str(workers), '--quiet'])


def start_unranked(port, bundle_path, pool_path):
    "The endpoint of `start_endpoint` (one process) with every request given the bundle's model order; the process."
    import subprocess
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name('serve_parts.py')), '--no-ranking',
                             '-', 'serve', '--router', str(bundle_path), '--pool', str(pool_path),
                             '--port', str(port), '--quiet'])


def median_interval(values, level=0.9):
    "(low, high): scipy's percentile bootstrap interval of the median of `values` (the pairs' ratios)."
    from scipy.stats import bootstrap
    if len(values) < 2: return math.nan, math.nan
    ci = bootstrap((np.asarray(values),), np.median, confidence_level=level, method='percentile', n_resamples=4000,
                   random_state=np.random.default_rng(0)).confidence_interval
    return float(ci.low), float(ci.high)


def tree_cpu_seconds(pid):
    """CPU seconds of process `pid` and its children so far (Linux /proc): to the nanosecond from each live thread's
    `schedstat` where the kernel keeps it, else user + system in clock ticks (10 ms: a run of 640 requests at
    0.2 ms each is only 13 ticks) from `stat`. The servers measured keep their threads, so none is lost between reads."""
    children = [int(d) for d in filter(str.isdigit, os.listdir('/proc')) if _parent(d) == pid]
    precise = [_threads_cpu_seconds(p) for p in [pid, *children]]
    if None not in precise: return sum(precise)
    total = cpu_seconds(pid)
    for child in children:
        try: total += cpu_seconds(child)
        except OSError: continue
    return total


def _parent(pid) -> int | None:
    "The parent of process `pid` (None if it is gone)."
    try: return int(Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[1])
    except OSError: return None


def _threads_cpu_seconds(pid) -> float | None:
    "Seconds on a CPU of every live thread of process `pid`, from `/proc/<pid>/task/*/schedstat` (None without it)."
    if not Path(f'/proc/{pid}/schedstat').exists(): return None
    total = 0
    for task in Path(f'/proc/{pid}/task').iterdir():
        try: total += int((task / 'schedstat').read_text().split()[0])
        except OSError: continue   # the thread ended
    return total / 1e9


def in_process_parts(bundle_path, bodies, n=2000):
    "{part: CPU ms per request} of parsing, ranking (fast path) and accounting, timed in this process."
    from dars_nb.bundle import load_bundle
    from dars_nb.bundle.fast import FastRanker
    from dars_nb.pool.models import ModelSpec, Pool
    from dars_nb.serve.requests import ServeSettings
    b = load_bundle(bundle_path)
    fast, settings = FastRanker(b), ServeSettings()
    pool = Pool({m: ModelSpec(m, 'http://127.0.0.1:9/v1', price_in=0.1, price_out=0.2) for m in b.models})
    bodies = (bodies * (n // len(bodies) + 1))[:n]
    import gc
    gc.collect(); gc.disable()   # the harness's own garbage is not the parts' cost
    try: return _loop_parts(b, fast, settings, pool, bodies, n)
    finally: gc.enable()


def _loop_parts(b, fast, settings, pool, bodies, n):
    "`in_process_parts`' timings."
    from dars_nb.serve.metrics import ServeMetrics
    from dars_nb.serve.requests import parse_chat_request
    t0 = time.process_time()
    reqs = [parse_chat_request(body, settings, pool.models) for body in bodies]
    parse = time.process_time() - t0
    t0 = time.process_time()
    for r in reqs: fast([r.text], 0.05)
    rank = time.process_time() - t0
    metrics, spec = ServeMetrics(list(b.models), 100.0), pool.models[b.models[0]]
    t0 = time.process_time()
    for r in reqs:
        entry, held = metrics.ledger.reserve(spec.name, spec.cost(r.prompt_tokens, r.max_tokens))
        metrics.answered(spec.name, 10, 5, metrics.ledger.settle(entry, spec.cost(10, 5)))
        metrics.latency['request'].observe(0.05); metrics.latency['upstream'][spec.name].observe(0.05)
    account = time.process_time() - t0
    return {'parsing (parse_chat_request)': parse / n * 1e3, 'ranking (FastRanker, one text)': rank / n * 1e3,
            'accounting (ledger, counts, histograms)': account / n * 1e3}


def server_parts(bundle_path, pool_path, bodies, tmp):
    "{part: CPU ms per request} of parsing, ranking and accounting inside a running endpoint (`serve_parts.py`)."
    import signal, subprocess
    from dars_nb.pool.server import free_port
    port, out = free_port(), tmp / 'parts.json'
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name('serve_parts.py')), str(out), 'serve',
                             '--router', str(bundle_path), '--pool', str(pool_path), '--port', str(port), '--quiet'])
    url, totals = f'http://127.0.0.1:{port}/v1', []
    def snapshot():   # the totals the server writes when told to
        out.unlink(missing_ok=True); proc.send_signal(signal.SIGUSR1)
        while not out.exists(): time.sleep(0.01)
        time.sleep(0.05); totals.append(json.loads(out.read_text()))
    try:
        wait_up(url)
        asyncio.run(load(url, bodies, 32, snapshot))
        snapshot()
    finally: proc.terminate(); proc.wait()
    n = totals[1]['requests'] - totals[0]['requests']
    return {k: (v - totals[0][k]) / n * 1e3 for k, v in totals[1].items() if k != 'requests'}


PROFILE_GROUPS = [   # (group, substrings of a py-spy frame); a sample counts for the innermost frame that matches
    ('ranking (bundle, router, sklearn, numpy, scipy)',
     ('dars_nb/bundle', 'dars_nb/routers', 'dars_nb/features', 'sklearn/', 'numpy/', 'scipy/', 'narwhals/',
      'RankBatcher._timed', 'threadpoolctl')),
    ('hand-over of the ranking to a worker thread', ('concurrent/futures', 'to_thread', 'asyncio/futures.py', 'queue.py')),
    ('upstream client (HTTPPool; httpx2 before)', ('serve/connections.py', 'httpx2/', 'httpcore2/', 'anyio/', 'sniffio/', 'h11/')),
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


WARM_UP = 200   # requests of the warm-up pass (at concurrency 3) before a run is timed

async def load(url, bodies, concurrency, warmed=lambda: None):
    "Send every body at `concurrency` (after a warm-up pass of `WARM_UP` of them, then `warmed()`); (wall seconds, latencies in ms)."
    import httpx2
    lat, queue = [], list(reversed(bodies[:WARM_UP]))
    async with httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)) as c:
        async def worker():
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                r = await c.post(url + '/chat/completions', content=body, headers={'content-type': 'application/json'})
                lat.append((time.perf_counter() - t0) * 1e3)
                if r.status_code != 200: raise RuntimeError(f'{url}: HTTP {r.status_code}: {r.text[:200]}')
        await asyncio.gather(*[worker() for _ in range(min(3, concurrency))])   # warm the connections
        lat.clear(); queue[:] = list(reversed(bodies)); warmed()
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
    ap.add_argument('--reps', type=int, default=5)
    ap.add_argument('--pairs', type=int, default=3,
                    help='floor/endpoint pairs per repetition (plain and streamed): their CPU ratio is the goal')
    ap.add_argument('--endpoint-only', action='store_true', help='skip the routing-decision timings')
    ap.add_argument('--profile', action='store_true', help='profile the endpoint with py-spy in one more run')
    a = ap.parse_args(argv)
    if a.quick: a.decisions, a.calls, a.calls1, a.reps, a.pairs = 100, 640, 30, 2, 1
    texts, source = question_texts(305 + a.decisions)
    train, warm, probe = texts[:300], texts[300:305], texts[305:]
    tmp = Path(tempfile.mkdtemp(prefix='dars_bench_serve_'))
    os.environ['DARS_CACHE'] = str(tmp / 'cache')   # a fresh embedding cache: every timed question is new to it
    print(f"texts: {source}; bundles fitted on {len(train)}, timed on {len(probe)} others "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    knn_path = build_bundle('kNN', train, tmp / 'knn.router')
    if not a.endpoint_only:
        fast_p50 = {}
        for family, features in (('kNN', 'tfidf'), ('MLP', 'tfidf'), ('AvengersPro', 'tfidf'), ('MLP', 'sentence')):
            path = knn_path if (family, features) == ('kNN', 'tfidf') else \
                build_bundle(family, train, tmp / f'{family}-{features}.router', features)
            ms, fast, guarded = decision_times(path, probe, warm)
            p = {k: np.percentile(v, [50, 99]) for k, v in ms.items()}
            print(f"routing decision, {family} on {features} ({'guarded' if guarded else 'unguarded'}): "
                  f"fast path{'' if fast else ' (the bundle own rank: no numpy kernel)'} p50 {p['fast path'][0]:.3f} ms, "
                  f"p99 {p['fast path'][1]:.3f} ms; RouterBundle.rank p50 {p['RouterBundle.rank'][0]:.3f} ms, "
                  f"p99 {p['RouterBundle.rank'][1]:.3f} ms")
            if features == 'tfidf': fast_p50[family] = p['fast path'][0]
            else: emit(f"routing decision, sentence-embedding MLP bundle, one question, fast path",
                       f"p50 {p['fast path'][0]:.2f} ms, p99 {p['fast path'][1]:.2f} ms", '', None)
        worst = max(fast_p50.values())
        emit("routing decision, guarded TF-IDF bundle (kNN / MLP / AvengersPro), one question, fast path",
             ' / '.join(f"{v:.3f}" for v in fast_p50.values()) + ' ms p50', 'p50 <= 0.3 ms', bool(worst <= 0.3))
        enc = encoder_times(probe)
        print(f"  for reference, the sentence encoder alone, loaded once: p50 {np.percentile(enc, 50):.2f} ms, "
              f"p99 {np.percentile(enc, 99):.2f} ms per question")

    from dars_nb.pool.server import free_port
    ctx = mp.get_context('spawn')
    ports = {k: free_port() for k in ('direct', 'floor', 'floor-httpx2', 'server alone', 'endpoint', 'endpoint, no ranking',
                                      'endpoint, 2 workers')}
    direct = f"http://127.0.0.1:{ports['direct']}/v1"
    procs = {'direct': ctx.Process(target=serve_fixed, args=(ports['direct'], a.delay), daemon=True)}
    for name, client in (('floor', 'pool'), ('floor-httpx2', 'httpx2'), ('server alone', None)):
        procs[name] = ctx.Process(target=serve_floor, args=(ports[name], direct, client), daemon=True)
    for p in procs.values(): p.start()
    procs['endpoint'] = start_endpoint(ports['endpoint'], direct, knn_path, tmp, 1)
    procs['endpoint, 2 workers'] = start_endpoint(ports['endpoint, 2 workers'], direct, knn_path, tmp, 2)
    procs['endpoint, no ranking'] = start_unranked(ports['endpoint, no ranking'], knn_path, tmp / 'pool1.toml')
    urls = {k: f'http://127.0.0.1:{port}/v1' for k, port in ports.items()}
    ask = lambda t, stream=False: json.dumps({'model': 'dars-router', 'max_tokens': 16, 'stream': stream,
                                              'messages': [{'role': 'user', 'content': t}]}, separators=(',', ':')).encode()
    # the floor and the endpoint run back to back, --pairs times in each repetition: their CPU ratio is taken per pair
    runs = [('direct', 1), ('endpoint', 1), ('direct', 32), ('floor', 32), ('endpoint', 32), ('endpoint, no ranking', 32),
            ('floor-httpx2', 32),
            ('endpoint, 2 workers', 32), ('server alone', 32)] + \
           [(w, 's32') for w in ('direct', 'floor', 'endpoint', 'floor-httpx2')]
    results, cpu, profile = {r: [] for r in runs}, {r: [] for r in runs}, []
    pairs = [(w, c) for _ in range(a.pairs - 1) for c in (32, 's32') for w in ('floor', 'endpoint')]
    schedule, more = [(cpu, r) for r in runs] + [(None, r) for r in pairs], {r: [] for r in pairs}   # `more`: the further pairs' CPU
    try:
        for url in urls.values(): wait_up(url)
        for rep in range(a.reps):
            for into, (who, c) in (schedule if rep % 2 == 0 else schedule[::-1]):
                n, conc = (a.calls1, 1) if c == 1 else (a.calls, 32)
                bodies = [ask(texts[i % len(texts)], stream=c == 's32') for i in range(n)]
                c0 = []   # the CPU so far once the warm-up pass is over: only the timed requests count
                wall, lat = asyncio.run(load(urls[who], bodies, conc, lambda: c0.append(tree_cpu_seconds(procs[who].pid))))
                (more if into is None else into)[(who, c)].append((tree_cpu_seconds(procs[who].pid) - c0[0]) / n * 1e3)
                if into is not None: results[(who, c)].append((n / wall, np.percentile(lat, 50), np.percentile(lat, 99)))
        if a.profile:
            bodies = [ask(texts[i % len(texts)]) for i in range(a.calls)]
            profile = profiled_run(procs['endpoint'].pid, urls['endpoint'], bodies, 32, tmp / 'endpoint.pyspy.txt')
        parts = server_parts(knn_path, tmp / 'pool1.toml', [ask(texts[i % len(texts)]) for i in range(a.calls)], tmp)
    finally:
        for p in procs.values(): p.terminate()
        for p in procs.values(): (p.join if hasattr(p, 'join') else p.wait)()
    med = {k: [statistics.median(r[i] for r in v) for i in range(3)] for k, v in results.items()}
    ms = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"against a FixedEndpoint answering after {a.delay * 1e3:.0f} ms ({a.calls1} / {a.calls} requests at "
          f"concurrency 1 / 32, median of {a.reps}; load average {os.getloadavg()[0]:.1f}):")
    print(f"  {'':22s} {'conc.':>6s} {'req/s':>8s} {'x direct':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'CPU ms/req':>11s}")
    for (who, c), (thr, p50, p99) in med.items():
        base = med.get(('direct', c))
        print(f"  {who:22s} {str(c):>6s} {thr:8.1f} {thr / base[0] if base else float('nan'):9.2f} "
              f"{p50:8.1f} {p99:8.1f} {ms[(who, c)]:11.2f}")
    added = med[('endpoint', 1)][1] - med[('direct', 1)][1]
    ratio, sratio = med[('endpoint', 32)][0] / med[('direct', 32)][0], med[('endpoint', 's32')][0] / med[('direct', 's32')][0]
    floor_ms, end_ms = ms[('floor', 32)], ms[('endpoint', 32)]
    # each repetition's endpoint against the floor run beside it: the machine's drift between repetitions cancels
    both = lambda r: cpu[r] + more.get(r, [])   # each repetition's first pair, then the further ones, in the same order
    paired = [e / f for e, f in zip(both(('endpoint', 32)), both(('floor', 32)))]
    spaired = [e / f for e, f in zip(both(('endpoint', 's32')), both(('floor', 's32')))]
    over, sover = statistics.median(paired), statistics.median(spaired)
    (low, high), (slow, shigh) = median_interval(paired), median_interval(spaired)
    unranked = [u / f for u, f in zip(cpu[('endpoint, no ranking', 32)], cpu[('floor', 32)])]
    ranking = statistics.median(e - u for e, u in zip(cpu[('endpoint', 32)], cpu[('endpoint, no ranking', 32)]))
    alone, client = ms[('server alone', 32)], ms[('floor', 32)] - ms[('server alone', 32)]
    in_loop = in_process_parts(knn_path, [ask(t) for t in probe])
    rest = end_ms - floor_ms - sum(parts.values())
    print(f"  added latency at concurrency 1: {added:+.1f} ms (p50); 's32' = streamed at concurrency 32")
    print(f"  the endpoint's CPU per request against the floor run beside it, per pair: "
          f"{' '.join(f'{r:.2f}' for r in paired)} (median {over:.2f}x, 90% bootstrap interval {low:.2f}-{high:.2f}); "
          f"streamed {' '.join(f'{r:.2f}' for r in spaired)} (median {sover:.2f}x, {slow:.2f}-{shigh:.2f})")
    print(f"  without its ranking (every request given the bundle's model order), the endpoint against the floor: "
          f"{' '.join(f'{r:.2f}' for r in unranked)} (median {statistics.median(unranked):.2f}x); the ranking, "
          f"the endpoint minus that, per repetition: {ranking:.3f} ms per request (median)")
    print(f"  the endpoint's CPU per routed request at concurrency 32, {end_ms:.2f} ms, by part (parsing, ranking and "
          f"accounting timed inside a running endpoint, serve_parts.py; in a loop in this process after the /):")
    for part, v in [('server + framework (uvicorn, httptools, Starlette; the server alone)', alone),
                    ('upstream client (HTTPPool: the floor - the server alone)', client),
                    *[(f'{k} / {in_loop[k]:.3f} ms in a loop', v) for k, v in parts.items()],
                    ("the rest: the endpoint's own glue (middleware, headers, JSON out, slots; the parts above are from one more "
                     "run, timed, so this is approximate)", rest)]:
        print(f"    {v:6.3f} ms  {part}")
    two = med[('endpoint, 2 workers', 32)][0]
    print(f"  workers: {med[('endpoint', 32)][0]:.0f} req/s with 1, {two:.0f} req/s with 2 "
          f"(CPU {ms[('endpoint', 32)]:.2f} / {ms[('endpoint, 2 workers', 32)]:.2f} ms per request)")
    if a.profile:
        print(f"where the endpoint's time goes at concurrency 32 (py-spy, samples while it holds the GIL, {a.calls} requests):")
        print('\n'.join(profile))
    emit(f"the floor: bare pass-through proxy (same server, same client), CPU per request, concurrency 32",
         f"{floor_ms:.2f} ms (httpx2 as client: {ms[('floor-httpx2', 32)]:.2f} ms; server alone {alone:.2f} ms)", '', None)
    emit(f"routing endpoint vs direct, concurrency 32, {a.delay * 1e3:.0f} ms upstream",
         f"{med[('endpoint', 32)][0]:.0f} vs {med[('direct', 32)][0]:.0f} req/s ({ratio:.2f}x)", '>= 0.9x direct', bool(ratio >= 0.9))
    emit(f"routing endpoint vs direct, streamed, concurrency 32",
         f"{med[('endpoint', 's32')][0]:.0f} vs {med[('direct', 's32')][0]:.0f} req/s ({sratio:.2f}x)", '>= 0.9x direct', bool(sratio >= 0.9))
    emit(f"routing endpoint, concurrency 1: added latency (p50)", f"{added:+.1f} ms", '', None)
    emit(f"routing endpoint CPU per routed request, concurrency 32",
         f"{end_ms:.2f} ms ({over:.2f}x the floor, the median of {len(paired)} pairs' ratios "
         f"{min(paired):.2f}-{max(paired):.2f}, 90% interval of that median {low:.2f}-{high:.2f}; streamed {sover:.2f}x)",
         '<= 1.0 ms and <= 1.5x the floor', bool(end_ms <= 1.0 and over <= 1.5))
    emit(f"dars serve --workers 1 / 2, concurrency 32", f"{med[('endpoint', 32)][0]:.0f} / {two:.0f} req/s", '', None)
    return 0


if __name__ == '__main__':
    sys.exit(main())
