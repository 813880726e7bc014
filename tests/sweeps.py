"A small protocol sweep and an exact comparison of its tables, shared by the backend and cluster tests."
import numpy as np
import pandas as pd

from dars_nb.experiments.protocol import run_experiments, simulated_datasets, scalars, Spec, ARRAY_COLUMNS
from dars_nb.routers import MeanRouter, KNNRouter, MLPRouter


def sweep(**kw):
    "Two simulated datasets × kNN, MLP and the mean router × four supervisions, small sizes."
    datasets = simulated_datasets({'gpqa_like': 30, 'drop_like': 30}, n_train=30, seed=3)
    routers = {'kNN': KNNRouter(n_neighbors=5), 'MLP': MLPRouter(hidden_layer_sizes=(16,), max_iter=40),
               'mean': MeanRouter()}
    specs = (Spec('single'), Spec('dars'), Spec('no_risk'), Spec('dars', grid=(2, 2)))
    return run_experiments(datasets, routers, specs, n_draws=4, n_boot=200, progress=False, **kw)


def same_tables(a: pd.DataFrame, b: pd.DataFrame):
    "Assert two result tables are identical, scalars and arrays."
    # Exact equality holds by construction: every unit runs alone, pinned to one thread (BLAS and torch), with
    # seeds derived from the run's seed and the unit's names, so neither the backend, the number of processes nor
    # the process a unit lands in changes a sum's order. Both sides are computed in the test, never stored.
    pd.testing.assert_frame_equal(scalars(a), scalars(b), check_exact=True)
    for c in ARRAY_COLUMNS:
        for x, y in zip(a[c], b[c]): assert np.array_equal(x, y)
