"""A wheel installed with no extra, in a fresh virtualenv, as a user would: the core trains and routes, the rest says which extra.

Builds the wheel of this checkout, installs it without extras into a new virtualenv in a temporary
folder (pip's cache and the configured package index are used; nothing else is fetched), then runs
simulate → diagnose → supervision → KNNRouter there, `dars train` → `dars route` for the three core
families on the shipped local grid (TF-IDF features), every `dars <command> --help`, and checks that
the neural routers, `dars collect` and `dars reproduce` each name the extra they need in one line.
Last, it adds the `serve` extra and routes a chat request through `dars serve` to a fixed-answer endpoint.
The size of the core install is a benchmark figure, not a test: this only catches a heavy extra
leaking into the core. Marked `slow` (a heavier check, run by `make test` like the others).
"""
import json, os, re, shlex, shutil, signal, subprocess, sys, tempfile, textwrap, time, urllib.error, urllib.request, venv
from pathlib import Path

import pytest
import tomllib

from dars_nb.cli import COMMANDS
from dars_nb.pool.server import free_port

pytestmark = pytest.mark.xdist_group('core_venv')   # one worker builds the session's fixture once

ROOT = Path(__file__).resolve().parents[1]
CORE_LIMIT_MB = 700   # well above the core's own size; an extra leaking into the core (torch alone) is several times more
GRID = ROOT / 'data' / 'local_grid' / 'local_grid.jsonl'   # 32 training questions × 2 local models, with their texts


def _user_env() -> dict:
    "The environment a user has: no PYTHONPATH or PYTHONHOME (they would show pip and Python this checkout)."
    return {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}


def _run(*cmd, cwd=None):
    "Run `cmd` as a user would: the user's environment, outside the checkout."
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1200, env=_user_env(),
                          cwd=cwd or tempfile.gettempdir())


@pytest.fixture(scope='module')
def wheel():
    tmp = Path(tempfile.mkdtemp(prefix='dars-core-'))   # its own folder: pytest's numbered temp folders are pruned by other runs
    res = _run(sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q', '-w', tmp / 'wheels', ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    yield next((tmp / 'wheels').glob('dars_nb-*.whl'))
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope='module')
def core_venv(wheel):
    env_dir = wheel.parents[1] / 'venv'
    venv.create(env_dir, with_pip=True)
    res = _run(env_dir / 'bin' / 'python', '-m', 'pip', 'install', '-q', wheel)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (env_dir / 'bin' / 'dars').exists()
    return env_dir


def _dars(venv_dir, *args, **kw): return _run(venv_dir / 'bin' / 'dars', *args, **kw)


def _one_line_error(res, command):
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert res.stderr.count('\n') == 1 and 'Traceback' not in res.stderr, res.stderr
    assert res.stderr.startswith(f'dars {command}: error: '), res.stderr


@pytest.mark.slow
def test_core_installs_no_extra_package(core_venv):
    site = next((core_venv / 'lib').glob('python3.*')) / 'site-packages'
    for heavy in ('torch', 'transformers', 'sentence_transformers', 'sympy', 'openai', 'nbdev', 'llama_cpp',
                  'starlette', 'uvicorn', 'openvino', 'onnx'):
        assert not (site / heavy).exists(), f'{heavy} is installed by the core'
    size_mb = sum(f.stat().st_size for f in site.rglob('*') if f.is_file()) / 2**20
    print(f'core site-packages: {size_mb:.0f} MB')
    assert size_mb < CORE_LIMIT_MB


