"""The modules that moved into their chapters' packages still import under their old names for one release, with a
DeprecationWarning, and give the very objects of their new homes."""
import importlib
import sys
import warnings

import pytest

import dars_nb

OLD_NAMES = sorted(dars_nb.MOVED_MODULES)


@pytest.mark.parametrize('old', OLD_NAMES)
def test_an_old_name_imports_with_a_warning(old):
    sys.modules.pop(f'dars_nb.{old}', None)
    with pytest.warns(DeprecationWarning, match=f'dars_nb.{old} has moved to dars_nb.{dars_nb.MOVED_MODULES[old][0]}'):
        module = importlib.import_module(f'dars_nb.{old}')
    homes = [importlib.import_module(f'dars_nb.{m}') for m in dars_nb.MOVED_MODULES[old]]
    assert module.__all__, old
    for name in module.__all__:          # every public name, from the first home that holds it
        assert getattr(module, name) is next(getattr(h, name) for h in homes if hasattr(h, name)), name
    with pytest.raises(AttributeError, match='no attribute'): module.no_such_name


def test_the_names_of_the_old_modules_that_moved_out_of_them():
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        from dars_nb.release import load_observations, write_release, format_options, read_release
        from dars_nb.calibrate import check_lambda, calibrate
    from dars_nb.sources import load_observations as now
    from dars_nb.bundle.model_name import check_lambda as lam_now
    assert load_observations is now and check_lambda is lam_now


def test_no_module_of_the_library_imports_an_old_name():
    "The library itself never goes through the stand-ins: a fresh interpreter importing every module warns nothing."
    import subprocess
    code = ("import warnings, pkgutil, importlib, dars_nb; warnings.simplefilter('error', DeprecationWarning)\n"
            "skip = ('dars_nb.bundle.litellm', 'dars_nb.experiments.cluster')\n"
            "for m in pkgutil.walk_packages(dars_nb.__path__, 'dars_nb.'):\n"
            "    if not m.name.startswith(skip) and m.name != 'dars_nb.__main__':\n"
            "        try: importlib.import_module(m.name)\n"
            "        except ImportError as e:\n"
            "            if 'needs' not in str(e) and 'No module named' not in str(e): raise\n")
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
