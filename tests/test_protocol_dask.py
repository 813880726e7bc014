"The protocol runner gives the same table on a local Dask cluster as on the default joblib backend."
import numpy as np
import pandas as pd
import pytest

from dars_nb.experiments.protocol import run_experiments, simulated_datasets, scalars, Spec, ARRAY_COLUMNS
from dars_nb.routers import MeanRouter, KNNRouter, MLPRouter

distributed = pytest.importorskip('distributed')
joblib = pytest.importorskip('joblib')


def _sweep(**kw):
    datasets = simulated_datasets({'gpqa_like': 30, 'drop_like': 30}, n_train=30, seed=3)
    routers = {'kNN': KNNRouter(n_neighbors=5), 'MLP': MLPRouter(hidden_layer_sizes=(16,), max_iter=40),
               'mean': MeanRouter()}
    specs = (Spec('single'), Spec('dars'), Spec('no_risk'), Spec('dars', grid=(2, 2)))
    return run_experiments(datasets, routers, specs, n_draws=4, n_boot=200, progress=False, **kw)


def _same(a: pd.DataFrame, b: pd.DataFrame):
    # Exact equality holds by construction: every unit runs the same code on the same machine pinned to one
    # thread (threadpool_limits(1) and torch.set_num_threads(1) in the protocol), so the summation order does not
    # depend on the backend or the number of processes. Both sides are computed here, never compared with stored figures.
    pd.testing.assert_frame_equal(scalars(a), scalars(b), check_exact=True)
    for c in ARRAY_COLUMNS:
        for x, y in zip(a[c], b[c]): assert np.array_equal(x, y)


def test_dask_backend_matches_default():
    reference = _sweep()
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster, \
         distributed.Client(cluster) as client, joblib.parallel_config('dask'):
        assert type(joblib.parallel.get_active_backend()[0]).__name__ == 'DaskDistributedBackend'
        on_dask = _sweep()
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.transition_log)) > 0  # tasks ran there
    _same(reference, on_dask)


def test_two_processes_match_one():
    _same(_sweep(n_jobs=1), _sweep(n_jobs=2))
