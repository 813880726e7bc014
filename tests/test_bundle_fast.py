"The fast ranking path of a loaded bundle against RouterBundle.rank: the same rankings on thousands of questions, every family it computes, guarded, at several λ."
from pathlib import Path
import numpy as np
import pandas as pd
import pytest
from dars_nb.bundle import load_bundle, save_bundle
from dars_nb.bundle.fast import FastRanker
from dars_nb.bundle.training import TrainConfig, train
from dars_nb.simulate import simulate

ROUTING = Path(__file__).resolve().parents[1] / 'data' / 'routing' / 'llmrouter'


@pytest.fixture(scope='module')
def questions():
    return pd.read_json(ROUTING / 'train.jsonl', lines=True)['question'].tolist()


def _bundle(questions, family, router_params, feature_params, tmp_path):
    "A guarded bundle of `family` on 400 questions (simulated outcomes), saved and loaded back as `dars serve` loads it."
    obs, _, _ = simulate('gpqa_like', n_train=400, n_test=5, seed=1)
    ids = {q: i for i, q in enumerate(obs['query_id'].unique())}
    text = obs['query_id'].map(ids).map(questions.__getitem__)
    cfg = TrainConfig(observations=obs.assign(query_text=text, original_text=text), family=family,
                      router_params=router_params, feature_params=feature_params)
    return load_bundle(save_bundle(train(cfg, quiet=True), tmp_path / f'{family}.router'))


CASES = {   # id -> (family, router parameters, featurizer parameters)
    'kNN-cosine': ('kNN', dict(n_neighbors=7), {}),
    'kNN-euclidean-svd': ('kNN', dict(n_neighbors=5, metric='euclidean'), dict(n_components=48)),
    'MLP': ('MLP', dict(hidden_layer_sizes=(16,), max_iter=40), {}),
    'MLP-two-layers-bigrams-clip': ('MLP', dict(hidden_layer_sizes=(12, 6), max_iter=30, clip=True),
                                    dict(ngram_range=(1, 2), max_features=5000)),
    'AvengersPro': ('AvengersPro', dict(n_clusters=12, n_init=2, random_state=0), {}),
    'AvengersPro-raw-svd': ('AvengersPro', dict(n_clusters=8, top_k=2, n_init=2, normalize=False, batched=False,
                                                random_state=0), dict(n_components=32)),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize('case', list(CASES))
def test_fast_path_ranks_as_the_bundle(case, questions, tmp_path):
    family, router_params, feature_params = CASES[case]
    bundle = _bundle(questions, family, router_params, feature_params, tmp_path)
    ranker = FastRanker(bundle)
    assert ranker.fast and bundle.guard is not None
    texts = questions[1000:4000] + ['', '?!', 'zzzz unknown words only', 'THE THE THE']   # 3,004 unseen texts
    for lam in (0.0, bundle.lam, 0.3):
        fast, slow = ranker(texts, lam), bundle.rank(texts, lam)
        assert [r[0] for r in fast] == [r[0] for r in slow], lam   # every choice, guard included, equal
        differ = [i for i, (a, b) in enumerate(zip(fast, slow)) if a != b]
        assert len(differ) <= len(texts) // 100, (lam, len(differ))
        if differ:   # a fallback order differs only where two models' utilities tie to 1e-9 (summed in another order)
            U = bundle.router.utility(bundle.features([texts[i] for i in differ]), lam)
            for row, i in zip(U, differ):
                at = {m: k for k, m in enumerate(bundle.models)}
                u = row[[at[m] for m in fast[i][1:]]]
                assert (np.diff(u) <= 1e-9).all(), (lam, texts[i][:60], u)
    # utilities: the same arithmetic summed in another order (sparse rows, folded scaler): equal to 1e-9
    fast = np.stack([ranker.utility(t, bundle.lam) for t in texts[:500]])
    np.testing.assert_allclose(fast, bundle.router.utility(bundle.features(texts[:500]), bundle.lam), rtol=0, atol=1e-9)


@pytest.mark.timeout(300)
def test_other_families_take_the_bundles_own_path(questions, tmp_path):
    pytest.importorskip('torch')
    bundle = _bundle(questions, 'EmbedLLM', dict(epochs=3), {}, tmp_path)
    ranker = FastRanker(bundle)
    assert not ranker.fast
    assert ranker(questions[1000:1050]) == bundle.rank(questions[1000:1050])
