"The seven router families of `dars_nb.routers` against one contract: shapes, determinism, clone, errors, and beating random."
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from dars_nb.routers import (ROUTERS, Router, MLPRouter, KNNRouter, MIRTRouter, EmbedLLMRouter, RMSoftmaxRouter,
                             GraphRouter, AvengersProRouter)
from dars_nb.routers.base import align
from dars_nb.simulate import simulate
from dars_nb.stats import supervision, normalize_cost
from dars_nb.evaluate import per_query_view_utility, view_utility, random_utility

# Small, quick settings: few epochs for the torch routers, a short budget for the MLP.
FAST = {
    'MLP': lambda: MLPRouter(hidden_layer_sizes=(32,), max_iter=150, random_state=0),
    'kNN': lambda: KNNRouter(n_neighbors=10, random_state=0),   # unused by kNN, accepted like every router's
    'MIRT': lambda: MIRTRouter(epochs=60, random_state=0),
    'EmbedLLM': lambda: EmbedLLMRouter(epochs=60, random_state=0),
    'RM-Softmax': lambda: RMSoftmaxRouter(epochs=60, random_state=0),
    'GraphRouter': lambda: GraphRouter(epochs=60, random_state=0),
    'AvengersPro': lambda: AvengersProRouter(n_clusters=12, random_state=0),
}
NAMES = list(FAST)


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
    assert list(ROUTERS) == NAMES
    assert all(issubclass(cls, Router) for cls in ROUTERS.values())
    assert {type(FAST[n]()) for n in NAMES} == set(ROUTERS.values())


@pytest.mark.parametrize('name', NAMES)
def test_every_router_accepts_random_state(name):
    cls = ROUTERS[name]
    assert cls(random_state=7).get_params()['random_state'] == 7


@pytest.mark.parametrize('name', NAMES)
def test_shapes_one_and_three_draws(world, name):
    X, Xt, K = world['X'], world['X_test'][:17], len(world['dars'].models)
    r1 = FAST[name]().fit(X, world['dars'])
    assert r1.predict_utility(Xt).shape == (17, K)
    assert r1.predict(Xt).shape == (17,)
    assert set(r1.predict(Xt)) <= set(world['dars'].models)
    r3 = FAST[name]().fit(X, world['single'])
    assert r3.predict_utility(Xt).shape == (3, 17, K)
    assert r3.predict(Xt).shape == (3, 17)
    assert np.isfinite(r3.predict_utility(Xt)).all()


@pytest.mark.parametrize('name', NAMES)
def test_deterministic_under_random_state(world, name):
    X, Xt, sup = world['X'], world['X_test'], world['single']
    a = FAST[name]().fit(X, sup).predict_utility(Xt)
    b = FAST[name]().fit(X, sup).predict_utility(Xt)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('name', NAMES)
def test_clone_is_an_unfitted_copy(world, name):
    fitted = FAST[name]().fit(world['X'], world['dars'])
    copy = clone(fitted)
    assert type(copy) is type(fitted)
    assert not hasattr(copy, 'models_')
    with pytest.raises(ValueError, match='not fitted'):
        copy.predict(world['X_test'])


def _one_line_error(fn, match):
    with pytest.raises(ValueError, match=match) as e:
        fn()
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('name', NAMES)
def test_bad_input_is_a_one_line_value_error(world, name):
    X, Xt, dars = world['X'], world['X_test'], world['dars']
    X_nan = X.copy()
    X_nan[5, 3] = np.nan
    _one_line_error(lambda: FAST[name]().fit(X_nan, dars), 'NaN')
    _one_line_error(lambda: FAST[name]().predict(Xt), 'not fitted')
    _one_line_error(lambda: FAST[name]().fit(X[:50], dars), 'supervision has 120 queries but features have 50 rows')
    _one_line_error(lambda: FAST[name]().fit(X, dars.label_names()), 'must be a dars_nb.stats.Supervision')
    fitted = FAST[name]().fit(X, dars)
    _one_line_error(lambda: fitted.predict(Xt[:, :7]), 'features have 7 columns but the router was fitted on 32')
    Xt_nan = Xt.copy()
    Xt_nan[0, 0] = np.inf
    _one_line_error(lambda: fitted.predict(Xt_nan), 'NaN or infinite')
    broken = dars.subset(dars.query_ids)
    broken.mu_q = broken.mu_q.copy()
    broken.mu_q[0, 2, 1] = np.nan
    _one_line_error(lambda: FAST[name]().fit(X, broken), 'supervision mu_q contains NaN')


@pytest.mark.parametrize('name', NAMES)
def test_dars_router_beats_random(world, name):
    obs, test_ids = world['obs'], world['test_ids']
    choice = pd.Series(FAST[name]().fit(world['X'], world['dars']).predict(world['X_test']), index=test_ids)
    for view in ('rewrite', 'decode'):
        table = per_query_view_utility(obs, view)
        assert view_utility(choice, table) > random_utility(table) + 0.02, view