@pytest.mark.slow
def test_core_pipeline_runs_without_extras(core_venv):
    script = textwrap.dedent('''
        import sys
        import dars_nb.routers
        assert 'torch' not in sys.modules   # the family list loads no family
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


def _train_config(folder: Path, family: str, **router) -> Path:
    "A training config for `family` on the shipped local grid, TF-IDF features, a 4-fold guard."
    params = ''.join(f'{k} = {v}\n' for k, v in router.items())
    path = folder / f'{family}.toml'
    path.write_text(f'observations = "{GRID}"\n\n[router]\nfamily = "{family}"\n{params}\n'
                    '[features]\nkind = "tfidf"\n\n[guard]\nfolds = 4\n')
    return path


@pytest.mark.slow
def test_core_trains_and_routes_knn(core_venv, tmp_path):
    "`dars train` then `dars route`, as the README shows them, on a kNN router with TF-IDF features."
    res = _dars(core_venv, 'train', _train_config(tmp_path, 'kNN', n_neighbors=5), '--out', tmp_path / 'r.dars')
    assert res.returncode == 0, res.stderr[-2000:]
    assert 'trained kNN on 32 training queries × 2 models' in res.stdout and 'held-out utility' in res.stdout
    res = _dars(core_venv, 'route', tmp_path / 'r.dars', 'What is 7 + 5?', '--explain')
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    chosen, table, verdict = lines[0], lines[1:4], lines[4:]
    assert chosen in ('smollm2', 'gemma3'), res.stdout
    assert table[0].split() == ['μ_q', 'μ_c', 'σ', 'U'], res.stdout             # a header and one row per model
    assert sorted(row.lstrip('→ ').split()[0] for row in table[1:]) == ['gemma3', 'smollm2'], res.stdout
    assert len(verdict) == 1 and chosen in verdict[0], res.stdout               # what the guard did, in one line


@pytest.mark.slow
def test_core_trains_and_routes_mlp_and_avengers(core_venv, tmp_path):
    "The other two core families through the same entry point as the console script, in one interpreter."
    configs = {f: _train_config(tmp_path, f) for f in ('MLP', 'AvengersPro')}
    script = textwrap.dedent('''
        import sys
        from dars_nb.cli import main
        for family, config in %r.items():
            out = config.replace('.toml', '.dars')
            assert main(['train', config, '--out', out, '--quiet']) == 0, family
            assert main(['route', out, 'What is 7 + 5?']) == 0, family
        assert 'torch' not in sys.modules
    ''' % {f: str(c) for f, c in configs.items()})
    res = _run(core_venv / 'bin' / 'python', '-c', script)
    assert res.returncode == 0, res.stderr[-2000:]
    assert [l for l in res.stdout.splitlines() if l] in (
        [a, b] for a in ('smollm2', 'gemma3') for b in ('smollm2', 'gemma3')), res.stdout


@pytest.mark.slow
def test_missing_config_is_named(core_venv, tmp_path):
    res = _dars(core_venv, 'train', '/nonexist.toml', '--out', tmp_path / 'r.dars')
    _one_line_error(res, 'train')
    assert 'no config file at /nonexist.toml' in res.stderr


@pytest.mark.slow
def test_every_help_works_without_its_extra(core_venv):
    "`dars <command> --help` for every command, each in a fresh interpreter without the command's extra."
    script = textwrap.dedent('''
        import contextlib, io, sys
        from dars_nb.cli import main
        command = sys.argv[1]
        with contextlib.redirect_stdout(io.StringIO()) as out: code = main([command, '--help'])
        assert code == 0 and out.getvalue().startswith(f'usage: dars {command} '), (code, out.getvalue())
        assert '--quiet' in out.getvalue()
    ''')
    procs = {c: subprocess.Popen([core_venv / 'bin' / 'python', '-c', script, c], stderr=subprocess.PIPE, text=True,
                                 cwd=tempfile.gettempdir()) for c in COMMANDS}
    failed = {c: p.communicate(timeout=300)[1][-500:] for c, p in procs.items()}
    failed = {c: err for c, err in failed.items() if procs[c].returncode != 0}
    assert not failed, failed
    res = _dars(core_venv, 'serve', '--help')   # and once through the console script
    assert res.returncode == 0 and res.stdout.startswith('usage: dars serve ') and res.stderr == ''


@pytest.mark.slow
@pytest.mark.parametrize('name', ['MIRTRouter', 'GraphRouter'])
def test_missing_extra_import_is_one_line(core_venv, name):
    "A Python import of a torch router: its traceback ends in the one line naming the extra, with nothing chained."
    res = _run(core_venv / 'bin' / 'python', '-c', f'from dars_nb.routers import {name}')
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1] == (
        f"dars_nb.extras.MissingExtra: {name} needs torch: pip install 'dars_nb[torch]' "
        "(for a CPU-only torch, first: pip install torch --index-url https://download.pytorch.org/whl/cpu)"), res.stderr
    assert res.stderr.count('Traceback') == 1 and 'direct cause' not in res.stderr, res.stderr


@pytest.mark.slow
@pytest.mark.parametrize('argv,extra', [
    (['reproduce', '--out', 'report', '--quick'], 'torch'),
    (['collect', 'pool.toml', '--dry-run'], 'collect'),
    (['serve', '--router', 'r.dars', '--pool', 'pool.toml'], 'serve'),
    (['local'], 'local'),
])
def test_missing_extra_command_is_one_line(core_venv, tmp_path, argv, extra):
    res = _dars(core_venv, *argv, cwd=tmp_path)
    _one_line_error(res, argv[0])
    assert f"pip install 'dars_nb[{extra}]'" in res.stderr


@pytest.mark.slow
def test_python_m_and_version(core_venv):
    res = _run(core_venv / 'bin' / 'python', '-m', 'dars_nb', '--version')
    assert res.returncode == 0 and res.stdout.startswith('dars ')


def _post(url: str, body: dict) -> tuple[dict, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {'content-type': 'application/json'})
    with urllib.request.urlopen(req, timeout=30) as r: return json.loads(r.read()), dict(r.headers)


@pytest.mark.slow
def test_serve_extra_routes_a_request(core_venv, wheel, tmp_path):
    """Runs last: the serve extra added to the core venv with the command the library's message names (pip keeps the
    installed dars_nb, which no index has, and fetches the extra's packages); `dars serve` routes to a fixed-answer endpoint."""
    from dars_nb.extras import install_hint
    from dars_nb.testing import FixedEndpoint
    pip, install, *packages = shlex.split(install_hint('serve'))
    assert (pip, install, packages) == ('pip', 'install', ['dars_nb[serve]'])
    res = _run(core_venv / 'bin' / 'python', '-m', 'pip', 'install', '-q', *packages)
    assert res.returncode == 0, res.stderr[-2000:]
    res = _dars(core_venv, 'train', _train_config(tmp_path, 'kNN', n_neighbors=5), '--out', tmp_path / 'r.dars', '--quiet')
    assert res.returncode == 0, res.stderr[-2000:]
    routed = _dars(core_venv, 'route', tmp_path / 'r.dars', 'What is 7 + 5?', '--quiet')
    assert routed.returncode == 0, routed.stderr[-2000:]
    chosen = routed.stdout.strip()
    with FixedEndpoint(text='Final Answer: 12', delay_s=0) as fixed:
        pool = tmp_path / 'pool.toml'
        pool.write_text(''.join(f'[models.{m}]\nbase_url = "{fixed.base_url}"\n' for m in ('smollm2', 'gemma3')))
        port = free_port()
        proc = subprocess.Popen([core_venv / 'bin' / 'dars', 'serve', '--router', tmp_path / 'r.dars', '--pool', pool,
                                 '--port', str(port), '--quiet'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_user_env(), cwd=tmp_path)
        try:
            url, deadline = f'http://127.0.0.1:{port}/v1/chat/completions', time.monotonic() + 120
            ask = {'model': 'dars-router', 'messages': [{'role': 'user', 'content': 'What is 7 + 5?'}]}
            while True:
                assert proc.poll() is None, proc.communicate()[1][-1000:]
                try: body, headers = _post(url, ask); break
                except urllib.error.HTTPError: raise         # it answered, with an error: no point waiting
                except OSError: pass                         # not listening yet
                assert time.monotonic() < deadline, 'dars serve did not answer within 120 s'
                time.sleep(0.3)
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-1000:]
    assert body['choices'][0]['message']['content'] == 'Final Answer: 12'
    assert body['model'] == headers['x-dars-model'] == chosen   # the model `dars route` picks answered


INSTALL_PAGES = [ROOT / 'nbs' / 'how_to' / '01_install.ipynb', ROOT / 'nbs' / '08_extras.ipynb']


@pytest.mark.parametrize('page', INSTALL_PAGES, ids=lambda p: p.name)
def test_install_pages_name_what_pyproject_installs(page):
    "The pages on installing name every package the core brings and every extra (a row of their table each)."
    project = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']
    text = ''.join(''.join(c['source']) for c in json.loads(page.read_text())['cells'] if c['cell_type'] == 'markdown')
    core = text[text.index('brings'):text.index('MB')]   # the sentence that lists the core's packages, up to its size
    named = {re.split(r'[<>=\[ ]', d)[0].removesuffix('-python') for d in project['dependencies']}
    assert {n for n in named if n not in core} == set(), core
    rows = set(re.findall(r'^\| `([\w-]+)`(?:, `([\w-]+)`)? \|', text, re.M))
    extras = {e for row in rows for e in row if e}
    assert set(project['optional-dependencies']) - {'dev'} <= extras, (sorted(project['optional-dependencies']), extras)
