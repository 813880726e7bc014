"""The protocol's units on a real Dask cluster: a `dask scheduler` and `dask worker` processes on loopback, started
here (not a LocalCluster inside this process).

In `make test` (a few seconds, in this process):
- `dars reproduce` stops with one line and exit code 1, leaving no report folder, when the scheduler cannot be reached
  (`DARS_SCHEDULER`) or the `cluster` extra is missing; a malformed `--scheduler` address, a refused port or a
  server that is no Dask scheduler end it within seconds, with no traceback when the process exits.
(The notebook `21_cluster` runs units on an in-process Dask cluster, checked against joblib, in `make test` too.)

Behind the `slow` flag (`DARS_TEST_FLAGS=slow .venv/bin/python -m pytest tests/test_cluster.py`, minutes on two
cores), as the notebooks' slow cells — starting the processes and importing the routers in each worker alone takes
10-40 s on two shared cores:
- a small sweep on the cluster, one of its two workers killed with SIGKILL mid-run, gives the table of a local run,
  value for value, each row once, with no task carrying the shared data; then its scheduler killed mid-sweep ends
  the next sweep with one `ClusterError` line;
- a larger sweep ships its data once per worker (bytes counted), and survives losing both of its first workers;
- `dars reproduce` with its scheduler killed mid-run: one line, exit code 1, nothing in the report folder;
- a tiny `reproduce` on the cluster writes the same CSVs and report as here;
- the whole `dars reproduce --quick` on the cluster against a local `--quick` run, with and without a worker killed.
"""
import json, os, signal, subprocess, sys, threading, time, warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group('cluster')   # one worker starts the module's scheduler and workers

distributed = pytest.importorskip('distributed')

from dars_nb.experiments import protocol, cluster as cluster_module
from dars_nb.experiments.cluster import Shipped, SHARE_BYTES
from dars_nb.experiments.protocol import run_experiments, simulated_datasets, Spec
from dars_nb.routers import MeanRouter, KNNRouter, MLPRouter
from dars_nb.testing import forced_test_flags
from sweeps import sweep, same_tables

BIN = Path(sys.executable).parent
# a lost scheduler is given up after this long (Dask's default is 30 s)
ENV = {**os.environ, 'DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT': '5s', 'PYTHONUNBUFFERED': '1'}
SLOW = pytest.mark.skipif('slow' not in forced_test_flags(),
                          reason="minutes on two cores: run with DARS_TEST_FLAGS=slow")


class Cluster:
    "A scheduler and worker processes on loopback, each in its own session; stopped by their process ids."
    def __init__(self, folder: Path, workers: int = 2):
        self.folder, self.procs = folder, {}
        info = folder / 'scheduler.json'
        self._start('scheduler', [BIN / 'dask', 'scheduler', '--host', '127.0.0.1', '--port', '0', '--no-dashboard',
                                  '--scheduler-file', info])
        deadline = time.monotonic() + 60
        while not (info.exists() and info.stat().st_size):
            assert time.monotonic() < deadline, (folder / 'scheduler.log').read_text()[-2000:]
            time.sleep(0.2)
        self.address = json.loads(info.read_text())['address']
        for i in range(workers): self.add_worker(f'w{i}')
        with distributed.Client(self.address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=120)

    def add_worker(self, name):
        "Start a single-threaded worker process (no nanny: SIGKILL ends it for good)."
        self._start(name, [BIN / 'dask', 'worker', self.address, '--name', name, '--nthreads', '1', '--no-nanny',
                           '--no-dashboard', '--death-timeout', '30', '--local-directory', self.folder / name])

    def _start(self, name, args):
        log = open(self.folder / f'{name}.log', 'w')
        self.procs[name] = subprocess.Popen([str(a) for a in args], stdout=log, stderr=subprocess.STDOUT, env=ENV,
                                            start_new_session=True)

    def kill(self, name):
        "SIGKILL one process of the cluster."
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(30)

    def stop(self):
        "SIGKILL what is left (their scratch folders live in `folder`)."
        for name, proc in self.procs.items():
            if proc.poll() is None: self.kill(name)


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    "A scheduler and two workers shared by the tests that leave them running."
    made = Cluster(tmp_path_factory.mktemp('cluster'))
    yield made
    made.stop()


@pytest.fixture
def own_cluster(tmp_path, request):
    "A scheduler and two workers (or `workers` of the test's parameters) for one test, which may kill some."
    made = Cluster(tmp_path, getattr(request, 'param', 2))
    yield made
    made.stop()


@pytest.fixture(scope='module')
def reference():
    "The sweep on this machine."
    return sweep()


