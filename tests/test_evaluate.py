"The exported `dars_nb.evaluate` on a hand-computed table (the notebook tests its own cells; this tests the module)."
import numpy as np
import pandas as pd
import pytest

from dars_nb.evaluate import (view_utility, per_query_view_utility, best_fixed_model, oracle_utility,
                              random_utility, bootstrap_ci, true_regret, router_variance, utility_table,
                              best_fixed_model_from_training)


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


def _hand_train(a_cells, b_cells):
    "A one-query 2×2 training grid per model, at the test table's prices."
    cells = [(0, 0), (0, 1), (1, 0), (1, 1)]
    return pd.DataFrame([dict(dataset='hand', split='train', view='grid', query_id='t1', model=m, rewrite_id=n,
                              sample_id=j, score=float(s), cost={'a': 0.001, 'b': 0.004}[m])
                         for m, scores in {'a': a_cells, 'b': b_cells}.items() for (n, j), s in zip(cells, scores)])


def test_best_fixed_model_is_chosen_on_training_data():
    hand = _hand()
    train = _hand_train([1, 1, 1, 0], [1, 0, 0, 1])              # a: 0.75 − 0.0125, b: 0.5 − 0.05
    assert best_fixed_model_from_training(train) == ('a', pytest.approx(0.7375))
    assert best_fixed_model(hand, 'rewrite')[0] == 'b'           # the test set would have picked b
    t = utility_table({'always b': {'q1': 'b', 'q2': 'b'}}, hand, obs_train=train).set_index(['view', 'policy'])
    fixed_a = per_query_view_utility(hand, 'rewrite')['a'].mean()
    assert t.loc[('rewrite', 'best fixed model (training)'), 'utility'] == pytest.approx(fixed_a)
    assert t.loc[('rewrite', 'always b'), 'vs_best_fixed'] == pytest.approx(best_fixed_model(hand, 'rewrite')[1] - fixed_a)
    assert 'optimistic' in t.loc[('rewrite', 'best fixed model'), 'detail']
    # the same training data in the test table is found without obs_train
    both = utility_table({'always b': {'q1': 'b', 'q2': 'b'}}, pd.concat([hand, train], ignore_index=True))
    assert set(both['detail']) >= {'a'}
    with pytest.raises(ValueError, match="no 'grid' observations"):
        best_fixed_model_from_training(hand)
