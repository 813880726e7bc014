"""Batched single-shot draws against the plain loop, for every router family, on the same draws.

Run: .venv/bin/python bench/bench_routers.py [--draws 100] [--reps 3] [--budget 120] [--threads all 1] [--only MIRT ...] [--quick]

The paper's protocol trains every router on R = 100 single-shot draws. Each family can fit all R
draws together (`batched=True`: one geometry for kNN and AvengersPro, an ensemble axis for the torch
routers, shared hidden layers for the MLP) or one after another (`batched=False`). This script fits
both ways on the same draws of `simulate('gpqa_like')` at the paper's sizes (200 training queries,
250 test queries, 6 models) and prints, per family: wall times (median over repetitions), the
speed-up loop / batched, and the mean test utility of the R routers under the rewrite and decode
views for both ways — U = mean over test queries of the mean over the view's rows of
score − 0.05·cost_norm, cost normalised once over the whole table. `se` is the standard error of the
loop's mean over the R draws: a batched−loop difference within about two of it is noise.

Both ways run under the same thread setting, once per `--threads` value: `all` is the library's
default (torch's and the BLAS libraries' own setting, all cores unless the environment limits
them), a number caps torch, BLAS and OpenMP to that many threads. A step of one router is too
small to split across threads, so the loop gains nothing from more cores; a batched step can.

A measurement, not a test: the machine may be shared, so the two ways of one family are timed
side by side, alternating, in one process. A family whose first repetition exceeds `--budget`
seconds is measured once (the `reps` column says how often each was).
"""
import argparse, contextlib, statistics, time

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits

from dars_nb.simulate import simulate
from dars_nb.stats import supervision, normalize_cost
from dars_nb.observations import select
from dars_nb.evaluate import per_query_view_utility
from dars_nb.evaluate.draws import draw_view_utilities
from dars_nb.routers import FAMILIES, align

from summary import emit

TORCH = {f.name for f in FAMILIES if f.extra == 'torch'}


def world(profile='gpqa_like', n_draws=100, seed=0, lam=0.05):
    "Training features, R single-shot draws, test features, and per view the (n, K) table of test utilities."
    obs, feats, _ = simulate(profile, n_train=200, n_test=250, seed=seed)
    obs = normalize_cost(obs)                      # once, over train and test together
    single = supervision(obs, 'single', n_draws=n_draws, seed=seed + 1, lam=lam)
    test = select(obs, split='test')
    tables = {v: per_query_view_utility(test, v, lam, models=single.models) for v in ('rewrite', 'decode')}
    ids = tables['rewrite'].index
    tables = {v: t.loc[ids] for v, t in tables.items()}   # one query order for both views
    return align(feats, single.query_ids), single, align(feats, ids), tables


def make(cls, batched):
    "The family with default settings, `batched` set, and `random_state=0` where it has one."
    kw = {'random_state': 0} if 'random_state' in cls().get_params() else {}
    return cls(batched=batched, **kw)


@contextlib.contextmanager
def threads(n):
    "Cap torch, BLAS and OpenMP at `n` threads inside the block (None: leave every setting alone)."
    if n is None: yield; return
    before = torch.get_num_threads()
    with threadpool_limits(n):
        torch.set_num_threads(n)
        try: yield
        finally: torch.set_num_threads(before)


def timed_fit(cls, batched, X, sup):
    t = time.perf_counter()
    r = make(cls, batched).fit(X, sup)
    return time.perf_counter() - t, r


