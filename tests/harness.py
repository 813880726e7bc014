"""What `make test` promises about itself: no test waits for ever, a crash names its test, memory is reported.

Time. Every test has pytest-timeout's limit (the `timeout` ini option, or a test's own `@pytest.mark.timeout`). A test
stuck in Python past it fails with its stack, and the run goes on. A test stuck in native code that holds the
interpreter lock (a deadlock in a C++ destructor, say) cannot be interrupted from Python: for that, faulthandler's
watchdog, a C thread that needs no lock, writes every thread's stack to a file and ends the process `HARD_GRACE_S`
seconds after the limit. Under pytest-xdist the controller then reports the crashed worker's test with that stack, and
`--max-worker-restart=0` (in `make test`) ends the run at once instead of waiting on a replacement worker.

Memory. Each process samples its own resident memory every `SAMPLE_S` seconds; every test records its worker's RSS
before and after and the peak while it ran, and the controller samples the whole tree (itself, its workers and all
their children: notebook runs, local LLM servers, subprocesses). The summary prints the ten largest growths and peaks
with the tests' names, each worker's peak and the run's peak.

Cells. A notebook cell that is still running when its test ends (a cell past its time limit runs on in its shell's
thread) would, when it ends, put back the streams it found: that test's capture, closed by then, under whichever test
runs at that moment. The test that leaves one fails at its teardown, with the cell's stack.

Cache. The run uses a cache folder of its own (`DARS_CACHE`, a fresh temporary folder unless `DARS_TEST_CACHE` names
one), so the encoder's export, the embedding store and the local models are built from nothing on every `make test`, as
on a new machine; the spend ledgers of `dars serve` go in its `state` folder (`XDG_STATE_HOME`).
"""
import ctypes
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import psutil
import pytest

HARD_GRACE_S = float(os.environ.get('DARS_TEST_HARD_GRACE_S', 30))   # after the pytest-timeout limit
SAMPLE_S = 0.05          # sampling period of a process's RSS (psutil reads /proc: about 10 µs a read)
TREE_S = 0.5             # of the PSS of its descendants (a read of smaps_rollup per process)
GB = 1 << 30


def _worker_id(config) -> str:
    return getattr(config, 'workerinput', {}).get('workerid', 'main')


def pss(pid: int) -> int:
    "Proportional set size of a process in bytes: its private pages plus its share of pages it shares (0 if gone)."
    try:
        with open(f'/proc/{pid}/smaps_rollup', 'rb') as f:
            for line in f:
                if line.startswith(b'Pss:'): return int(line.split()[1]) * 1024
    except OSError: pass
    return 0


def _what(pid: int) -> str:
    "A process in a few words: its command line, the interpreter's path left out (or '?' once it is gone)."
    try: cmd = psutil.Process(pid).cmdline()
    except psutil.Error: return '?'
    if cmd and Path(cmd[0]).name.startswith('python'): cmd = cmd[1:]   # the interpreter says nothing
    return ' '.join([Path(cmd[0]).name] + cmd[1:])[:90] if cmd else '?'


class PeakSampler:
    """Peaks since the last `reset`, sampled on a thread: the process's own RSS every `SAMPLE_S`, and every `TREE_S` the
    memory of its descendants (or of the whole tree, itself included), as summed PSS: shared pages counted once."""
    def __init__(self, whole_tree: bool): # the tree's sum includes this process (the controller's view of a run)
        self.proc, self.whole_tree, self._stop = psutil.Process(), whole_tree, threading.Event()
        self.peak = self.tree_peak = 0
        self.running = set()           # ids of the tests under way, kept by the controller
        self.running_at_peak = []
        self.largest_at_peak = []      # (PSS, what the process is) of the largest processes at the tree's peak
        threading.Thread(target=self._run, daemon=True, name='rss-sampler').start()

    def rss(self) -> int:
        return self.proc.memory_info().rss

    def tree(self) -> list:
        "[(PSS, pid)] of the descendants (and of this process with `whole_tree`)."
        try: pids = [c.pid for c in self.proc.children(recursive=True)]
        except psutil.Error: pids = []
        return [(pss(p), p) for p in pids + ([self.proc.pid] if self.whole_tree else [])]

    def _run(self):
        n = 0
        while not self._stop.wait(SAMPLE_S):
            self.peak = max(self.peak, self.rss())
            n += 1
            if n % round(TREE_S / SAMPLE_S) == 0:
                sizes = self.tree()
                t = sum(s for s, _ in sizes)
                if t > self.tree_peak:
                    self.tree_peak, self.running_at_peak = t, sorted(self.running)
                    self.largest_at_peak = [(s, _what(p)) for s, p in sorted(sizes, reverse=True)[:6]]

    def reset(self) -> int:
        self.peak, self.tree_peak = self.rss(), 0
        return self.peak

    def stop(self): self._stop.set()


