"""A wheel installed with no extra, in a fresh virtualenv, as a user would: the core runs, the rest says which extra.

Builds the wheel of this checkout, installs it without extras into a new virtualenv in a temporary
folder (pip's cache and the configured package index are used; nothing else is fetched), then runs
simulate → diagnose → supervision → KNNRouter there, and checks that the neural routers,
`dars collect` and `dars reproduce` each name the extra they need. The size of the core install is a
benchmark figure, not a test: this only catches a heavy extra leaking into the core.
Marked `slow` (a heavier check, run by `make test` like the others).
"""
import os, shutil, subprocess, sys, tempfile, textwrap, venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE_LIMIT_MB = 700   # well above the core's own size; an extra leaking into the core (torch alone) is several times more


def _run(*cmd, cwd=None):
    "Run `cmd` as a user would: no PYTHONPATH (it would show pip and Python this checkout), outside the checkout."
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1200, env=env,
                          cwd=cwd or tempfile.gettempdir())


@pytest.fixture(scope='module')
def core_venv():
    tmp = Path(tempfile.mkdtemp(prefix='dars-core-'))   # its own folder: pytest's numbered temp folders are pruned by other runs
    wheels = tmp / 'wheels'
    res = _run(sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q', '-w', wheels, ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    env_dir = tmp / 'venv'
    venv.create(env_dir, with_pip=True)
    py = env_dir / 'bin' / 'python'
    res = _run(py, '-m', 'pip', 'install', '-q', next(wheels.glob('dars_nb-*.whl')))
    assert res.returncode == 0, res.stderr[-2000:]
    assert (env_dir / 'bin' / 'dars').exists()
    yield env_dir
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_core_installs_no_extra_package(core_venv):
    site = next((core_venv / 'lib').glob('python3.*')) / 'site-packages'
    for heavy in ('torch', 'transformers', 'sentence_transformers', 'sympy', 'openai', 'nbdev', 'llama_cpp'):
        assert not (site / heavy).exists(), f'{heavy} is installed by the core'
    size_mb = sum(f.stat().st_size for f in site.rglob('*') if f.is_file()) / 2**20
    print(f'core site-packages: {size_mb:.0f} MB')
    assert size_mb < CORE_LIMIT_MB


@pytest.mark.slow
def test_core_pipeline_runs_without_extras(core_venv):
    script = textwrap.dedent('''
        import numpy as np
        from dars_nb.simulate import simulate
        from dars_nb.diagnostics import diagnose
        from dars_nb.stats import supervision
        from dars_nb.routers import KNNRouter
        from dars_nb.routers.base import align
        obs, features, truth = simulate('math_like', n_train=60, n_test=20, seed=0)
        table = diagnose(obs)
        sup = supervision(obs, mode='dars')
        router = KNNRouter(n_neighbors=5).fit(align(features, sup.query_ids), sup)
        test_ids = [q for q in features.index if q not in set(sup.query_ids)]
        choice = router.predict(align(features, test_ids))
        assert len(choice) == len(test_ids) == 20 and set(choice) <= set(sup.models), choice
        assert 0 <= table['winner_flip_rate'].iloc[0] <= 1
        import dars_nb
        assert dars_nb.__file__.startswith(%r), dars_nb.__file__   # the installed wheel, not this checkout
        print('ok')
    ''' % str(core_venv))
    res = _run(core_venv / 'bin' / 'python', '-c', script)
    assert res.returncode == 0 and res.stdout.strip() == 'ok', res.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize('code,message', [
    ('from dars_nb.routers import MIRTRouter', "MIRTRouter needs torch: pip install 'dars_nb[torch]'"),
    ('from dars_nb.routers import GraphRouter', "GraphRouter needs torch: pip install 'dars_nb[torch]'"),
])
def test_missing_extra_import_names_the_extra(core_venv, code, message):
    res = _run(core_venv / 'bin' / 'python', '-c', code)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1].endswith(message), res.stderr[-500:]


@pytest.mark.slow
@pytest.mark.parametrize('argv,extra', [
    (['reproduce', '--out', 'report', '--quick'], 'torch'),
    (['collect', 'pool.toml', '--dry-run'], 'collect'),
])
def test_missing_extra_command_is_one_line(core_venv, tmp_path, argv, extra):
    res = _run(core_venv / 'bin' / 'dars', *argv, cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.count('\n') == 1 and 'Traceback' not in res.stderr, res.stderr
    assert res.stderr.startswith(f'dars {argv[0]}: error: ') and f"pip install 'dars_nb[{extra}]'" in res.stderr


@pytest.mark.slow
def test_python_m_and_version(core_venv):
    res = _run(core_venv / 'bin' / 'python', '-m', 'dars_nb', '--version')
    assert res.returncode == 0 and res.stdout.startswith('dars ')
