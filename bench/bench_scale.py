"""The protocol at RouterBench size on 2 cores: time and peak memory per stage, growth from 3,000 to
30,000 training queries, and the Dask backend's table against the default backend's.

Run: .venv/bin/python bench/bench_scale.py [--quick] [--train 30000 --test 6000] [--small-train 3000
     --small-test 600] [--models 11] [--draws 100] [--n-boot 1000] [--n-jobs -1]
     [--dask-routers kNN AvengersPro | --dask-routers all | --dask-routers none]

The dataset is `simulate(widen('gpqa_like', 11), n_train, n_test)`: a 5 x 5 training grid per (query,
model), three rewrites and three decodes per test query (30,000 + 6,000 queries x 11 models: 8.6 M
rows). Each size goes through the same stages, in one process:

- simulate: the observation table, features and truth (`simulate` + `make_dataset`);
- diagnostics: the four diagnostics `dars diagnose` prints (`diagnose`);
- routers: `run_experiments` with all seven families x (`Spec('single')` at R draws, `Spec('dars')`),
  through joblib with `--n-jobs` workers — training, choosing and scoring both views;
- views + intervals: the bootstrap intervals of every router row (the last step of `run_experiments`,
  timed inside it) and the baselines of both views with theirs (`protocol_baselines`), then the paper's
  tables (`table1`, `table_vs_fixed`).

Peak memory is that of the whole process tree (this process and every joblib worker), sampled every 0.2
s: the goal is held against the sum of the processes' PSS (proportional set size: a page shared by n
processes, such as the supervision joblib hands its workers as a memory map, counts 1/n in each); the
sum of their RSS, which counts a shared page once per process, is printed beside it. Goals on 2 cores,
at the full size: the whole run (all four stages) <= 15 min and <= 8 GB; the time of each pipeline stage
(diagnostics, routers, views + intervals) grows at most linearly from the small to the full size. The
diagnostics take about a second: their time is the median of three calls. A 10x larger input may cost a
little more than 10x for reasons that are not the algorithm's: arrays that fit in the CPU caches at
3,000 queries no longer do at 30,000, and a shared machine's load moves timings by about a tenth between
runs; the growth goal allows 25 % for both (ratio <= 12.5x for 10x the queries).

Dask: the same `run_experiments` call on a local cluster (2 worker processes, 1 thread each), given as its
`scheduler`, must give the same table: scalar columns equal exactly, array columns equal with `np.array_equal`.
The whole protocol a second time does not fit the time budget, so by default a representative part runs both
ways, on the full dataset: the families of `--dask-routers` (a non-parametric and a cluster-based one) under
both supervisions, R = 100 — every step of the protocol (supervision, units on the workers, intervals) on the
full data, with the cheapest families. The prepared dataset and the supervisions (1 GB at R = 100 x 30,000
queries x 11 models) are written once to a file that both workers map, as joblib's workers do (the workers
run on this machine; a cluster elsewhere is sent them once per worker); each unit's task carries references
to them. Printed: the bytes sent to the workers (the shared data's paths once per worker, and the tasks' own
arguments), the bytes mapped, whether Dask warned about a large graph, and the cluster's time beside joblib's
for the same units on the same cores (goal: within 1.2x). `--dask-only` skips the stage table and runs just this comparison on the full size.
"""
import argparse, contextlib, os, sys, threading, time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from summary import emit

GOAL_SECONDS, GOAL_BYTES, ALLOWANCE = 15 * 60, 8e9, 1.25
# the families, longest single-shot unit first: joblib hands units out in this order, so the two longest
# start at once and the short ones fill the gaps (measured at 3,000 queries, one thread)
LONGEST_FIRST = ['MLP', 'GraphRouter', 'MIRT', 'RM-Softmax', 'EmbedLLM', 'AvengersPro', 'kNN']
STAGES = ('simulate', 'diagnostics', 'routers', 'views + intervals')
GROWTH_STAGES = STAGES[1:]   # the pipeline; simulate makes its input (timed and shown, not held to the goal)


class PeakMemory:
    "Memory of this process and all its descendants, sampled in a thread: peak PSS and peak RSS."
    def __init__(self, every: float = 0.2):
        self.every, self.peak, self.peak_rss, self._stop = every, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def now(self) -> tuple[int, int]:
        "(PSS, RSS) summed over the process tree: PSS counts a page shared by n processes 1/n times."
        me, pss, rss = psutil.Process(), 0, 0
        for p in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                m = p.memory_full_info()
                pss, rss = pss + m.pss, rss + m.rss
        return pss, rss

    def sample(self):
        pss, rss = self.now()
        self.peak, self.peak_rss = max(self.peak, pss), max(self.peak_rss, rss)

    def _run(self):
        while not self._stop.wait(self.every): self.sample()

    def reset(self): self.peak = self.peak_rss = 0; self.sample()
    def __enter__(self): self._thread.start(); return self
    def __exit__(self, *exc): self._stop.set(); self._thread.join()