def pytest_configure(config):
    main = _worker_id(config) == 'main'
    if main and not os.environ.get('DARS_TEST_RUN_DIR'):
        # one empty cache folder for the whole run, inherited by the workers and every process they start
        chosen = os.environ.get('DARS_TEST_CACHE')
        cache = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix='dars-test-cache-'))
        os.environ['DARS_CACHE'] = str(cache)
        os.environ['XDG_STATE_HOME'] = str(cache / 'state')   # spend ledgers of `dars serve` runs, never the user's
        config._dars_own_cache = None if chosen else cache
        run = Path(tempfile.mkdtemp(prefix='dars-test-run-'))     # where watchdogs write stacks
        os.environ['DARS_TEST_RUN_DIR'] = str(run)
        config._dars_run_dir = run
    config._dars_test_sampler = PeakSampler(whole_tree=False)
    config._dars_run_sampler = PeakSampler(whole_tree=True) if main else None
    if main: _RUN_SAMPLER[:] = [config._dars_run_sampler]
    hang = Path(os.environ['DARS_TEST_RUN_DIR']) / f'{_worker_id(config)}-{os.getpid()}.txt'
    config._dars_hang_file = open(hang, 'w')


def pytest_report_header(config):
    return (f"time limits: pytest-timeout's {config.getini('timeout')} s per test (or its own mark), then every "
            f"thread's stack and the end of the process {HARD_GRACE_S:g} s later; cache folder: {os.environ.get('DARS_CACHE')}")


try: _LIBC = ctypes.CDLL('libc.so.6')   # glibc: hand the heap's freed pages back to the system after each test
except OSError: _LIBC = None

def _release_freed_memory():
    "After a test, what it freed goes back to the system (glibc otherwise keeps it for this process)."
    if _LIBC is not None and hasattr(_LIBC, 'malloc_trim'): _LIBC.malloc_trim(0)