@pytest.mark.slow
@SLOW
def test_sweep_on_cluster_matches_local_and_ships_data_once(cluster, reference, monkeypatch):
    shipped, inner = Shipped(), protocol.run_calls
    monkeypatch.setattr(protocol, 'run_calls', lambda *a, **k: inner(*a, shipped=shipped, **k))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        on_cluster = sweep(scheduler=cluster.address)
    same_tables(reference, on_cluster)
    assert not [w for w in caught if 'large graph' in str(w.message)]
    units = 2 * 3 * 4                                                 # datasets × routers × specs
    assert (shipped.workers, shipped.tasks) == (2, units)
    # shared: two prepared datasets and eight supervisions, written once and mapped by the workers (on this machine);
    # each worker is sent their paths, and a task carries its router, spec and references
    assert shipped.mapped > 100_000 and shipped.shared < 10 * 300 and shipped.largest_task < SHARE_BYTES
    assert shipped.to_workers == 2 * shipped.shared + shipped.task_bytes


def _kill_when_busy(cluster, name, then=None) -> bool:
    "SIGKILL worker `name` once a unit has finished and it runs another; then call `then`. Whether it did."
    with distributed.Client(cluster.address, timeout=30, set_as_default=False) as client:
        address = next(a for a, w in client.scheduler_info(n_workers=-1)['workers'].items() if w['name'] == name)
        most, deadline = 0, time.monotonic() + 300
        while time.monotonic() < deadline:
            # units the scheduler holds (scattered data has no run_spec); a finished unit is released at once
            units = client.run_on_scheduler(lambda dask_scheduler: sum(
                ts.run_spec is not None for ts in dask_scheduler.tasks.values()))
            most = max(most, units)
            if units < most and client.processing([address]).get(address):
                cluster.kill(name)
                if then: then()
                return True
            time.sleep(0.05)
    return False


def _small_sweep(**kw):
    datasets = simulated_datasets({'gpqa_like': 30}, n_train=30, seed=3)
    routers = {'MLP': MLPRouter(hidden_layer_sizes=(16,), max_iter=40), 'kNN': KNNRouter(n_neighbors=5),
               'mean': MeanRouter()}
    return run_experiments(datasets, routers, (Spec('single'), Spec('dars')), n_draws=4, n_boot=100, progress=False,
                           **kw)


def _when_running(cluster, name, kill) -> threading.Thread:
    "A thread that SIGKILLs process `kill` of the cluster once worker `name` runs a unit (gives up after 120 s)."
    def watch():
        with distributed.Client(cluster.address, timeout=30, set_as_default=False) as client:
            address = next(a for a, w in client.scheduler_info(n_workers=-1)['workers'].items() if w['name'] == name)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not client.processing([address]).get(address): time.sleep(0.02)
            if time.monotonic() < deadline: cluster.kill(kill)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@SLOW
def test_lost_worker_costs_its_units_lost_scheduler_ends_the_run(own_cluster):
    import dask
    from dars_nb.experiments.cluster import ClusterError
    local = _small_sweep()
    shipped, inner = Shipped(), protocol.run_calls
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught:
        mp.setattr(protocol, 'run_calls', lambda *a, **k: inner(*a, shipped=shipped, **k))
        warnings.simplefilter('always')
        watcher = _when_running(own_cluster, 'w1', kill='w1')
        on_cluster = _small_sweep(scheduler=own_cluster.address)
        watcher.join(5)
    assert own_cluster.procs['w1'].returncode == -signal.SIGKILL, 'w1 was not killed mid-run'
    assert not on_cluster.duplicated(['router', 'supervision', 'view']).any() and len(on_cluster) == len(local)
    same_tables(local, on_cluster)
    assert not [w for w in caught if 'large graph' in str(w.message)] and shipped.largest_task < SHARE_BYTES
    # the scheduler goes away mid-sweep: one line naming it
    watcher = _when_running(own_cluster, 'w0', kill='scheduler')
    with dask.config.set({'distributed.comm.timeouts.connect': '5s'}):
        with pytest.raises(ClusterError, match=f'^lost the Dask scheduler at {own_cluster.address}'):
            _small_sweep(scheduler=own_cluster.address)
    watcher.join(5)