class Stopwatch:
    "Wall time and peak memory of each named stage."
    def __init__(self, memory: PeakMemory): self.memory, self.rows = memory, {}

    @contextlib.contextmanager
    def stage(self, name):
        self.memory.reset()
        t = time.perf_counter()
        yield
        self.memory.sample()
        self.rows[name] = dict(seconds=time.perf_counter() - t, peak=self.memory.peak, rss=self.memory.peak_rss)


@contextlib.contextmanager
def timed_bootstrap(spent: list):
    "Add the seconds spent in the protocol's `bootstrap_ci` (in this process) to `spent[0]`."
    import dars_nb.experiments.protocol as protocol
    inner = protocol.bootstrap_ci
    def timed(*a, **kw):
        t = time.perf_counter()
        try: return inner(*a, **kw)
        finally: spent[0] += time.perf_counter() - t
    protocol.bootstrap_ci = timed
    try: yield
    finally: protocol.bootstrap_ci = inner


def build(n_train, n_test, n_models, seed=0):
    "The simulated dataset of one size."
    from dars_nb.experiments.protocol import make_dataset
    from dars_nb.simulate import simulate, widen
    return make_dataset(*simulate(widen('gpqa_like', n_models), n_train=n_train, n_test=n_test, seed=seed))


def routers(names):
    "The named families, unfitted, in the given order."
    from dars_nb.experiments.protocol import available_routers
    return {k: available_routers()[k] for k in names}


def protocol(ds, names, a, n_jobs=None):
    "`run_experiments` of the paper's comparison on `ds` with the named families."
    from dars_nb.experiments.protocol import run_experiments, Spec
    return run_experiments(ds, routers(names), (Spec('single'), Spec('dars')), n_draws=a.draws, n_boot=a.n_boot,
                           n_jobs=n_jobs, progress=False)


def run_size(n_train, n_test, a, memory) -> tuple[dict, pd.DataFrame, object]:
    "Every stage at one size: per stage seconds and peak bytes, the protocol's table, the dataset."
    from dars_nb.diagnostics import diagnose
    from dars_nb.experiments.protocol import protocol_baselines
    from dars_nb.experiments.tables import table1, table_vs_fixed
    watch, boot = Stopwatch(memory), [0.0]
    with watch.stage('simulate'): ds = build(n_train, n_test, a.models)
    with watch.stage('diagnostics'): diagnose(ds.obs)     # one call, timed below as the median of three
    watch.rows['diagnostics']['seconds'] = float(np.median([seconds(diagnose, ds.obs) for _ in range(3)]))
    with timed_bootstrap(boot), watch.stage('routers'): results = protocol(ds, LONGEST_FIRST, a, a.n_jobs)
    in_protocol = boot[0]
    with timed_bootstrap(boot), watch.stage('views + intervals'):
        baselines = protocol_baselines(ds, n_boot=a.n_boot)
        table1(results, baselines), table_vs_fixed(results)
    rows = watch.rows
    rows['routers']['with intervals'] = rows['routers']['seconds']   # what the Dask side is compared with
    rows['routers']['seconds'] -= in_protocol        # the intervals step belongs to the next stage
    rows['views + intervals']['seconds'] += in_protocol
    rows['bootstrap_ci'] = dict(seconds=boot[0], peak=np.nan)
    print(f"  {len(ds.obs):,} rows; " + '; '.join(f"{k} {v['seconds']:.1f} s" for k, v in rows.items()), flush=True)
    return rows, results, ds


def warm_up(a):
    "Start the joblib workers and import every router in them, so that the small size pays no start-up."
    from dars_nb.experiments.protocol import run_experiments, Spec
    run_experiments(build(40, 10, a.models), None, (Spec('single'), Spec('dars')), n_draws=2, n_boot=10,
                    n_jobs=a.n_jobs, progress=False)


def seconds(fn, *args) -> float:
    "Wall seconds of one call."
    t = time.perf_counter(); fn(*args)
    return time.perf_counter() - t


def capability_seconds(ds) -> float:
    "Seconds of `capability_stats` on the training grid (not a stage of the run: for reference)."
    from dars_nb.observations import select
    from dars_nb.stats import capability_stats
    train = select(ds.obs, split='train', view='grid')
    t = time.perf_counter(); capability_stats(train)
    return time.perf_counter() - t


