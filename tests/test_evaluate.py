"The exported `dars_nb.evaluate` on a hand-computed table (the notebook tests its own cells; this tests the module)."
import numpy as np
import pandas as pd
import pytest

from dars_nb.evaluate import (view_utility, per_query_view_utility, best_fixed_model, oracle_utility,
                              random_utility, bootstrap_ci, true_regret, router_variance, utility_table)


def _hand():
    scores = {('q1', 'a', 'rewrite'): [1, 0, 1], ('q1', 'b', 'rewrite'): [1, 1, 1],
              ('q2', 'a', 'rewrite'): [0, 0, 1], ('q2', 'b', 'rewrite'): [0, 1, 0],
              ('q1', 'a', 'decode'): [1, 1, 1], ('q1', 'b', 'decode'): [1, 0, 1],
              ('q2', 'a', 'decode'): [0, 0, 0], ('q2', 'b', 'decode'): [1, 1, 0]}
    return pd.DataFrame([dict(dataset='hand', split='test', view=v, query_id=q, model=m,
                              rewrite_id=k + 1 if v == 'rewrite' else 0, sample_id=0 if v == 'rewrite' else k,
                              score=float(s[k]), cost={'a': 0.001, 'b': 0.004}[m])
                         for (q, m, v), s in scores.items() for k in range(3)])


def test_view_utilities_by_hand():
    hand, choice = _hand(), {'q1': 'b', 'q2': 'a'}
    assert view_utility(choice, hand, 'rewrite') == pytest.approx(((1 - 0.05) + (1 / 3 - 0.0125)) / 2)
    assert view_utility(choice, hand, 'decode') == pytest.approx(((2 / 3 - 0.05) + (0 - 0.0125)) / 2)
    assert best_fixed_model(hand, 'rewrite')[0] == 'b'
    assert oracle_utility(hand, 'decode') == pytest.approx(((1 - 0.0125) + (2 / 3 - 0.05)) / 2)
    t = per_query_view_utility(hand, 'rewrite')
    assert random_utility(hand, 'rewrite') == pytest.approx(t.to_numpy().mean())
    e = view_utility(choice, hand, 'rewrite', ci=True)
    assert e.low <= e.estimate <= e.high
    assert len(utility_table({'r': choice}, hand)) == 8


def test_bad_choices_are_one_line_errors():
    hand = _hand()
    with pytest.raises(ValueError, match="choice for unknown query 'q9'"):
        view_utility({'q1': 'a', 'q2': 'a', 'q9': 'a'}, hand)
    with pytest.raises(ValueError, match="unknown model 'zz'"):
        view_utility({'q1': 'a', 'q2': 'zz'}, hand)


def test_bootstrap_regret_and_variance():
    assert bootstrap_ci(np.full(5, 0.5)) == (0.5, 0.5, 0.5)
    truth = pd.DataFrame(dict(dataset='d', query_id=['q1', 'q1'], model=['a', 'b'], mu_q=[0.9, 0.4], mu_c=[0.0, 0.0]))
    assert true_regret({'q1': 'b'}, truth.set_index(['dataset', 'query_id', 'model'])) == pytest.approx(0.5)
    assert router_variance([0.1, 0.3], reference=0.2)['share_below_reference'] == 0.5
