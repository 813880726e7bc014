"""capability_stats vs the pandas groupby a user would write, on the same validated table.

Run: .venv/bin/python bench/bench_stats.py [--queries 100000] [--models 8] [--grid 5] [--reps 3]
Prints wall time (median of --reps), peak extra memory (tracemalloc) and the ratios.
"""
import argparse, gc, statistics, time, tracemalloc

import numpy as np
import pandas as pd

from dars_nb.stats import capability_stats

from summary import emit


def make_table(n_queries, n_models, side, seed=0):
    "A validated-shape observation table (categorical keys) built directly with numpy."
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


def pandas_stats(obs):
    "What a user would write with pandas: mean and (sample) std of score and cost per pair — less than `capability_stats` computes."
    g = obs.groupby(['dataset', 'query_id', 'model'], observed=True)[['score', 'cost']]
    return g.agg(['mean', 'std'])


def measure(fns, obs, reps):
    "Per function: median wall time over `reps` rounds that alternate the functions, then the peak traced memory of one more run."
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            gc.collect()
            t = time.perf_counter(); fn(obs); times[name].append(time.perf_counter() - t)
    out = []
    for name, fn in fns.items():
        gc.collect(); tracemalloc.start()
        fn(obs)
        out.append((statistics.median(times[name]), tracemalloc.get_traced_memory()[1])); tracemalloc.stop()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--queries', type=int, default=100_000)
    ap.add_argument('--models', type=int, default=8)
    ap.add_argument('--grid', type=int, default=5)
    ap.add_argument('--reps', type=int, default=3)
    a = ap.parse_args(argv)
    obs = make_table(a.queries, a.models, a.grid)
    size = obs.memory_usage(deep=False).sum()
    side_by_side = {'capability_stats': capability_stats, 'pandas': pandas_stats}
    (t_ours, m_ours), (t_pd, m_pd) = measure(side_by_side, obs, a.reps)
    shuffled = obs.sample(frac=1, random_state=0).reset_index(drop=True)  # same table, rows in random order
    (t_sh, m_sh), (t_pd_sh, m_pd_sh) = measure(side_by_side, shuffled, a.reps)
    del shuffled
    rows = [('capability_stats (dense numpy)', t_ours, m_ours), ('pandas groupby mean/std', t_pd, m_pd),
            ('capability_stats, shuffled rows', t_sh, m_sh), ('pandas groupby, shuffled rows', t_pd_sh, m_pd_sh)]
    print(f"table: {len(obs):,} rows ({a.queries:,} queries x {a.models} models x {a.grid * a.grid}), "
          f"{size / 2**20:,.0f} MiB in memory; median of {a.reps}")
    print(f"{'method':34s} {'seconds':>9s} {'peak MiB':>9s} {'peak / input':>13s}")
    for name, t, m in rows:
        print(f"{name:34s} {t:9.2f} {m / 2**20:9.0f} {m / size:13.2f}")
    print(f"speed-up of capability_stats over pandas: {t_pd / t_ours:.1f}x in key order, "
          f"{t_pd_sh / t_sh:.1f}x on shuffled rows (goal >= 3x); capability_stats peak memory "
          f"{m_ours / size:.2f}x / {m_sh / size:.2f}x the input (goal <= 2x)")
    emit(f"capability_stats vs pandas groupby, {a.queries:,} queries x {a.models} models x {a.grid * a.grid}",
         f"{t_ours:.2f} s vs {t_pd:.2f} s ({t_pd / t_ours:.1f}x) in key order; {t_sh:.2f} s vs {t_pd_sh:.2f} s "
         f"({t_pd_sh / t_sh:.1f}x) shuffled; peak memory {m_ours / size:.2f}x / {m_sh / size:.2f}x the input",
         '>= 3x, <= 2x memory (key order)', bool(t_pd / t_ours >= 3 and max(m_ours, m_sh) / size <= 2))
    return dict(seconds=t_ours, pandas_seconds=t_pd, speedup=t_pd / t_ours, speedup_shuffled=t_pd_sh / t_sh,
                memory_ratio=m_ours / size, memory_ratio_shuffled=m_sh / size)


if __name__ == '__main__':
    main()
