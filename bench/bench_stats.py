"""capability_stats vs the pandas groupby a user would write, on the same validated table, in three row layouts.

Run: .venv/bin/python bench/bench_stats.py [--queries 10000 40000 100000] [--models 8] [--grid 5] [--reps 3]
Each size (queries x models x grid²  rows) is measured in three layouts of the same observations:
  key order  - rows sorted by (query, model, rewrite, sample), query ids that sort like the rows;
  grouped    - one block per (query, model), but query ids "0" ... "N-1" (so "10" sorts before "2")
               in numeric row order and the models in a random order inside each query;
  shuffled   - the grouped table's rows in random order.
Prints wall time (best and median of --reps rounds that alternate ours and pandas), the ratio of the
best times, and the peak extra memory (tracemalloc) as a multiple of the table's own memory.
"""
import argparse, gc, statistics, time, tracemalloc

import numpy as np
import pandas as pd

from dars_nb.stats import capability_stats
from dars_nb.grid_sums import pair_blocks

from summary import emit

GOALS = {'key order': 3.0, 'grouped': 3.0, 'shuffled': 2.0}  # speed-up over pandas, at least
MEMORY_GOAL = 1.0  # peak extra memory of capability_stats, at most this multiple of the table


def make_table(n_queries, n_models, side, seed=0):
    "A validated-shape observation table (categorical keys) in key order, built directly with numpy."
    rng = np.random.default_rng(seed)
    cells = side * side
    n = n_queries * n_models * cells
    q = np.repeat(np.arange(n_queries, dtype=np.int32), n_models * cells)
    m = np.tile(np.repeat(np.arange(n_models, dtype=np.int8), cells), n_queries)
    r = np.tile(np.repeat(np.arange(1, side + 1, dtype=np.int32), side), n_queries * n_models)
    s = np.tile(np.arange(side, dtype=np.int32), n_queries * n_models * side)
    cat = lambda codes, names: pd.Categorical.from_codes(codes, categories=names)
    return pd.DataFrame({
        'dataset': cat(np.zeros(n, np.int8), ['bench']),
        'split': cat(np.zeros(n, np.int8), ['train']),
        'view': cat(np.zeros(n, np.int8), ['grid']),
        'query_id': cat(q, [f'q{i:06d}' for i in range(n_queries)]),
        'model': cat(m, [f'model{j}' for j in range(n_models)]),
        'rewrite_id': r, 'sample_id': s,
        'score': (rng.random(n) < 0.6).astype(float),
        'cost': rng.gamma(2.0, 1e-4, n),
    })


def regroup(obs, n_queries, n_models, seed=1):
    "The same table with query ids '0' ... 'N-1' (sorted as strings, as `validate` sorts them) and each query's models in a random order."
    names = np.array([str(i) for i in range(n_queries)])
    order = np.argsort(names, kind='stable')
    rank = np.empty(n_queries, np.int32)
    rank[order] = np.arange(n_queries)                          # category code of query i's name
    block = len(obs) // (n_queries * n_models)
    models = np.argsort(np.random.default_rng(seed).random((n_queries, n_models)), 1).astype(np.int8)
    obs['query_id'] = pd.Categorical.from_codes(np.repeat(rank, n_models * block), categories=names[order])
    obs['model'] = pd.Categorical.from_codes(np.repeat(models.ravel(), block), categories=obs['model'].cat.categories)
    return obs


def pandas_stats(obs):
    "What a user would write with pandas: mean and (sample) std of score and cost per pair — less than `capability_stats` computes."
    g = obs.groupby(['dataset', 'query_id', 'model'], observed=True)[['score', 'cost']]
    return g.agg(['mean', 'std'])


def measure(fns, obs, reps):
    "Per function: (best, median) wall time over `reps` rounds that alternate the functions, then the peak traced memory of one more run."
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            gc.collect()
            t = time.perf_counter(); fn(obs); times[name].append(time.perf_counter() - t)
    out = {}
    for name, fn in fns.items():
        gc.collect(); tracemalloc.start()
        fn(obs)
        peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
        out[name] = (min(times[name]), statistics.median(times[name]), peak)
    return out


def layouts(n_queries, n_models, side):
    "(name, table) for the three layouts, built one after the other so that one table is alive at a time."
    obs = make_table(n_queries, n_models, side)
    yield 'key order', obs
    obs = regroup(obs, n_queries, n_models)
    yield 'grouped', obs
    obs = obs.sample(frac=1, random_state=0).reset_index(drop=True)
    yield 'shuffled', obs


def bench_size(n_queries, n_models, side, reps):
    "Measure the three layouts at one size; print a table and emit one summary line."
    rows, size = [], None
    fns = {'ours': capability_stats, 'pandas': pandas_stats}
    for name, obs in layouts(n_queries, n_models, side):
        size = obs.memory_usage(deep=True).sum()
        route = 'blocks' if pair_blocks(obs) is not None else 'bincount'
        m = measure(fns, obs, reps)
        speedup = m['pandas'][0] / m['ours'][0]
        memory = m['ours'][2] / size
        met = speedup >= GOALS[name] and memory <= MEMORY_GOAL
        rows.append((name, route, m, speedup, memory, met))
        del obs; gc.collect()
    n = n_queries * n_models * side * side
    print(f"\n{n:,} rows ({n_queries:,} queries x {n_models} models x {side * side}), "
          f"{size / 2**20:,.0f} MiB in memory; best / median of {reps}")
    print(f"{'layout':10s} {'route':9s} {'ours s':>13s} {'pandas s':>13s} {'ratio':>6s} {'goal':>5s} "
          f"{'ours mem':>9s} {'pandas mem':>10s}  goals")
    for name, route, m, speedup, memory, met in rows:
        (tb, tm, _), (pb, pm, pmem) = m['ours'], m['pandas']
        print(f"{name:10s} {route:9s} {tb:6.3f}/{tm:6.3f} {pb:6.3f}/{pm:6.3f} {speedup:5.1f}x {GOALS[name]:4.0f}x "
              f"{memory:8.2f}x {pmem / size:9.2f}x  {'met' if met else 'not met'}")
    emit(f"capability_stats vs pandas groupby, {n / 1e6:g} M rows",
         '; '.join(f"{name} {m['ours'][0]:.2f} s vs {m['pandas'][0]:.2f} s ({speedup:.1f}x, memory {memory:.2f}x)"
                   for name, _, m, speedup, memory, _ in rows),
         '>= 3x key order and grouped, >= 2x shuffled; memory <= 1x the input', all(r[-1] for r in rows))
    return {name: dict(speedup=speedup, memory_ratio=memory, met=met) for name, _, _, speedup, memory, met in rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--queries', type=int, nargs='+', default=[10_000, 40_000, 100_000],
                    help='sizes, in queries (8 models x 25 cells: 2 M, 8 M, 20 M rows)')
    ap.add_argument('--models', type=int, default=8)
    ap.add_argument('--grid', type=int, default=5)
    ap.add_argument('--reps', type=int, default=3)
    a = ap.parse_args(argv)
    print(f"goals: capability_stats >= {GOALS['grouped']:.0f}x pandas on grouped rows (key order or not), "
          f">= {GOALS['shuffled']:.0f}x on shuffled rows, peak extra memory <= {MEMORY_GOAL:.0f}x the table")
    return {n: bench_size(n, a.models, a.grid, a.reps) for n in a.queries}


if __name__ == '__main__':
    main()
