"""Why joblib's loky pool restarted a worker during `dars reproduce`, measured: a worker's memory after each unit.

Run: .venv/bin/python bench/bench_workers.py

loky watches its workers for leaks: after a worker's first call it records the worker's resident size, and a
worker that later holds 300 MB more than that (after a garbage collection) is replaced — joblib then warns "A
worker stopped while some jobs were given to the executor". The units of the protocol import their router's
module when they are unpickled; the torch families import torch (about 200 MB) and torch's first fit adds about
100 MB of its own. A worker whose first unit was a kNN or MLP router grew past the limit at its first torch unit.
`run_calls` imports the modules of the sweep's routers in each worker before its first unit, so the size loky
records already holds them.

This script runs one single-shot unit of each family (FULL size: 200 training, 250 test queries, R = 100) in one
loky worker, in the order of `--order`, without and with that import, and prints the worker's resident size after
each unit (psutil, after `gc.collect()`, as loky measures it) and whether loky restarted it.
"""
import argparse, gc, os, sys, warnings

import psutil
from joblib.externals.loky import get_reusable_executor

from summary import emit

LIMIT_MB = 300      # joblib.externals.loky.process_executor._MAX_MEMORY_LEAK_SIZE


def unit(preload, *args):
    "One protocol unit through `run_calls`' wrapper; the worker's pid and resident MB after it."
    from dars_nb.experiments.cluster import _call
    from dars_nb.experiments.protocol import score_unit
    _call(preload, score_unit, *args)
    gc.collect()
    return os.getpid(), psutil.Process().memory_info().rss / 1e6


def run(calls, preload) -> tuple[list, bool]:
    "(family, MB) after each unit in one loky worker; whether loky replaced the worker."
    executor = get_reusable_executor(max_workers=1, reuse=False)
    rows, pids = [], set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        for name, args in calls:
            pid, mb = executor.submit(unit, preload, *args).result()
            pids.add(pid)
            rows.append((name, mb))
    executor.shutdown()
    restarted = len(pids) > 1 or any('A worker stopped' in str(w.message) for w in caught)
    return rows, restarted


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--order', nargs='*', default=['kNN', 'MLP', 'MIRT', 'EmbedLLM', 'RM-Softmax', 'GraphRouter',
                                                   'AvengersPro'], help='families, in the order the worker runs them')
    a = ap.parse_args(argv)
    from dars_nb.experiments.protocol import (simulated_datasets, prepare_dataset, supervise, Spec,
                                              available_routers)
    ds = simulated_datasets({'gpqa_like': 250}, n_train=200, seed=0)[0]
    prep, spec, routers = prepare_dataset(ds, 0.05, ('rewrite', 'decode')), Spec('single'), available_routers()
    sup = supervise(ds, spec, 100, 0.05, 0, prep.models)
    calls = [(name, (prep, name, routers[name](), spec, *sup, 0, 0, 0.05)) for name in a.order]
    modules = tuple(dict.fromkeys(routers[name].__module__ for name in a.order))
    result = {}
    for label, preload in (('no import first', ()), ('router modules imported first', modules)):
        rows, restarted = run(calls, preload)
        growth = max(mb for _, mb in rows) - rows[0][1]
        result[label] = (growth, restarted)
        print(f"{label}: " + ', '.join(f"{n} {mb:.0f}" for n, mb in rows)
              + f" MB; growth since the first unit {growth:.0f} MB (loky's limit {LIMIT_MB}); "
              f"worker restarted: {'yes' if restarted else 'no'}", flush=True)
    (g0, r0), (g1, r1) = result.values()
    emit("workers: loky worker growth after its first unit, without / with the routers imported first",
         f"{g0:.0f} MB (restarted: {'yes' if r0 else 'no'}) / {g1:.0f} MB (restarted: {'yes' if r1 else 'no'})",
         f"< {LIMIT_MB} MB with the import, no restart", bool(g1 < LIMIT_MB and not r1))


if __name__ == '__main__':
    main()