@pytest.mark.slow
@SLOW
def test_lost_workers_cost_only_their_units(own_cluster, reference, monkeypatch):
    # w1 dies mid-run: the scheduler runs its units on w0. Then w0, the last worker, dies and w2 joins: the shared
    # data died with w0, so the run sends it again and submits again the units that needed it
    shipped, inner, share, sent = Shipped(), protocol.run_calls, cluster_module._ClusterRun.share, []
    monkeypatch.setattr(protocol, 'run_calls', lambda *a, **k: inner(*a, shipped=shipped, **k))
    monkeypatch.setattr(cluster_module._ClusterRun, 'share', lambda self: (share(self), sent.append(shipped.shared)))
    kills = []
    def killer():
        kills.append(_kill_when_busy(own_cluster, 'w1'))
        kills.append(_kill_when_busy(own_cluster, 'w0', then=lambda: own_cluster.add_worker('w2')))
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    on_cluster = sweep(scheduler=own_cluster.address)
    thread.join(10)
    assert kills == [True, True], 'the workers were not killed mid-run'
    assert [own_cluster.procs[w].returncode for w in ('w0', 'w1')] == [-signal.SIGKILL] * 2
    keys = ['dataset', 'router', 'supervision', 'beta', 'grid', 'view']
    assert not on_cluster.duplicated(keys).any() and len(on_cluster) == len(reference)
    assert sent[-1] > sent[0] and shipped.tasks > 2 * 3 * 4        # data sent again, some units submitted again
    same_tables(reference, on_cluster)


def _reproduce(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / 'dars'), 'reproduce', *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or ENV)


@pytest.fixture(scope='module')
def tiny_data(tmp_path_factory):
    "A small observation file and its features: `dars reproduce --quick --data` gets to its protocol at once."
    from dars_nb.simulate import simulate
    from dars_nb.observations import write_observations
    folder = tmp_path_factory.mktemp('data')
    obs, features, _ = simulate('gpqa_like', n_train=30, n_test=20, seed=2)
    write_observations(obs, folder / 'obs.parquet')
    features.to_parquet(folder / 'features.parquet')
    return ['--data', folder / 'obs.parquet', '--features', folder / 'features.parquet']


@pytest.mark.slow
@SLOW
@pytest.mark.parametrize('own_cluster', [1], indirect=True)
def test_scheduler_gone_one_line_nothing_written(own_cluster, tiny_data, tmp_path):
    cluster, out = own_cluster, tmp_path / 'report'
    run = _reproduce('--quick', *tiny_data, '--out', out, '--scheduler', cluster.address)
    for line in run.stdout:                                          # progress lines, flushed one by one
        if line.startswith('[3/8] protocol'): break
    time.sleep(2)
    cluster.kill('scheduler')
    stdout, stderr = run.communicate(timeout=180)
    assert run.returncode == 1, stderr
    assert stderr.splitlines() == [stderr.strip()] and stderr.startswith(
        f'dars reproduce: error: lost the Dask scheduler at {cluster.address}'), stderr
    assert not out.exists() and not list(tmp_path.glob('.report.partial-*'))


def test_unreachable_scheduler_from_the_environment(tmp_path, monkeypatch, capsys):
    import dask
    from dars_nb.cli import main
    out = tmp_path / 'report'
    monkeypatch.setenv('DARS_SCHEDULER', 'tcp://127.0.0.1:9')                    # nothing listens on port 9
    with dask.config.set({'distributed.comm.timeouts.connect': '1s'}):
        code = main(['reproduce', '--quick', '--out', str(out)])
    stderr = capsys.readouterr().err
    assert code == 1 and stderr.startswith('dars reproduce: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9: ')
    assert len(stderr.strip().splitlines()) == 1 and not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.timeout(180)
@pytest.mark.parametrize('address, says', [
    ('garbage', "'garbage' is not a Dask scheduler address (no port)"),
    ('http://10.0.0.5:8786', "'http://10.0.0.5:8786' is not a Dask scheduler address (unknown scheme 'http')"),
    ('tcp://[::1', "'tcp://[::1' is not a Dask scheduler address (invalid IPv6 URL)"),
    ('inproc://x', "'inproc://x' is not a Dask scheduler address (inproc:// reaches a scheduler only inside its own"),
    ('tcp://127.0.0.1:9', 'cannot reach the Dask scheduler at tcp://127.0.0.1:9: Connection refused'),   # nothing listens
    ('web server', 'is not a Dask scheduler (it does not speak'),
])
def test_a_scheduler_that_cannot_be_used_is_one_line_at_once(tmp_path, address, says):
    # the real command in a process of its own, with Dask's default timeouts: it must end within the subprocess
    # timeout (far under Dask's 30 s connect timeout and its 60 s close at exit), say one line, and leave nothing
    import socketserver
    class AnswerHTTP(socketserver.BaseRequestHandler):
        def handle(self): self.request.recv(1024); self.request.sendall(b'HTTP/1.1 400 Bad Request\r\n\r\n')
    with socketserver.ThreadingTCPServer(('127.0.0.1', 0), AnswerHTTP) as web:
        threading.Thread(target=web.serve_forever, daemon=True).start()
        if address == 'web server': address = f'tcp://127.0.0.1:{web.server_address[1]}'
        out = tmp_path / 'report'
        res = subprocess.run([str(BIN / 'dars'), 'reproduce', '--quick', '--out', str(out), '--scheduler', address],
                             capture_output=True, text=True, timeout=20, env={**os.environ, 'PYTHONUNBUFFERED': '1'})
        web.shutdown()
    assert res.returncode == 1, res.stderr
    assert res.stderr.count('\n') == 1 and 'Traceback' not in res.stderr, res.stderr
    assert res.stderr.startswith('dars reproduce: error: ') and says in res.stderr, res.stderr
    assert res.stdout == '' and not out.exists() and not list(tmp_path.iterdir())


