"The protocol runner gives the same table on a local Dask cluster as on the default joblib backend."
import pytest

from sweeps import sweep, same_tables

distributed = pytest.importorskip('distributed')
joblib = pytest.importorskip('joblib')


@pytest.fixture(scope='module')
def reference():
    "The sweep in this process, one unit after another."
    return sweep(n_jobs=1)


def test_dask_backend_matches_default(reference):
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster, \
         distributed.Client(cluster) as client, joblib.parallel_config('dask'):
        assert type(joblib.parallel.get_active_backend()[0]).__name__ == 'DaskDistributedBackend'
        on_dask = sweep()
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.transition_log)) > 0  # tasks ran there
    same_tables(reference, on_dask)


def test_two_processes_match_one(reference):
    same_tables(reference, sweep(n_jobs=2))
