"""Run every notebook through nbdev's own test runner, so one pytest summary covers notebooks and tests/; and check that
the outputs a notebook keeps are the ones its code produces now (`tools.docs_outputs.compare_outputs`)."""
import gc
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from nbdev.config import get_config
import nbdev.test
from nbdev.test import test_nb as run_notebook  # renamed so pytest does not collect it
from execnb.shell import CaptureShell

from dars_nb.testing import forced_test_flags
from tools.docs_notebooks import release_shell, runs_in_tests
from tools.docs_outputs import PROJECT_FOLDERS, compare_outputs

CFG = get_config()
NBS_PATH = CFG.path('nbs_path')
NOTEBOOKS = sorted(p for p in NBS_PATH.rglob('*.ipynb')
                   if not any(part.startswith(('.', '_')) for part in p.relative_to(NBS_PATH).parts))


def _flags():
    "Skip the `tst_flags` cells unless `DARS_TEST_FLAGS` (space-separated) forces them."
    forced = sorted(forced_test_flags())
    return [f for f in CFG.tst_flags.split() if f not in forced], forced


@pytest.mark.parametrize('nb', NOTEBOOKS, ids=[str(p.relative_to(NBS_PATH)) for p in NOTEBOOKS])
def test_notebook(nb, monkeypatch):
    import altair as alt
    alt.renderers.enable('svg')            # charts as the saved outputs hold them (`make outputs`)
    ran = []                               # nbdev's runner hands the notebook it ran to `write_nb` when asked to save
    monkeypatch.setattr(nbdev.test, 'write_nb', lambda executed, path: ran.append(executed))
    shells = []                            # (the shell that ran it, the `__main__` it replaced), to put both right afterwards
    class _Shell(CaptureShell):
        def __init__(self, *args, **kwargs):
            main = sys.modules.get('__main__'); super().__init__(*args, **kwargs); shells.append((self, main))
    monkeypatch.setattr(nbdev.test, 'CaptureShell', _Shell)
    try: _run_and_compare(nb, ran)
    finally:
        # IPython keeps every shell alive until exit (an atexit hook), and with it every object the notebook made (a
        # worker that runs forty notebooks would hold all of them); and it installs the shell's namespace as
        # `sys.modules['__main__']`, a module without `__spec__`: left there, a later test in this worker that spawns
        # processes (a Dask `LocalCluster`) fails in `multiprocessing.spawn`
        for shell, main in shells: release_shell(shell, main)
        gc.collect()
    assert shells and sys.modules.get('__main__') is shells[0][1], 'the notebook\'s shell did not give `__main__` back'


def _run_and_compare(nb, ran):
    skip, force = _flags()
    # no limit per cell: the test's own limit (pytest-timeout) fails a notebook that hangs, with every thread's stack,
    # the cell's own thread included
    ok, _ = run_notebook(nb, skip_flags=skip, force_flags=force, basepath=CFG.config_path, cell_timeout=None,
                         save=True)
    assert ok, f'{nb.name} failed (see the cell error above)'
    # (that the docs build can render it, running only exported cells and cells with an import, is tests/test_docs_site.py's
    # check: its site is built from every notebook, and a page that cannot be made fails it, named)
    if nb.parent != NBS_PATH or not nb.name[:1].isdigit(): return   # the pages keep outputs of their slow cells too
    executed = [c for c in ran[0].cells if c.cell_type == 'code']
    # the cells whose outputs `make outputs` keeps: those the tests run by default (`DARS_TEST_FLAGS=slow` runs the
    # `slow` ones too, and their outputs are not kept)
    kept = CFG.tst_flags.split()
    ids = {c.get('id') for c in executed if runs_in_tests(c, kept) and 'outputs' in c}
    saved = [c for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code']
    diffs = compare_outputs(saved, executed, ids)
    assert not diffs, (f"{nb.name}: {len(diffs)} kept output(s) differ from what the code shows now "
                       f"(make outputs saves them again):\n" + '\n'.join(diffs[:10]))


def _machine_paths() -> re.Pattern:
    """Where a kept output shows the machine it was made on: an installed package's file, the home folder, a checkout's
    path (a path into one of its folders, outside the temporary folder: `report.md` in a run's temporary folder is not one)."""
    tmp = re.escape(tempfile.gettempdir().rstrip('/'))
    return re.compile(r'site-packages/'                                    # a traceback or a warning from a package
                      r'|' + re.escape(str(Path.home())) + r'/'            # whoever made the outputs
                      r'|(?<![\w.<>~])(?!' + tmp + r'/)/(?:[\w.+-]+/)+(?:' + '|'.join(PROJECT_FOLDERS) + r')\b')


def test_project_folders_are_the_checkouts_own():
    "The folders the output checks take for a checkout's own are the ones it tracks (a new one would go unmasked)."
    root = Path(__file__).resolve().parents[1]
    if not (root / '.git').exists(): pytest.skip('not a git checkout: no list of tracked folders to compare with')
    tracked = subprocess.run(['git', 'ls-files'], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    top = {f.split('/')[0] for f in tracked if '/' in f and not f.startswith('.')}
    assert top == set(PROJECT_FOLDERS), f'tracked top folders {sorted(top)} against PROJECT_FOLDERS {sorted(PROJECT_FOLDERS)}'


def test_kept_outputs_name_no_machine_paths():
    """The outputs the notebooks keep (shown on the site and by a code host) hold no path of the machine that made them:
    no traceback or warning of an installed package, no home folder, no checkout's own path."""
    machine, found = _machine_paths(), []
    for nb in NOTEBOOKS:
        for i, cell in enumerate(json.loads(nb.read_text())['cells']):
            for out in cell.get('outputs', []):
                texts = [out.get('text', '')] + [v for k, v in out.get('data', {}).items() if k != 'image/png']
                for text in (''.join(t) if isinstance(t, list) else str(t) for t in texts):
                    found += [f'{nb.relative_to(NBS_PATH)} cell {i}: …{text[max(m.start() - 40, 0):m.end() + 20]!r}'
                              for m in machine.finditer(text)]
    assert NOTEBOOKS and not found, f'{len(found)} kept output(s) show a machine path:\n' + '\n'.join(found[:20])