def test_missing_extra_names_it(tmp_path, monkeypatch, capsys):
    from dars_nb.cli import main
    monkeypatch.setitem(sys.modules, 'distributed', None)                     # as if it were not installed
    code = main(['reproduce', '--quick', '--out', str(tmp_path / 'report'), '--scheduler', 'tcp://127.0.0.1:9'])
    assert code == 1 and not list(tmp_path.iterdir())
    assert capsys.readouterr().err == ("dars reproduce: error: running units on a Dask cluster needs distributed: "
                                       "pip install 'dars_nb[cluster]'\n")


def _tables(folder: Path) -> dict:
    "Every CSV's bytes, and report.md without its two timing lines (wall time, time per study)."
    out = {p.name: p.read_bytes() for p in sorted(folder.glob('*.csv'))}
    out['report.md'] = [line for line in (folder / 'report.md').read_text().splitlines()
                        if not line.startswith(('Wall time ', 'Time per study'))]
    return out


@pytest.mark.slow
@SLOW
def test_tiny_reproduce_on_cluster_writes_the_same_tables(cluster, tmp_path):
    from dars_nb.experiments.inputs import Settings
    from dars_nb.experiments.reproduce import reproduce
    tiny = Settings(n_train=30, test_sizes={'gpqa_like': 20, 'drop_like': 20}, n_draws=3, n_boot=50,
                    grids=((1, 1), (5, 5)), betas=(0.0, 0.2), temperatures=(0.3, 0.9), temperature_n_train=30)
    routers = {'kNN': KNNRouter(), 'MLP': MLPRouter(hidden_layer_sizes=(8,), max_iter=30)}
    here = reproduce(tmp_path / 'here', routers=routers, settings=tiny, n_jobs=1, verbose=False)
    there = reproduce(tmp_path / 'there', routers=routers, settings=tiny, verbose=False, scheduler=cluster.address)
    assert there['cluster'].startswith(f'the Dask cluster at {cluster.address} (2 workers')
    assert here['files'] == there['files'] and len(_tables(tmp_path / 'here')) > 10
    assert _tables(tmp_path / 'here') == _tables(tmp_path / 'there')


@pytest.fixture(scope='module')
def local_quick(tmp_path_factory):
    "The tables of `dars reproduce --quick` on this machine."
    out = tmp_path_factory.mktemp('local') / 'report'
    run = _reproduce('--quick', '--quiet', '--out', out)
    _, stderr = run.communicate(timeout=1800)
    assert run.returncode == 0, stderr
    return _tables(out)


@pytest.mark.slow
@SLOW
def test_reproduce_quick_on_cluster_matches_local(cluster, local_quick, tmp_path):
    run = _reproduce('--quick', '--quiet', '--out', tmp_path / 'report', '--scheduler', cluster.address)
    _, stderr = run.communicate(timeout=1800)
    assert run.returncode == 0, stderr
    assert _tables(tmp_path / 'report') == local_quick


@pytest.mark.slow
@SLOW
def test_reproduce_quick_with_a_worker_killed_matches_local(own_cluster, local_quick, tmp_path):
    run = _reproduce('--quick', '--out', tmp_path / 'report', '--scheduler', own_cluster.address)
    for line in run.stdout:
        if line.startswith('[3/8] protocol'): break
    killed = _kill_when_busy(own_cluster, 'w1')
    _, stderr = run.communicate(timeout=1800)
    assert killed and run.returncode == 0, stderr
    assert _tables(tmp_path / 'report') == local_quick
