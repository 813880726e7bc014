"Diagnostics on real repeated-sample data do not depend on the names or the order of the models."
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dars_nb.diagnostics import diagnose
from dars_nb.observations import read_observations

ROOT = Path(__file__).resolve().parents[1]
REAL_GRIDS = [ROOT / 'nbs' / 'tutorials' / 'data' / 'local_mmlu_grid.jsonl']
RATES = ['outcome_instability', 'winner_flip_rate', 'single_vs_da_disagreement']
VARIANCES = ['input_variance', 'output_variance']


def renamed_and_reordered(obs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    "The same observations with the model names reversed (the name that sorted first sorts last) and the rows shuffled."
    names = sorted(set(obs['model'].astype(str)))
    renamed = obs.assign(model=obs['model'].astype(str).map(dict(zip(names, names[::-1]))))
    return renamed.sample(frac=1, random_state=seed).reset_index(drop=True)


def assert_diagnostics_name_invariant(obs: pd.DataFrame):
    "Diagnose `obs` and its renamed, reordered copy: identical rates, variances equal up to summation order."
    a, b = diagnose(obs), diagnose(renamed_and_reordered(obs))
    # the rates are counts over counts: exactly equal
    pd.testing.assert_frame_equal(a[RATES], b[RATES], check_exact=True)
    # the variances sum the same terms with the model axis permuted; 1e-12 is far above the 1e-16-level
    # difference reordering a sum of a few thousand terms of size ≤ 0.25 can make
    np.testing.assert_allclose(a[VARIANCES].to_numpy(), b[VARIANCES].to_numpy(), rtol=0, atol=1e-12)
    return a


@pytest.mark.parametrize('path', REAL_GRIDS, ids=[p.name for p in REAL_GRIDS])
def test_real_grid_diagnostics_do_not_depend_on_model_names(path):
    obs = read_observations(path)
    assert obs['model'].nunique() >= 2 and obs['rewrite_id'].nunique() * obs['sample_id'].nunique() >= 2
    table = assert_diagnostics_name_invariant(obs)
    assert set(table.index) == set(obs['dataset'].astype(str))
