"""The exported `dars_nb.adaptive` on constructed grids whose answer is known: the checks nbs/23_adaptive.ipynb does not
make (the paper's 7.75 observations, the vacuous risk test and the 2×2 corner identity are pinned there)."""
import numpy as np
import pandas as pd

from dars_nb.adaptive import (adaptive_allocation, adaptive_allocation_pairs, allocation_summary, allocation_frontier,
                              first_stage_stops, stage_statistics)

ONES, ZEROS = np.ones((5, 5)), np.zeros((5, 5))
ODD = ZEROS.copy(); ODD[0, 0] = 1          # one success in the 2×2 corner: risk at the 2×2 ceiling
DENT = ONES.copy(); DENT[0, 0] = 0         # always right but one cell: also at the ceiling
CEILING = 0.25 + 1 / (2 * np.sqrt(2))


def _table(grids, cost, dataset='c'):
    rows = []
    for (qid, m), g in grids.items():
        n, j = np.indices(g.shape)
        rows.append(pd.DataFrame(dict(dataset=dataset, split='train', view='grid', query_id=qid, model=m,
                                      rewrite_id=n.ravel() + 1, sample_id=j.ravel(), score=g.ravel(),
                                      cost=cost.get((qid, m), cost.get(m, 1.0)))))
    return pd.concat(rows, ignore_index=True)


def _grids(n_clean, n_noisy):
    return _table({(f'q{i:03d}', m): ((ONES if m == 'a' else ZEROS) if i < n_clean else ODD)
                   for i in range(n_clean + n_noisy) for m in ('a', 'b')}, {'a': 2.0, 'b': 1.0})


def _ceiling_case(n_settled):
    "200 queries with R at the ceiling and distinct margins; the last `n_settled` replaced by both-always-wrong queries."
    price = {(f'q{i:03d}', 'a'): 1 + i / 200 for i in range(200)}
    return _table({(f'q{i:03d}', m): ZEROS if (m == 'b' or i >= 200 - n_settled) else DENT
                   for i in range(200) for m in ('a', 'b')}, price)


def test_loosening_the_risk_quantile_past_the_settled_share_makes_it_vacuous_again():
    obs = _ceiling_case(60)          # 60 of 200 queries settled at R = 0, the rest at the 2×2 ceiling
    st = stage_statistics(obs)
    assert np.isclose(st['risk'][st['risk'] > 0], CEILING).all()
    f = first_stage_stops(obs, risk_levels=(0.25, 0.30, 0.31, 1.0), margin_levels=(0.75,))
    assert f['stopped'].tolist() == [0, 0, 50, 50] and f['pass_risk'].tolist() == [60, 60, 200, 200]


def test_first_stage_stops_match_the_staged_rule_and_are_monotone():
    obs = pd.concat([_ceiling_case(60), _grids(20, 30).assign(dataset='d')], ignore_index=True)
    f = first_stage_stops(obs, risk_levels=(0, 0.25, 0.5, 1), margin_levels=(0, 0.5, 0.75, 1))
    for (pr, pm), want in f.groupby(['risk_p', 'margin_p']):
        got = adaptive_allocation(obs, stages=(2, 3), quantiles=((pr, pm),))['stage'].eq(2).groupby(level=0, observed=True).sum()
        assert got.to_dict() == want.set_index('dataset')['stopped'].to_dict()
    for _, g in f.groupby('dataset'):
        cube = g.pivot(index='risk_p', columns='margin_p', values='stopped').to_numpy()
        assert (np.diff(cube, axis=0) >= 0).all() and (np.diff(cube, axis=1) <= 0).all()


def test_identities():
    obs = _grids(5, 15)
    a = adaptive_allocation(obs, quantiles=((0.5, 0.5), (0.5, 0.5)))
    assert set(a['n_obs']) <= {4, 9, 25}
    assert adaptive_allocation(obs, stages=(5,), quantiles=())['agrees'].all()


def test_pairs_rule_stops_clean_queries():
    p = adaptive_allocation_pairs(_grids(2, 2), stages=(2, 3))
    assert p['stage'].tolist() == [2, 2, 2, 2, 3, 3, 3, 3]
    assert (adaptive_allocation_pairs(_grids(2, 2), z=100)['n_obs'] == 25).all()   # huge intervals: everything to the cap


def test_frontier_keeps_every_setting():
    f = allocation_frontier(_grids(10, 30))
    settings = f.set_index(['rule', 'setting'])
    assert settings.index.is_unique and ('per query', 'a=0.25, b=1') in settings.index
    assert settings.loc[('per query', 'a=0.25, b=1'), 'obs_per_pair'] == allocation_summary(adaptive_allocation(_grids(10, 30)))['obs_per_pair']
    assert f['obs_per_pair'].between(4, 25).all() and (f['regret'] >= 0).all()
