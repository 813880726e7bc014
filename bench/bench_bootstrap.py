"""Bootstrap intervals of a protocol-sized evaluation: n_boot resamples x test queries x routers x views.

Run: .venv/bin/python bench/bench_bootstrap.py [--queries 6000] [--routers 7] [--views 2] [--boot 1000] [--reps 3]
Per view, the evaluation bootstraps every router's per-query utility and its paired difference to the
best fixed model (one `bootstrap_ci` call on a queries x 2·routers matrix, as `utility_table` and the
protocol do). Measured side by side with a multinomial-count bootstrap of the same work
(two calls per view, the same work); wall time best and median of --reps alternating rounds.
"""
import argparse, gc, statistics, time, tracemalloc

import numpy as np

from dars_nb.evaluate.bootstrap import bootstrap_ci

from summary import emit

GOAL_SECONDS = 2.0


def multinomial_ci(v, n_boot=1000, alpha=0.05, seed=0):
    "The former bootstrap: multinomial counts per resample, then one matrix product (for comparison)."
    rng, n = np.random.default_rng(seed), len(v)
    counts = rng.multinomial(n, np.full(n, 1 / n), size=n_boot)
    return np.quantile(counts @ v / n, [alpha / 2, 1 - alpha / 2], axis=0)


def tables(n_queries, n_routers, n_views, seed=0):
    "Per view: (routers' per-query utilities (n, routers), the reference model's (n,))."
    rng = np.random.default_rng(seed)
    # the mean of 3 scored observations minus a small cost, as a view's per-query utility
    util = lambda *shape: rng.binomial(3, 0.6, shape) / 3 - 0.05 * rng.random(shape)
    return [(util(n_queries, n_routers), util(n_queries)) for _ in range(n_views)]


def ours(views, n_boot):
    "Utilities and paired differences to the reference in one call per view."
    return [bootstrap_ci(np.column_stack([P, P - ref[:, None]]), n_boot, seed=i) for i, (P, ref) in enumerate(views)]


def multinomial(views, n_boot):
    "The multinomial bootstrap, called as the protocol called it: utilities, then differences, per view."
    return [(multinomial_ci(P, n_boot, seed=i), multinomial_ci(P - ref[:, None], n_boot, seed=i))
            for i, (P, ref) in enumerate(views)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--queries', type=int, default=6000)
    ap.add_argument('--routers', type=int, default=7)
    ap.add_argument('--views', type=int, default=2)
    ap.add_argument('--boot', type=int, default=1000)
    ap.add_argument('--reps', type=int, default=3)
    a = ap.parse_args(argv)
    views = tables(a.queries, a.routers, a.views)
    times = {'ours': [], 'multinomial': []}
    for _ in range(a.reps):
        for name, fn in (('ours', ours), ('multinomial', multinomial)):
            gc.collect()
            t = time.perf_counter(); fn(views, a.boot); times[name].append(time.perf_counter() - t)
    gc.collect(); tracemalloc.start(); ours(views, a.boot)
    peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    best, median = {k: min(v) for k, v in times.items()}, {k: statistics.median(v) for k, v in times.items()}
    case = f"{a.boot:,} resamples x {a.queries:,} queries x {a.routers} routers x {a.views} views"
    print(f"{case} (utilities and paired differences); best / median of {a.reps}")
    print(f"{'method':34s} {'best s':>8s} {'median s':>9s}")
    print(f"{'bootstrap_ci (index resampling)':34s} {best['ours']:8.3f} {median['ours']:9.3f}")
    print(f"{'multinomial counts':34s} {best['multinomial']:8.3f} {median['multinomial']:9.3f}")
    met = best['ours'] <= GOAL_SECONDS
    print(f"bootstrap_ci: {best['ours']:.2f} s (goal <= {GOAL_SECONDS:.0f} s: {'met' if met else 'not met'}), "
          f"{best['multinomial'] / best['ours']:.1f}x faster than multinomial counts; peak memory {peak / 2**20:.0f} MiB")
    emit(f"bootstrap intervals, {case}",
         f"{best['ours']:.2f} s ({best['multinomial']:.2f} s with multinomial counts, {best['multinomial'] / best['ours']:.1f}x); "
         f"peak memory {peak / 2**20:.0f} MiB", f"<= {GOAL_SECONDS:.0f} s", met)
    return dict(seconds=best['ours'], multinomial_seconds=best['multinomial'], peak_bytes=peak)


if __name__ == '__main__':
    main()
