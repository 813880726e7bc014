"Run every notebook through nbdev's own test runner, so one pytest summary covers notebooks and tests/."
import pytest
from nbdev.config import get_config
from nbdev.test import test_nb as run_notebook  # renamed so pytest does not collect it

from dars_nb.testing import forced_test_flags

CFG = get_config()
NBS_PATH = CFG.path('nbs_path')
NOTEBOOKS = sorted(p for p in NBS_PATH.rglob('*.ipynb')
                   if not any(part.startswith(('.', '_')) for part in p.relative_to(NBS_PATH).parts))


def _flags():
    "Skip the `tst_flags` cells unless `DARS_TEST_FLAGS` (space-separated) forces them."
    forced = sorted(forced_test_flags())
    return [f for f in CFG.tst_flags.split() if f not in forced], forced


@pytest.mark.parametrize('nb', NOTEBOOKS, ids=[str(p.relative_to(NBS_PATH)) for p in NOTEBOOKS])
def test_notebook(nb):
    skip, force = _flags()
    # no limit per cell: the test's own limit (pytest-timeout) fails a notebook that hangs, with every thread's stack,
    # the cell's own thread included
    ok, _ = run_notebook(nb, skip_flags=skip, force_flags=force, basepath=CFG.config_path, cell_timeout=None)
    assert ok, f'{nb.name} failed (see the cell error above)'
