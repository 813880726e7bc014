"""How the four diagnostics grow with the number of queries (10k -> 1M), on the dense training grid.

Run: .venv/bin/python bench/bench_diagnostics.py [--sizes 10000 100000 1000000] [--reps 3]
Prints the median seconds per diagnostic and size, the time per query (flat = linear), and the four
diagnostics one after another against `diagnose`'s single pass over the grid (winners and grid statistics
computed once per block).
"""
import argparse, statistics, time

import numpy as np
import pandas as pd

from dars_nb.observations import Dense
from summary import emit
from dars_nb.diagnostics import (outcome_instability, winner_flip_rate, single_vs_da_disagreement,
                                 uncertainty_decomposition, _diagnose_grid)

DIAGNOSTICS = {'outcome_instability': outcome_instability, 'winner_flip_rate': winner_flip_rate,
               'single_vs_da_disagreement': single_vs_da_disagreement,
               'uncertainty_decomposition': uncertainty_decomposition}


def make_grid(n_queries, n_models=6, side=5, seed=0):
    "A binary-score 5x5 grid per (query, model) with realistic per-pair success rates."
    rng = np.random.default_rng(seed)
    p = rng.beta(0.7, 0.7, (n_queries, n_models, 1, 1))
    q = (rng.random((n_queries, n_models, side, side)) < p).astype(float)
    c = rng.gamma(2.0, 0.1, (1, n_models, 1, 1)) * rng.lognormal(0, 0.3, q.shape)
    c /= c.max()
    queries = pd.MultiIndex.from_arrays([np.repeat('bench', n_queries), np.arange(n_queries).astype(str)])
    return Dense(queries, [f'm{i}' for i in range(n_models)], np.arange(1, side + 1), np.arange(side),
                 {'score': q, 'cost_norm': c})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--sizes', type=int, nargs='+', default=[10_000, 100_000, 1_000_000])
    ap.add_argument('--reps', type=int, default=3)
    a = ap.parse_args(argv)
    rows = []
    for n in a.sizes:
        grid = make_grid(n)
        for name, fn in DIAGNOSTICS.items():
            times = []
            for _ in range(a.reps if n < 1_000_000 else 1):
                t = time.perf_counter(); fn(grid); times.append(time.perf_counter() - t)
            rows.append(dict(diagnostic=name, queries=n, seconds=statistics.median(times)))
        times = []
        for _ in range(a.reps if n < 1_000_000 else 1):
            t = time.perf_counter(); _diagnose_grid(grid['score'], grid['cost_norm']); times.append(time.perf_counter() - t)
        rows.append(dict(diagnostic='diagnose (one pass)', queries=n, seconds=statistics.median(times)))
        del grid
    t = pd.DataFrame(rows)
    one = t[t.diagnostic == 'diagnose (one pass)'].set_index('queries')['seconds']
    t = t[t.diagnostic != 'diagnose (one pass)']
    four = t.groupby('queries')['seconds'].sum()
    print("the four one after another vs diagnose's one pass (seconds):",
          ', '.join(f"{q:,}: {four[q]:.2f} vs {one[q]:.2f} (x{four[q] / one[q]:.2f})" for q in four.index))
    t['microseconds_per_query'] = t['seconds'] / t['queries'] * 1e6
    print(f"diagnostics on dense 6-model 5x5 grids (median of {a.reps}; 1 run at 1M queries)")
    print(t.pivot(index='diagnostic', columns='queries', values='seconds').round(3).to_string())
    growth = t.pivot(index='diagnostic', columns='queries', values='microseconds_per_query')
    ratio = growth[growth.columns[-1]] / growth[growth.columns[0]]
    print("time per query, largest / smallest size (1.0 = exactly linear):")
    print(ratio.round(2).to_string())
    sizes = f"{growth.columns[0]:,} -> {growth.columns[-1]:,} queries"
    emit(f"diagnostics, {sizes} (dense 6-model 5x5 grids)",
         f"time per query changes {ratio.min():.2f}-{ratio.max():.2f}x over {growth.columns[-1] // growth.columns[0]}x the queries; "
         f"at {growth.columns[-1]:,}: " + ', '.join(f"{k} {v:.2f} s" for k, v in
                                                    t[t.queries == growth.columns[-1]].set_index('diagnostic')['seconds'].items()),
         'linear (per-query time flat)', bool(ratio.max() <= 1.5))
    return t


if __name__ == '__main__':
    main()
