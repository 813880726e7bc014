"""The package an index would take: `python -m build` makes an sdist and, from it, a wheel; `twine check --strict`
passes on both; they name one version, the one `dars --version` prints; the project's addresses are the well-known
docs and source links; the wheel holds every module and data file of the package, and the sdist what the README
names (notebooks, chart images, data licences). The wheel is then installed with no dependencies and no index into a
fresh virtualenv (no system site-packages) where `dars --version` runs, and every module of the package imports
from that install, its dependencies taken from the running interpreter's site-packages, appended after it.

The checkout is copied first, so the build writes nothing into it (other tests build from it at the same time);
nothing is downloaded (`--no-isolation`: the build uses this interpreter's setuptools).
"""
import ast
import email
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xdist_group('package'), pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCE = shutil.ignore_patterns('.git', '.venv', '_site', '_docs', '_proc', 'build', 'dist', 'report', '*.egg-info',
                                    'test-artifacts', '.cache', '.pytest_cache', '.hypothesis', '__pycache__', '*.py[cod]')


def _version_in_source() -> str:
    "`__version__` of dars_nb/__init__.py, read without importing it (the single place the version is written)."
    tree = ast.parse((ROOT / 'dars_nb' / '__init__.py').read_text(encoding='utf-8'))
    return next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == '__version__')


def _user_env() -> dict:
    "The environment without PYTHONPATH/PYTHONHOME, which would show the interpreter this checkout."
    return {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'PYTHONHOME')}


def _run(*cmd, cwd=None, timeout=240):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=_user_env(),
                          cwd=cwd or tempfile.gettempdir())


@pytest.fixture(scope='module')
def work():
    tmp = Path(tempfile.mkdtemp(prefix='dars-package-'))   # its own folder: pytest's numbered temp folders are pruned by other runs
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope='module')
def dists(work) -> dict:
    "{'sdist': path, 'wheel': path}: `python -m build` on a copy of the checkout (the wheel built from the sdist)."
    src = work / 'src'
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    res = _run(sys.executable, '-m', 'build', '--no-isolation', '--outdir', work / 'dist', src)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    built = sorted((work / 'dist').iterdir(), key=lambda p: p.suffix)
    assert [p.suffix for p in built] == ['.gz', '.whl'], built
    return {'sdist': built[0], 'wheel': built[1]}


@pytest.fixture(scope='module')
def wheel_files(dists) -> list:
    with zipfile.ZipFile(dists['wheel']) as z: return z.namelist()


@pytest.fixture(scope='module')
def sdist_files(dists) -> list:
    "The sdist's files, relative to its top folder."
    with tarfile.open(dists['sdist']) as t: return [n.split('/', 1)[1] for n in t.getnames() if '/' in n]


def _wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
        return email.message_from_string(z.read(name).decode("utf-8"))


def test_twine_check_passes(dists):
    res = _run(sys.executable, '-m', 'twine', 'check', '--strict', dists['sdist'], dists['wheel'], timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count('PASSED') == 2, res.stdout


def test_one_version(dists):
    "The file names, the wheel's METADATA and the sdist's PKG-INFO carry the version written in dars_nb/__init__.py."
    v = _version_in_source()
    assert re.fullmatch(r'\d+\.\d+\.\d+', v), v
    assert dists['wheel'].name == f'dars_nb-{v}-py3-none-any.whl'
    assert dists['sdist'].name == f'dars_nb-{v}.tar.gz'
    assert _wheel_metadata(dists['wheel'])['Version'] == v
    with tarfile.open(dists['sdist']) as t:
        assert email.message_from_bytes(t.extractfile(f'dars_nb-{v}/PKG-INFO').read())['Version'] == v


# Labels an index shows with its docs and source icons (the "well-known project URLs" of the packaging spec:
# the label lower-cased, without punctuation or spaces)
WELL_KNOWN = {'docs': {'docs', 'documentation'}, 'source': {'source', 'repository', 'sourcecode', 'github'}}

def _well_known(label: str) -> str | None:
    norm = re.sub(r'[\W_]', '', label.lower())
    return next((k for k, names in WELL_KNOWN.items() if norm in names), None)

def test_project_urls_and_description(dists):
    "The wheel names its docs and its source with https addresses; its description is the README, as Markdown."
    meta = _wheel_metadata(dists['wheel'])
    urls = dict(u.split(', ', 1) for u in meta.get_all('Project-URL'))
    kinds = {_well_known(label): url for label, url in urls.items()}
    assert {'docs', 'source'} <= set(kinds), urls
    assert all(u.startswith('https://') for u in urls.values()), urls
    declared = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['urls']
    assert urls == declared
    assert meta['Description-Content-Type'] == 'text/markdown'
    assert meta.get_payload().strip() == (ROOT / 'README.md').read_text(encoding='utf-8').strip()

def test_well_known_labels():
    assert [_well_known(l) for l in ('Docs', 'Source Code', 'Repository', 'Home-page', 'Issues')] == \
           ['docs', 'source', 'source', None, None]


def _package_files() -> set:
    "Every file of the package in the checkout (modules and data), as paths in a wheel."
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / 'dars_nb').rglob('*')
            if p.is_file() and '__pycache__' not in p.parts and p.suffix not in ('.pyc', '.pyo')}

def test_wheel_holds_the_package(wheel_files):
    "Every module and data file of dars_nb/ (the chat page's static files among them), and nothing from outside it."
    package = _package_files()
    assert 'dars_nb/serve/static/chat.html' in package
    assert package == {n for n in wheel_files if n.startswith('dars_nb/')}
    assert all(n.startswith(('dars_nb/', 'dars_nb-')) for n in wheel_files), wheel_files


