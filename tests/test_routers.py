"The seven router families of `dars_nb.routers` against one contract (`check_router`), and beating random."
import numpy as np
import pandas as pd
import pytest

from dars_nb.routers import FAMILIES, ROUTERS
from dars_nb.routers.base import align
from dars_nb.routers.check import check_router
from dars_nb.simulate import simulate
from dars_nb.stats import supervision, normalize_cost
from dars_nb.evaluate import per_query_view_utility, view_utility, random_utility

NAMES = [f.name for f in FAMILIES]
# Small, quick settings: few epochs for the torch routers, a short budget for the MLP.
FAST = {
    'MLP': dict(hidden_layer_sizes=(32,), max_iter=150, random_state=0),
    'kNN': dict(n_neighbors=10, random_state=0),   # unused by kNN, accepted like every router's
    'MIRT': dict(epochs=60, random_state=0),
    'EmbedLLM': dict(epochs=60, random_state=0),
    'RM-Softmax': dict(epochs=60, random_state=0),
    'GraphRouter': dict(epochs=60, random_state=0),
    'AvengersPro': dict(n_clusters=12, random_state=0),
}


def fast(name):
    "A quick-to-fit router of the family `name`."
    return ROUTERS[name](**FAST[name])


@pytest.fixture(scope='module')
def world():
    "A small GPQA-like world: 120 training queries (5×5 grids), 150 test queries, cost normalised once."
    obs, feats, _ = simulate('gpqa_like', n_train=120, n_test=150, seed=0)
    obs = normalize_cost(obs)
    dars = supervision(obs, 'dars')
    single = supervision(obs, 'single', n_draws=3, seed=0)
    test_ids = obs.loc[obs['split'] == 'test', 'query_id'].astype(str).unique()
    return dict(obs=obs, dars=dars, single=single, X=align(feats, dars.query_ids), test_ids=test_ids,
                X_test=align(feats, test_ids))


def test_registry_names_every_family():
    assert list(ROUTERS) == NAMES and set(FAST) == set(NAMES)
    assert [c.__name__ for c in ROUTERS.values()] == [f.class_name for f in FAMILIES]
    assert [c.__module__ for c in ROUTERS.values()] == [f.module for f in FAMILIES]


@pytest.mark.parametrize('name', NAMES)
def test_every_router_accepts_random_state(name):
    cls = ROUTERS[name]
    assert cls(random_state=7).get_params()['random_state'] == 7


@pytest.mark.parametrize('name', NAMES)
def test_keeps_the_router_contract(world, name):
    "Parameters by name, clone, shapes for one and three draws, determinism and one-line errors."
    check_router(fast(name), world['X'], world['single'], world['X_test'][:17])


@pytest.mark.parametrize('name', NAMES)
def test_dars_router_beats_random(world, name):
    obs, test_ids = world['obs'], world['test_ids']
    choice = pd.Series(fast(name).fit(world['X'], world['dars']).predict(world['X_test']), index=test_ids)
    for view in ('rewrite', 'decode'):
        table = per_query_view_utility(obs, view)
        assert view_utility(choice, table) > random_utility(table) + 0.02, view


@pytest.mark.parametrize('name', NAMES)
def test_renamed_models_route_alike(world, name):
    "Seeded, a router trained on the same data routes the same queries to the same models whatever the models are called."
    obs = world['obs']
    models = sorted(obs['model'].astype(str).unique())
    # names that sort in the opposite order: the supervision's model axis comes reversed
    new = {m: f'{chr(ord("z") - i)}-{m}' for i, m in enumerate(models)}
    old = {v: k for k, v in new.items()}
    renamed = supervision(obs.assign(model=obs['model'].astype(str).map(new)), 'dars')
    assert [old[m] for m in renamed.models] == models[::-1]
    one = fast(name).fit(world['X'], world['dars'])
    other = fast(name).fit(world['X'], renamed)
    assert [old[m] for m in other.predict(world['X_test'])] == list(one.predict(world['X_test']))
    # the same computation in the same order: the utilities agree to the last bit, model by model
    U, V = one.predict_utility(world['X_test']), other.predict_utility(world['X_test'])
    np.testing.assert_array_equal(U, V[..., [renamed.models.index(new[m]) for m in one.models_]])