def same_tables(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    "Scalar columns equal exactly, array columns equal element by element."
    from dars_nb.experiments.protocol import scalars, ARRAY_COLUMNS
    try: pd.testing.assert_frame_equal(scalars(a).reset_index(drop=True), scalars(b).reset_index(drop=True),
                                       check_exact=True)
    except AssertionError: return False
    return all(np.array_equal(x, y) for c in ARRAY_COLUMNS for x, y in zip(a[c], b[c]))


def on_dask(ds, names, a) -> tuple[pd.DataFrame, object, list, float]:
    "`run_experiments` on a local Dask cluster of 2 single-threaded processes: table, bytes shipped, warnings, s."
    import warnings, distributed
    import dars_nb.experiments.protocol as protocol_module
    from dars_nb.experiments.cluster import Shipped
    shipped, inner = Shipped(), protocol_module.run_calls
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=':0') as cluster, \
         distributed.Client(cluster, set_as_default=False) as client:
        # the workers import every router first, as joblib's are by `warm_up`
        from dars_nb.experiments.protocol import run_experiments, Spec
        run_experiments(build(40, 10, a.models), None, (Spec('single'),), n_draws=2, n_boot=10, progress=False,
                        scheduler=client)
        protocol_module.run_calls = lambda *args, **kw: inner(*args, shipped=shipped, **kw)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                t = time.perf_counter()
                from dars_nb.experiments.protocol import run_experiments
                table = run_experiments(ds, routers(names), (Spec('single'), Spec('dars')), n_draws=a.draws,
                                        n_boot=a.n_boot, progress=False, scheduler=client)
                secs = time.perf_counter() - t
        finally: protocol_module.run_calls = inner
    return table, shipped, [str(w.message) for w in caught], secs


def dask_check(ds, reference, joblib_seconds, a) -> tuple[bool, str, float, float, object, list]:
    "Identical tables on Dask and through joblib; what ran both ways; seconds each way; bytes shipped; warnings."
    whole = a.dask_routers == ['all']
    names = LONGEST_FIRST if whole else a.dask_routers
    if not whole:                                    # a part: its joblib side runs here too
        t = time.perf_counter()
        reference = protocol(ds, names, a, a.n_jobs)
        joblib_seconds = time.perf_counter() - t
    dask, shipped, caught, secs = on_dask(ds, names, a)
    what = 'the whole protocol' if whole else f"{', '.join(names)} under both supervisions (a part)"
    return same_tables(reference, dask), what, joblib_seconds, secs, shipped, caught


def print_dask(same, what, joblib_seconds, secs, shipped, caught, n_train):
    "The Dask comparison's lines and summary rows."
    large = [m for m in caught if 'large graph' in m]
    ratio = secs / joblib_seconds
    print(f"\nDask (local cluster, 2 processes x 1 thread, scheduler=client), {what}, {n_train:,} queries: "
          f"{secs:.0f} s; joblib (n_jobs = -1, same cores) {joblib_seconds:.0f} s; ratio {ratio:.2f}; "
          f"identical: {'yes' if same else 'no'}")
    print(f"sent to the workers: {shipped.to_workers / 1e6:,.1f} MB = shared {shipped.shared / 1e3:,.1f} kB x "
          f"{shipped.workers} workers + {shipped.tasks} tasks {shipped.task_bytes / 1e3:,.1f} kB "
          f"(largest {shipped.largest_task:,} B); written once for the workers to map (they are on this machine): "
          f"{shipped.mapped / 1e6:,.1f} MB; 'large graph' warnings: {len(large)}")
    emit("scale: Dask cluster against joblib (identical tables)", f"{what}: {'yes' if same else 'no'}",
         'identical', same)
    emit("scale: Dask cluster, bytes to the workers and time against joblib",
         f"{shipped.to_workers / 1e6:,.1f} MB sent ({shipped.shared / 1e3:,.1f} kB shared x {shipped.workers}, tasks "
         f"{shipped.task_bytes / 1e3:,.0f} kB), {shipped.mapped / 1e6:,.0f} MB mapped from one file; "
         f"{len(large)} large-graph warnings; {secs:.0f} s vs joblib "
         f"{joblib_seconds:.0f} s (x{ratio:.2f})", 'no large graph; <= x1.2 of joblib', not large and ratio <= 1.2)