def measure(name, cls, X, single, X_test, tables, reps, budget) -> dict:
    "Batched and loop fits of one family, alternating: median wall times and mean test utilities."
    times, utils = {True: [], False: []}, {}
    for rep in range(reps):
        for batched in (True, False):
            seconds, router = timed_fit(cls, batched, X, single)
            times[batched].append(seconds)
            if rep == 0: utils[batched] = draw_view_utilities(router, X_test, tables)
        if rep == 0 and times[True][0] + times[False][0] > budget: break
    tb, tl = statistics.median(times[True]), statistics.median(times[False])
    row = dict(router=name, reps=len(times[True]), batched_s=tb, loop_s=tl, speedup=tl / tb)
    for view in tables:
        ul = utils[False][view]
        row[f'{view}_batched'], row[f'{view}_loop'] = utils[True][view].mean(), ul.mean()
        row[f'{view}_se'] = ul.std(ddof=1) / np.sqrt(len(ul)) if len(ul) > 1 else np.nan
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--draws', type=int, default=100, help='R, single-shot draws per fit')
    ap.add_argument('--reps', type=int, default=3, help='repetitions per way (median reported)')
    ap.add_argument('--budget', type=float, default=120.0, help='seconds: a family slower than this is measured once')
    ap.add_argument('--threads', nargs='*', default=['all', '1'], help="thread settings to measure: 'all' (the default) and/or numbers")
    ap.add_argument('--only', nargs='*', help='paper names of the families to run')
    ap.add_argument('--quick', action='store_true', help='smoke run: 20 draws, one repetition')
    a = ap.parse_args(argv)
    if a.quick: a.draws, a.reps = 20, 1
    X, single, X_test, tables = world(n_draws=a.draws)
    print(f"gpqa_like, 200 train / 250 test queries, {len(single.models)} models, R = {a.draws} single-shot draws\n", flush=True)
    settings = [None if t == 'all' else int(t) for t in a.threads]
    rows = []
    for family in FAMILIES:
        name = family.name
        if a.only and name not in a.only: continue
        try: cls = family.load()
        except (ImportError, AttributeError) as e:
            print(f"{name}: skipped ({family.module}.{family.class_name} not importable: {e})", flush=True); continue
        make(cls, True).fit(X, single.draw(0))                           # warm-up (imports, first-call costs)
        for n in settings:
            with threads(n): rows.append(measure(name, cls, X, single, X_test, tables, a.reps, a.budget))
            rows[-1]['threads'] = 'all' if n is None else str(n)
            r = rows[-1]
            print(f"{name} ({r['threads']} threads): batched {r['batched_s']:.2f} s, loop {r['loop_s']:.2f} s ({r['speedup']:.1f}x); "
                  f"U_rew {r['rewrite_batched']:.4f} / {r['rewrite_loop']:.4f}, "
                  f"U_dec {r['decode_batched']:.4f} / {r['decode_loop']:.4f}", flush=True)
    if not rows: return
    t = pd.DataFrame(rows).set_index(['router', 'threads'])
    print("\nwall time (median seconds), speed-up loop / batched, and mean test utility over the R draws")
    print(t.round({'batched_s': 2, 'loop_s': 2, 'speedup': 1, **{c: 4 for c in t.columns if c.startswith(('rewrite', 'decode'))}}).to_string())
    for setting, g in t.loc[t.index.get_level_values('router').isin(TORCH)].groupby(level='threads'):
        gap = np.abs(g[[c + '_batched' for c in tables]].to_numpy() - g[[c + '_loop' for c in tables]].to_numpy()).max()
        print(f"\ntorch routers, {setting} threads: speed-up {g.speedup.min():.1f}x to {g.speedup.max():.1f}x (goal >= 10x "
              f"at the default, 'all'); largest |batched - loop| utility gap {gap:.4f}")
        speedups = ', '.join(f"{r} {v:.1f}x" for (r, _), v in g.speedup.items())
        emit(f"batched vs loop single-shot training, R = {a.draws}, torch routers, {setting} threads"
             + (" (the default)" if setting == 'all' else ''),
             f"{speedups}; utility gap <= {gap:.4f}", '>= 10x at the default' if setting == 'all' else '',
             bool(g.speedup.min() >= 10) if setting == 'all' else None)
    other = t.loc[~t.index.get_level_values('router').isin(TORCH)]
    if len(other):
        gaps = np.abs(other[[c + '_batched' for c in tables]].to_numpy() - other[[c + '_loop' for c in tables]].to_numpy()).max(1)
        speed = lambda r: 'both < 0.01 s' if max(r.batched_s, r.loop_s) < 0.01 else f"{r.speedup:.1f}x"
        emit(f"batched vs loop, R = {a.draws}, other families",
             '; '.join(f"{name} ({n} threads) {speed(r)}, utility gap {gap:.4f}"
                       for ((name, n), r), gap in zip(other.iterrows(), gaps)))


if __name__ == '__main__':
    main()