def test_sdist_holds_what_the_readme_names(sdist_files):
    "The notebooks, chart images and commands the README names, every notebook, the data with its licences, the tests."
    files = set(sdist_files)
    readme = (ROOT / 'README.md').read_text(encoding='utf-8')
    named = set(re.findall(r'`((?:nbs|data|tools|bench|examples)/[^`\s]+)`', readme))
    assert any(n.startswith('nbs/') for n in named), 'the README names no notebook any more: update this test'
    must = named | {'README.md', 'LICENSE', 'Makefile', 'pyproject.toml', 'tools/setup.sh', 'tools/constraints.txt'}
    for folder in ('nbs', 'data', 'docs_assets', 'tests'):
        must |= {p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob('*')
                 if p.is_file() and not set(p.parts) & {'__pycache__', '.ipynb_checkpoints'} and p.suffix != '.pyc'}
    licences = {m for m in must if m.startswith('data/') and Path(m).name == 'LICENSE'}
    assert len(licences) >= 4, licences          # the shipped MMLU, MATH, DROP and LLMRouter extracts keep theirs
    assert sorted(must - files) == []


@pytest.fixture(scope='module')
def clean_venv(dists, work) -> Path:
    "A fresh virtualenv without system site-packages holding the wheel alone (`--no-deps --no-index`)."
    env_dir = work / 'venv'
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    res = _run(env_dir / 'bin' / 'python', '-m', 'pip', 'install', '-q', '--no-deps', '--no-index', dists['wheel'])
    assert res.returncode == 0, res.stderr[-2000:]
    return env_dir


def test_installed_wheel_prints_its_version(clean_venv):
    "`dars --version` and `python -m dars_nb --version` of the installed wheel, with none of its dependencies."
    v = _version_in_source()
    for cmd in ([clean_venv / 'bin' / 'dars'], [clean_venv / 'bin' / 'python', '-m', 'dars_nb']):
        res = _run(*cmd, '--version', timeout=60)
        assert (res.returncode, res.stdout.strip()) == (0, f'dars {v}'), res.stderr[-2000:]
    res = _run(clean_venv / 'bin' / 'python', '-c', 'import importlib.metadata as m; print(m.version("dars_nb"))', timeout=60)
    assert res.stdout.strip() == v, res.stderr


IMPORT_ALL = """
import importlib, importlib.resources, sys
names = sys.argv[1:]
for n in names: importlib.import_module(n)
outside = [n for n in names if not sys.modules[n].__file__.startswith(sys.prefix)]
assert not outside, f'imported from outside the virtualenv: {outside}'
assert importlib.resources.files('dars_nb.serve').joinpath('static', 'chat.html').is_file()
print(len(names))
"""

def test_installed_wheel_imports_every_module(clean_venv, wheel_files):
    "Each module of the wheel imports from the fresh install; dependencies from this interpreter's site-packages, after it."
    site = Path(_run(clean_venv / 'bin' / 'python', '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])').stdout.strip())
    (site / 'zz_dependencies.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')   # appended after the venv's own
    modules = sorted(n[:-3].replace('/', '.').removesuffix('.__init__') for n in wheel_files
                     if n.startswith('dars_nb/') and n.endswith('.py') and not n.endswith('__main__.py'))
    assert len(modules) > 50, modules
    res = _run(clean_venv / 'bin' / 'python', '-c', IMPORT_ALL, *modules, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == str(len(modules))


def test_modules_are_what_the_notebooks_export(tmp_path):
    "Every generated module (and _modidx.py) is what `nbdev-export` makes of the committed notebooks: none edited, none stale."
    for part in ('pyproject.toml', 'nbs', 'dars_nb'):
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copyfile)(ROOT / part, tmp_path / part)
    package = tmp_path / 'dars_nb'
    generated = {p.relative_to(package) for p in package.rglob('*.py')
                 if p.name == '_modidx.py' or 'AUTOGENERATED' in p.read_text(encoding='utf-8')[:300]}
    for rel in generated: (package / rel).unlink()   # only what the notebooks write comes back
    res = subprocess.run([str(Path(sys.executable).with_name('nbdev-export'))], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    regenerated = {p.relative_to(package) for p in package.rglob('*.py')}
    committed = {p.relative_to(ROOT / 'dars_nb') for p in (ROOT / 'dars_nb').rglob('*.py')}
    assert regenerated == committed, (f"modules no notebook exports: {sorted(map(str, committed - regenerated))}; "
                                      f"exported but not committed: {sorted(map(str, regenerated - committed))}")
    stale = [str(rel) for rel in sorted(generated) if (package / rel).read_bytes() != (ROOT / 'dars_nb' / rel).read_bytes()]
    assert not stale, f"modules that differ from their notebooks (run nbdev-export and commit): {stale}"


def test_notebooks_are_committed_clean(tmp_path):
    "`nbdev-clean` changes no committed notebook: no execution count, kernel metadata or cell id left to clean."
    for part in ('pyproject.toml', 'nbs'):
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copyfile)(ROOT / part, tmp_path / part)
    res = subprocess.run([str(Path(sys.executable).with_name('nbdev-clean'))], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    changed = [str(p.relative_to(tmp_path)) for p in sorted((tmp_path / 'nbs').rglob('*.ipynb'))
               if p.read_bytes() != (ROOT / p.relative_to(tmp_path)).read_bytes()]
    assert not changed, f"notebooks nbdev-clean would change (run it and commit): {changed}"