def report(small, full, sizes, bootstrap, capability, held=True):
    "Print the stage table, the totals against the goals and the growth ratios; emit the summary."
    (ns, nts), (nf, ntf) = sizes
    factor = nf / ns
    limit = factor * ALLOWANCE
    t = pd.DataFrame({f'{ns:,} s': {k: small[k]['seconds'] for k in STAGES},
                      f'{nf:,} s': {k: full[k]['seconds'] for k in STAGES},
                      'peak PSS GB': {k: full[k]['peak'] / 1e9 for k in STAGES},
                      'peak RSS GB': {k: full[k]['rss'] / 1e9 for k in STAGES}})
    t['ratio'] = t.iloc[:, 1] / t.iloc[:, 0]
    t['us per query'] = t.iloc[:, 1] / (nf + ntf) * 1e6
    print(f"\nstages ({ns:,} -> {nf:,} training queries, {nts:,} -> {ntf:,} test queries; peaks at {nf:,}):")
    print(t.round(2).to_string())
    total = sum(full[k]['seconds'] for k in STAGES)
    peak, rss = max(full[k]['peak'] for k in STAGES), max(full[k]['rss'] for k in STAGES)
    print(f"\nwhole run at {nf:,} (all four stages): {total / 60:.1f} min (goal <= {GOAL_SECONDS / 60:.0f} min), "
          f"peak {peak / 1e9:.2f} GB PSS (goal <= {GOAL_BYTES / 1e9:.0f} GB; RSS summed over the processes, "
          f"shared pages counted in each: {rss / 1e9:.2f} GB)")
    growth = t.loc[list(GROWTH_STAGES), 'ratio']
    print(f"growth of {', '.join(GROWTH_STAGES)}: x{growth.max():.1f} at most for x{factor:.0f} the queries "
          f"(goal <= x{limit:.1f}: linear plus {ALLOWANCE - 1:.0%}); simulate (making the data, outside the goal) "
          f"x{t.loc['simulate', 'ratio']:.1f}")
    print(f"inside these stages: bootstrap_ci {bootstrap:.1f} s; capability_stats on the training grid "
          f"(not called by these stages) {capability:.1f} s")
    emit(f"scale: whole run, {nf:,} + {ntf:,} queries x 11 models (time, peak memory)",
         f"{total / 60:.1f} min, {peak / 1e9:.2f} GB PSS ({rss / 1e9:.2f} GB RSS); "
         + ', '.join(f"{k} {full[k]['seconds']:.0f} s" for k in STAGES),
         '<= 15 min, <= 8 GB on 2 cores' if held else '', bool(total <= GOAL_SECONDS and peak <= GOAL_BYTES) if held else None)
    emit(f"scale: growth {ns:,} -> {nf:,} training queries, per stage",
         ', '.join(f"{k} x{r:.1f}" for k, r in growth.items()),
         f"<= x{limit:.1f} (linear + {ALLOWANCE - 1:.0%})", bool((growth <= limit).all()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--train', type=int, default=30000, help='training queries of the full size')
    ap.add_argument('--test', type=int, default=6000, help='test queries of the full size')
    ap.add_argument('--small-train', type=int, default=3000, help='training queries of the small size')
    ap.add_argument('--small-test', type=int, default=600, help='test queries of the small size')
    ap.add_argument('--models', type=int, default=11, help='models in the pool')
    ap.add_argument('--draws', type=int, default=100, help='R, single-shot draws per router')
    ap.add_argument('--n-boot', type=int, default=1000, help='bootstrap resamples')
    ap.add_argument('--n-jobs', type=int, default=-1, help='joblib workers of the protocol (-1: every core)')
    ap.add_argument('--dask-routers', nargs='*', default=['kNN', 'AvengersPro'],
                    help="routers run through Dask too ('all': the whole protocol; 'none' or nothing: skip)")
    ap.add_argument('--dask-only', action='store_true', help='only the Dask comparison, on the full size')
    ap.add_argument('--quick', action='store_true', help='smoke run: 600 -> 3,000 training queries, R = 10')
    a = ap.parse_args(argv)
    if a.quick: a.train, a.test, a.small_train, a.small_test, a.draws, a.n_boot = 3000, 600, 600, 120, 10, 200
    print(f"{os.cpu_count()} cores; load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"R = {a.draws}, {a.n_boot} bootstrap resamples, n_jobs = {a.n_jobs}", flush=True)
    if a.dask_only:
        warm_up(a)
        ds, results, joblib_seconds = build(a.train, a.test, a.models), None, None
        a.dask_routers = [r for r in a.dask_routers if r != 'all'] or ['kNN', 'AvengersPro']
    else:
        with PeakMemory() as memory:
            warm_up(a)
            print(f"small: {a.small_train:,} + {a.small_test:,} queries", flush=True)
            small, _, _ = run_size(a.small_train, a.small_test, a, memory)
            print(f"full: {a.train:,} + {a.test:,} queries", flush=True)
            full, results, ds = run_size(a.train, a.test, a, memory)
        report(small, full, ((a.small_train, a.small_test), (a.train, a.test)), full['bootstrap_ci']['seconds'],
               capability_seconds(ds), held=(a.train, a.test, a.draws) == (30000, 6000, 100))
        joblib_seconds = full['routers']['with intervals']
    if a.dask_routers and a.dask_routers != ['none']:
        print_dask(*dask_check(ds, results, joblib_seconds, a), a.train)
    print(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == '__main__':
    main()
