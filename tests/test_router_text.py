"""Training features come from each query's original wording on every path — `dars reproduce --data`, `dars train`
(the bundle) and a release folder — never from a rewrite's text, and their vocabulary from training queries only."""
import numpy as np
import pandas as pd
import pytest

from dars_nb.experiments.inputs import features_from_text
from dars_nb.observations import router_texts, validate
from dars_nb.sources.release import read_release
from dars_nb.sources.release_writer import write_release
from dars_nb.simulate import simulate
from dars_nb.testing import simulated_texts
from dars_nb.bundle.training import train

MARK = 'zebra'   # a word only the rewrites hold


@pytest.fixture(scope='module')
def grid():
    "A simulated grid whose rows were sent rewrites marked with MARK; original_text holds each query's own words."
    obs, feats, _ = simulate('gpqa_like', n_train=60, n_test=20, seed=2)
    obs = simulated_texts(obs, feats)
    sent = np.where(obs['rewrite_id'].to_numpy() > 0, f'{MARK} rewrite of ' + obs['original_text'], obs['original_text'])
    return validate(obs.assign(query_text=sent))


def scrambled(obs, seed=0):
    "The same table with every rewrite's text replaced by other words."
    rng = np.random.default_rng(seed)
    words = rng.choice(['lorem', 'ipsum', 'dolor', MARK, 'amet'], size=(len(obs), 4))
    other = [' '.join(w) for w in words]
    return obs.assign(query_text=np.where(obs['rewrite_id'].to_numpy() > 0, other, obs['query_text'].astype(str)))


def test_reproduce_features_ignore_the_rewrites(grid):
    a = features_from_text(grid, method='tfidf')
    b = features_from_text(scrambled(grid), method='tfidf')
    pd.testing.assert_frame_equal(a, b)                      # a rewrite's text changes nothing
    train_texts = router_texts(grid[grid['split'] == 'train'])
    assert a.shape[1] == len({w for t in train_texts for w in t.split() if len(w) > 1})   # training words only


def test_a_rewrite_in_the_features_would_be_caught(grid):
    "The check above has teeth: features read from the first text sent (rewrite 1) do change with the rewrites."
    from dars_nb.features import tfidf_features
    def first_sent(obs):
        first = obs.sort_values(['rewrite_id', 'sample_id']).drop_duplicates(['dataset', 'query_id'])
        return tfidf_features(first['query_text'].astype(str).tolist())
    assert first_sent(grid).shape != first_sent(scrambled(grid)).shape or \
        not np.allclose(first_sent(grid), first_sent(scrambled(grid)))


def test_train_bundle_never_sees_a_rewrite(grid):
    config = lambda obs: dict(observations=obs, router=dict(family='kNN', n_neighbors=5), features=dict(kind='tfidf'),
                              guard=dict(folds=3))
    a, b = train(config(grid), quiet=True), train(config(scrambled(grid)), quiet=True)
    assert MARK not in a.featurizer.vectorizer_.vocabulary_
    assert a.featurizer.vectorizer_.vocabulary_ == b.featurizer.vectorizer_.vocabulary_
    questions = router_texts(grid[grid['split'] == 'test']).tolist()
    assert a.route(questions) == b.route(questions)


def test_a_grid_without_its_originals_is_refused(grid):
    rewrites_only = grid.drop(columns='original_text')[grid['split'] == 'train']
    with pytest.raises(ValueError, match='has no original wording'):
        features_from_text(rewrites_only, method='tfidf')
    with pytest.raises(ValueError, match='has no original wording'):
        train(dict(observations=rewrites_only, router=dict(family='kNN')), quiet=True)


def test_a_release_folder_is_featurised_from_its_original_questions(grid, tmp_path):
    back = read_release(write_release(grid, tmp_path / 'a'))
    other = read_release(write_release(scrambled(grid), tmp_path / 'b'))
    pd.testing.assert_frame_equal(features_from_text(back, method='tfidf'), features_from_text(other, method='tfidf'))
    assert not back.loc[back['rewrite_id'] > 0, 'query_text'].astype(str).eq(back.loc[back['rewrite_id'] > 0, 'original_text'].astype(str)).any()
