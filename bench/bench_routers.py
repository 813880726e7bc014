"""Batched single-shot draws against the plain loop, for every router family, on the same draws.

Run: .venv/bin/python bench/bench_routers.py [--draws 100] [--reps 3] [--budget 120] [--only MIRT ...] [--quick]

The paper's protocol trains every router on R = 100 single-shot draws. Each family can fit all R
draws together (`batched=True`: one geometry for kNN and AvengersPro, an ensemble axis for the torch
routers, shared hidden layers for the MLP) or one after another (`batched=False`). This script fits
both ways on the same draws of `simulate('gpqa_like')` at the paper's sizes (200 training queries,
250 test queries, 6 models) and prints, per family: wall times (median over repetitions), the
speed-up loop / batched, and the mean test utility of the R routers under the rewrite and decode
views for both ways — U = mean over test queries of the mean over the view's rows of
score − 0.05·cost_norm, cost normalised once over the whole table. `se` is the standard error of the
loop's mean over the R draws: a batched−loop difference within about two of it is noise.

A measurement, not a test: the machine may be shared, so the two ways of one family are timed
side by side, alternating, in one process. A family whose first repetition exceeds `--budget`
seconds is measured once (the `reps` column says how often each was).
"""
import argparse, importlib, statistics, time

import numpy as np
import pandas as pd

from dars_nb.simulate import simulate
from dars_nb.stats import supervision, normalize_cost
from dars_nb.observations import select, to_dense
from dars_nb.routers.base import align

FAMILIES = [  # (paper name, module, class)
    ('MLP', 'dars_nb.routers.mlp', 'MLPRouter'),
    ('kNN', 'dars_nb.routers.knn', 'KNNRouter'),
    ('MIRT', 'dars_nb.routers.mirt', 'MIRTRouter'),
    ('EmbedLLM', 'dars_nb.routers.embedllm', 'EmbedLLMRouter'),
    ('RM-Softmax', 'dars_nb.routers.rmsoftmax', 'RMSoftmaxRouter'),
    ('GraphRouter', 'dars_nb.routers.graph', 'GraphRouter'),
    ('AvengersPro', 'dars_nb.routers.avengers', 'AvengersProRouter'),
]
TORCH = {'MIRT', 'EmbedLLM', 'RM-Softmax', 'GraphRouter'}


def world(profile='gpqa_like', n_draws=100, seed=0, lam=0.05):
    "Training features, R single-shot draws, and per view: test features and the (n, K) view utility."
    obs, feats, _ = simulate(profile, n_train=200, n_test=250, seed=seed)
    obs = normalize_cost(obs)                      # once, over train and test together
    single = supervision(obs, 'single', n_draws=n_draws, seed=seed + 1, lam=lam)
    views = {}
    for view in ('rewrite', 'decode'):
        d = to_dense(select(obs, split='test', view=view), columns=('score', 'cost_norm'), models=single.models)
        u = d['score'] - lam * d['cost_norm']
        views[view] = (align(feats, d.queries.get_level_values(-1)), np.nanmean(u.reshape(*u.shape[:2], -1), -1))
    return align(feats, single.query_ids), single, views


def test_utility(router, views):
    "Mean test utility of every draw: {view: (R,)}."
    out = {}
    for view, (X, U) in views.items():
        S = router.predict_utility(X)
        pick = S.reshape(-1, *S.shape[-2:]).argmax(-1)
        out[view] = np.take_along_axis(U[None], pick[..., None], -1)[..., 0].mean(-1)
    return out


def make(cls, batched):
    "The family with default settings, `batched` set, and `random_state=0` where it has one."
    kw = {'random_state': 0} if 'random_state' in cls().get_params() else {}
    return cls(batched=batched, **kw)


def timed_fit(cls, batched, X, sup):
    t = time.perf_counter()
    r = make(cls, batched).fit(X, sup)
    return time.perf_counter() - t, r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--draws', type=int, default=100, help='R, single-shot draws per fit')
    ap.add_argument('--reps', type=int, default=3, help='repetitions per way (median reported)')
    ap.add_argument('--budget', type=float, default=120.0, help='seconds: a family slower than this is measured once')
    ap.add_argument('--only', nargs='*', help='paper names of the families to run')
    ap.add_argument('--quick', action='store_true', help='smoke run: 20 draws, one repetition')
    a = ap.parse_args(argv)
    if a.quick: a.draws, a.reps = 20, 1
    X, single, views = world(n_draws=a.draws)
    print(f"gpqa_like, 200 train / 250 test queries, {len(single.models)} models, R = {a.draws} single-shot draws\n", flush=True)
    rows = []
    for name, module, cls_name in FAMILIES:
        if a.only and name not in a.only: continue
        try: cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError) as e:
            print(f"{name}: skipped ({module}.{cls_name} not importable: {e})", flush=True); continue
        make(cls, True).fit(X, single.draw(0))                           # warm-up (imports, first-call costs)
        times = {True: [], False: []}
        for rep in range(a.reps):
            for batched in (True, False):
                seconds, router = timed_fit(cls, batched, X, single)
                times[batched].append(seconds)
                if rep == 0: times[f'u{batched}'] = test_utility(router, views)
            if rep == 0 and times[True][0] + times[False][0] > a.budget: break
        tb, tl = statistics.median(times[True]), statistics.median(times[False])
        ub, ul = times['uTrue'], times['uFalse']
        row = dict(router=name, reps=len(times[True]), batched_s=tb, loop_s=tl, speedup=tl / tb)
        for view in views:
            row[f'{view}_batched'], row[f'{view}_loop'] = ub[view].mean(), ul[view].mean()
            row[f'{view}_se'] = ul[view].std(ddof=1) / np.sqrt(len(ul[view])) if len(ul[view]) > 1 else np.nan
        rows.append(row)
        print(f"{name}: batched {tb:.2f} s, loop {tl:.2f} s ({tl / tb:.1f}x); "
              f"U_rew {row['rewrite_batched']:.4f} / {row['rewrite_loop']:.4f}, "
              f"U_dec {row['decode_batched']:.4f} / {row['decode_loop']:.4f}", flush=True)
    if not rows: return
    t = pd.DataFrame(rows).set_index('router')
    print("\nwall time (median seconds), speed-up loop / batched, and mean test utility over the R draws")
    print(t.round({'batched_s': 2, 'loop_s': 2, 'speedup': 1, **{c: 4 for c in t.columns if c.startswith(('rewrite', 'decode'))}}).to_string())
    torch_rows = t.loc[t.index.isin(TORCH)]
    if len(torch_rows):
        print(f"\ntorch routers: speed-up {torch_rows.speedup.min():.1f}x to {torch_rows.speedup.max():.1f}x (goal >= 10x); "
              f"largest |batched - loop| utility gap {np.abs(torch_rows[[c + '_batched' for c in views]].to_numpy() - torch_rows[[c + '_loop' for c in views]].to_numpy()).max():.4f}")


if __name__ == '__main__':
    main()
