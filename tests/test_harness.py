"""`make test` fails a hang or a crash with the test's name and stack, and goes on no longer than it must.

The four tests that misbehave on purpose are skipped unless `DARS_TEST_MISBEHAVE` names them; the last test runs them
in a pytest of their own, started with `make test`'s own options (read from the Makefile), and reads its output.
"""
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MISBEHAVE = os.environ.get('DARS_TEST_MISBEHAVE', '').split()


def _only_when(name):
    return pytest.mark.skipif(name not in MISBEHAVE, reason=f'misbehaves on purpose: DARS_TEST_MISBEHAVE={name}')


@_only_when('crash')
def test_kills_its_own_worker():
    time.sleep(1)                                 # the other worker has its queue by then
    os.kill(os.getpid(), signal.SIGKILL)          # as the kernel's out-of-memory killer would


@_only_when('crash')
@pytest.mark.xdist_group('queued')
@pytest.mark.parametrize('i', range(30))
def test_queued_on_the_other_worker(i):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a worker that lets the run's interrupt go by: it must be killed
    time.sleep(4)                                 # 120 s of work that a stopped run must not wait for


@_only_when('python-hang')
@pytest.mark.timeout(3)
def test_waits_in_python():
    time.sleep(600)


@_only_when('native-hang')
@pytest.mark.timeout(3)
def test_waits_in_native_code_holding_the_lock():
    "A deadlock in C while holding the interpreter lock: a plain mutex locked twice by its own thread."
    libc, mutex = ctypes.PyDLL(None), ctypes.create_string_buffer(64)   # zeros: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)               # no signal ends this wait, and the lock is never let go


@_only_when('cell-left-running')
def test_leaves_a_cell_running():
    "A cell past its time limit runs on in its shell's thread after the test that started it."
    from execnb.shell import CaptureShell
    shell = CaptureShell()
    shell.run('import time\ndef wait(): time.sleep(3)\nwait()', timeout=1)


def test_a_bystander():
    assert True


def make_test_options() -> list[str]:
    "The pytest options of the Makefile's `test` target."
    recipe = re.search(r'^test:.*\n\t(.+)$', (ROOT / 'Makefile').read_text(), re.M).group(1)
    return recipe.split(' -m pytest ', 1)[1].split()


def run_misbehaving(which: str, *tests: str, limit: float = 150) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, 'DARS_TEST_MISBEHAVE': which, 'DARS_TEST_HARD_GRACE_S': '3'}
    env.pop('DARS_TEST_RUN_DIR', None)
    ids = [f'tests/test_harness.py::{t}' for t in tests]
    start = time.monotonic()
    res = subprocess.run([sys.executable, '-m', 'pytest', *make_test_options(), '-p', 'no:cacheprovider', *ids],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
    return res, time.monotonic() - start


def test_make_test_uses_the_options_checked_here():
    opts = make_test_options()
    assert '--max-worker-restart=0' in opts and '-n' in opts, opts


@pytest.mark.timeout(200)
def test_a_crashed_worker_ends_the_run_naming_its_test():
    # the other worker holds 120 s of queued tests: the run must end long before (measured: about 5 s)
    res, took = run_misbehaving('crash', 'test_kills_its_own_worker', 'test_queued_on_the_other_worker', limit=60)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "crashed while running 'tests/test_harness.py::test_kills_its_own_worker'" in out, out[-3000:]
    assert 'replacing crashed worker' not in out, out[-3000:]
    assert re.search(r'1 failed, \d+ passed, 1 skipped|1 failed, 1 skipped', out), out[-3000:]   # one stopped, not failed


@pytest.mark.timeout(200)
def test_a_hang_in_python_fails_its_test_with_its_stack_and_the_run_goes_on():
    res, took = run_misbehaving('python-hang', 'test_waits_in_python', 'test_a_bystander')
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert re.search(r'FAILED tests/test_harness.py::test_waits_in_python - Failed: Timeout', out), out[-3000:]
    assert re.search(r'>\s+time.sleep\(600\)', out) and '1 passed' in out, out[-3000:]   # where it waited


@pytest.mark.timeout(200)
def test_a_hang_in_native_code_holding_the_lock_ends_with_every_stack():
    res, took = run_misbehaving('native-hang', 'test_waits_in_native_code_holding_the_lock')
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "crashed while running 'tests/test_harness.py::test_waits_in_native_code_holding_the_lock'" in out
    # the watchdog's dump: the test's own line, under the header that names it
    assert 'passed its limit of 3 s by 3 s; every thread' in out, out[-3000:]
    assert re.search(r'test_harness.py", line \d+ in test_waits_in_native_code_holding_the_lock', out), out[-3000:]


@pytest.mark.timeout(200)
def test_a_cell_that_outlives_its_test_fails_that_test():
    res, took = run_misbehaving('cell-left-running', 'test_leaves_a_cell_running', 'test_a_bystander')
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert 'ERROR tests/test_harness.py::test_leaves_a_cell_running' in out, out[-3000:]
    assert 'ERROR at teardown of test_leaves_a_cell_running' in out, out[-3000:]   # the test that left it, not a later one
    assert 'a notebook cell outlived this test, still running' in out and 'line 2, in wait' in out, out[-3000:]
    assert re.search(r'2 passed, 1 error', out), out[-3000:]       # the test itself and the bystander pass