def _limit(item) -> float:
    mark = item.get_closest_marker('timeout')
    if mark is not None and (mark.args or 'timeout' in mark.kwargs):
        return float(mark.args[0] if mark.args else mark.kwargs['timeout'])
    return float(item.config.getini('timeout') or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    config, limit = item.config, _limit(item)
    hang = config._dars_hang_file
    if limit > 0:
        hang.seek(0); hang.truncate()
        hang.write(f'{item.nodeid} passed its limit of {limit:g} s by {HARD_GRACE_S:g} s; every thread:\n'); hang.flush()
        faulthandler.dump_traceback_later(limit + HARD_GRACE_S, exit=True, file=hang)
    item._dars_rss_before = config._dars_test_sampler.reset()
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        _release_freed_memory()


def running_cells() -> list:
    "[(thread, its stack)] of the notebook shells (execnb's `CaptureShell`) in this process that are running a cell."
    frames = sys._current_frames()
    stacks = [(t, traceback.extract_stack(frames[t.ident])) for t in threading.enumerate()
              if t.name == 'CaptureShell-loop' and t.ident in frames]
    return [(t, s) for t, s in stacks if any(f.name == '_run_async' for f in s)]


@pytest.fixture(autouse=True)
def _no_cell_outlives_its_test():
    """A notebook cell still running when its test ends (a cell past its time limit runs on in its shell's thread)
    puts back, when it ends, the `sys.stdout` and `sys.stderr` it found: that test's capture, closed by then, under
    whichever test runs at that moment. The test that leaves one fails, with the cell's stack, not the test it hits."""
    yield
    left = running_cells()
    if left: pytest.fail('a notebook cell outlived this test, still running:\n' +
                         '\n'.join(''.join(traceback.format_list(s[-8:])) for _, s in left), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == 'call': item._dars_ran = True
    if call.when == 'teardown' and getattr(item, '_dars_ran', False):      # skipped tests have nothing to say
        sampler = item.config._dars_test_sampler
        after = sampler.rss()
        before = getattr(item, '_dars_rss_before', after)
        row = (item.nodeid, _worker_id(item.config), before, after, max(sampler.peak, after), sampler.tree_peak)
        outcome.get_result().user_properties.append(('dars_memory', row))


def pytest_runtest_logstart(nodeid, location):
    "The controller keeps which test each worker runs, to name them at the run's peak."
    if _RUN_SAMPLER: _RUN_SAMPLER[0].running.add(nodeid)


def pytest_runtest_logreport(report):
    "Each test's memory row, from whichever process ran it (it travels with the teardown report)."
    if report.when != 'teardown': return
    if _RUN_SAMPLER: _RUN_SAMPLER[0].running.discard(report.nodeid)
    for key, row in report.user_properties:
        if key == 'dars_memory': _MEMORY.append(tuple(row))


_MEMORY = []     # the rows the controller (or a run without workers) has received
_RUN_SAMPLER = []   # the controller's sampler of the whole run


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """A crashed worker's test is reported with the stacks its watchdog wrote, if it wrote any, and the run stops: the
    other workers are interrupted (their queued tests would otherwise all run first) and pytest exits non-zero."""
    run, dumps = Path(os.environ['DARS_TEST_RUN_DIR']), []
    dsession = report.node.config.pluginmanager.getplugin('dsession')
    stopped = getattr(dsession, '_dars_stopped_by', None)
    if stopped is not None:       # a worker this hook interrupted: its test did not fail, the run was stopped
        report.outcome, report.longrepr = 'skipped', (crashitem.split('::')[0], 0, f'Skipped: not finished: {stopped}')
        return
    for f in run.glob('*.txt'):
        text = f.read_text(errors='replace')
        if text.startswith(crashitem + ' ') and 'File "' in text: dumps.append(text)
    if dumps:
        report.longrepr = f'{report.longrepr}\n\n' + '\n'.join(dumps)
    if dsession is not None:
        dsession._dars_stopped_by = dsession.shouldstop = f'{report.longrepr.splitlines()[0]}: the run stops'
        pids = [int(f.stem.rsplit('-', 1)[1]) for f in run.glob('gw*-*.txt')]   # each worker's file: worker-pid
        _signal_all(pids, signal.SIGINT)
        # a worker may let an interrupt go by (one that lands while it waits for its next test): it is killed, and its
        # test reported as stopped like the others
        killer = threading.Timer(STOP_GRACE_S, _signal_all, (pids, signal.SIGKILL))
        killer.daemon = True                          # the run may end before it fires
        killer.start()


STOP_GRACE_S = 10   # from the interrupt that stops a run after a crash to the kill of a worker still running


def _signal_all(pids: list, sig: int):
    "Send `sig` to those of `pids` that are still this process's workers (a pid may have been taken by another)."
    for pid in pids:
        try:
            if psutil.Process(pid).ppid() == os.getpid(): os.kill(pid, sig)
        except (psutil.Error, ProcessLookupError): pass


def _gb(x: int) -> str: return f'{x / GB:.2f} GB'


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _worker_id(config) != 'main': return
    rows, tr, run = _MEMORY, terminalreporter, config._dars_run_sampler
    tr.section('memory')
    if rows:
        tr.write_line("largest growths of a test process's RSS across one test (after - before; its peak while the test ran):")
        for test, worker, before, after, peak, _ in sorted(rows, key=lambda r: r[3] - r[2], reverse=True)[:10]:
            tr.write_line(f'  {(after - before) / GB:+6.2f} GB  {worker:>4}  {_gb(before)} -> {_gb(after)}, '
                          f'peak {_gb(peak)}  {test}')
        tr.write_line('largest peaks of a test process (RSS), and of the processes a test started (PSS), while it ran:')
        for test, worker, before, after, peak, children in sorted(rows, key=lambda r: r[4] + r[5], reverse=True)[:10]:
            tr.write_line(f'  {_gb(peak):>8} + {_gb(children):>8}  {worker:>4}  {test}')
        workers = {}
        for _, worker, _, after, peak, _ in rows: workers[worker] = max(workers.get(worker, 0), peak, after)
        tr.write_line('peak RSS of each test process: ' + ', '.join(f'{w} {_gb(p)}' for w, p in sorted(workers.items())))
    tr.write_line(f'peak of the whole run (pytest, its workers and every process they started; summed PSS): '
                  f'{_gb(run.tree_peak)}, while these ran: {", ".join(run.running_at_peak) or "-"}')
    if run.largest_at_peak:
        tr.write_line('  its largest processes: ' + '; '.join(f'{_gb(s)} {what}' for s, what in run.largest_at_peak))


def pytest_unconfigure(config):
    config._dars_test_sampler.stop()
    if config._dars_run_sampler is not None: config._dars_run_sampler.stop()
    hang = config._dars_hang_file
    hang.close(); Path(hang.name).unlink(missing_ok=True)
    own = getattr(config, '_dars_own_cache', None)
    if own is not None: shutil.rmtree(own, ignore_errors=True)
    run = getattr(config, '_dars_run_dir', None)
    if run is not None: shutil.rmtree(run, ignore_errors=True)
