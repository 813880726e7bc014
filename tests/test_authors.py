"""The authors' protocol against the authors' release layout: the draw, the statistics and the costs recomputed from
the JSON lines themselves (not through our reader), and `dars reproduce --protocol authors` end to end on a held-out
release written from the simulator and on the shipped fixture.

The fixture (`data/authors_release`) is synthetic; these tests check that we compute what the authors' code computes
from such files, whatever the rows say."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dars_nb.sources.release import read_release
from dars_nb.sources.release_writer import write_release
from dars_nb.experiments.inputs import load_data
from dars_nb.experiments.presets import AUTHORS_PROTOCOL
from dars_nb.experiments.protocol import Spec, supervise
from dars_nb.testing import forced_test_flags

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / 'data' / 'authors_release'
SLOW = 'slow' in forced_test_flags()


def _lines(dataset: str) -> pd.DataFrame:
    "Both files of one fixture dataset, straight from the JSON lines, in file order (train first, as the authors load)."
    rows = []
    for split in ('train', 'test'):
        with open(FIXTURE / dataset / f'{split}_scored_generations.jsonl') as f:
            rows += [dict(json.loads(line), split=split) for line in f if line.strip()]
    df = pd.DataFrame(rows)
    lo, hi = df['cost'].min(), df['cost'].max()     # min–max over train and test rows of the dataset
    return df.assign(routing_cost=(df['cost'] - lo) / (hi - lo))


@pytest.fixture(scope='module')
def authors_datasets():
    text = dict(method=AUTHORS_PROTOCOL.features, text=AUTHORS_PROTOCOL.text, **AUTHORS_PROTOCOL.tfidf)
    datasets, _ = load_data(FIXTURE, formulas=AUTHORS_PROTOCOL.formulas, text_features=text, log=lambda *a: None)
    return {d.name: d for d in datasets}


def _by_pair(sup) -> pd.DataFrame:
    "A supervision's first draws as a table indexed (query_id, model)."
    R, Q, K = sup.utility.shape
    idx = pd.MultiIndex.from_product([sup.query_ids, sup.models], names=['query_id', 'model'])
    return pd.DataFrame({'mu_q': sup.mu_q.transpose(1, 2, 0).reshape(Q * K, R).tolist(),
                         'mu_c': sup.mu_c.transpose(1, 2, 0).reshape(Q * K, R).tolist(),
                         'sigma': sup.sigma.transpose(1, 2, 0).reshape(Q * K, R).tolist()}, index=idx)


@pytest.mark.parametrize('dataset', ['gpqa', 'math-500', 'drop-800'])
def test_single_shot_draws_are_the_authors(authors_datasets, dataset):
    "Run r: default_rng(42 + r), pairs in the order the file shows them, one of each pair's rows: the same picks."
    lines = _lines(dataset)
    train = lines[lines['split'] == 'train']
    sup, _ = supervise(authors_datasets[dataset], Spec('single'), n_draws=5, seed=AUTHORS_PROTOCOL.seed)
    ours = _by_pair(sup)
    for r in range(5):
        rng = np.random.default_rng(42 + r)
        for (query, model), group in train.groupby(['query_id', 'model'], sort=False):
            pick = group.iloc[int(rng.integers(0, len(group)))]
            got = ours.loc[(str(query), str(model))]
            assert got['mu_q'][r] == pick['score']
            assert got['mu_c'][r] == pytest.approx(pick['routing_cost'], abs=1e-12)


@pytest.mark.parametrize('dataset', ['gpqa', 'math-500', 'drop-800'])
def test_dars_statistics_are_the_authors(authors_datasets, dataset):
    "Mean score, sample standard deviation and mean min–max cost per (query, model), as pandas computes them."
    lines = _lines(dataset)
    train = lines[lines['split'] == 'train']
    theirs = train.groupby(['query_id', 'model']).agg(mu_q=('score', 'mean'), sigma=('score', 'std'),
                                                      mu_c=('routing_cost', 'mean'))
    ours = _by_pair(supervise(authors_datasets[dataset], Spec('dars'))[0])
    ours = ours.map(lambda v: v[0]).loc[theirs.index.map(lambda k: (str(k[0]), str(k[1])))]
    # the same numbers summed in another order: differences of a few ulps (measured max 2.2e-16)
    np.testing.assert_allclose(ours[['mu_q', 'sigma', 'mu_c']].to_numpy(),
                               theirs[['mu_q', 'sigma', 'mu_c']].to_numpy(), atol=1e-12)


def test_costs_are_min_max_per_dataset_over_train_and_test(authors_datasets):
    "Each dataset's normalised costs run from exactly 0 to exactly 1 over both splits; the split alone does not."
    for name, ds in authors_datasets.items():
        c = ds.obs['cost_norm']
        assert (c.min(), c.max()) == (0.0, 1.0), name
        np.testing.assert_allclose(np.sort(c.to_numpy()), np.sort(_lines(name)['routing_cost'].to_numpy()), atol=1e-12)


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason='a minute: run with DARS_TEST_FLAGS=slow (tutorial 08 runs the preset on the fixture)')
def test_reproduce_authors_on_a_held_out_release(tmp_path):
    "A release written from the simulator goes through `reproduce(protocol='authors')`; the report says what it is."
    from dars_nb.simulate import simulate
    from dars_nb.experiments.inputs import Settings
    from dars_nb.experiments.reproduce import reproduce
    from dars_nb.routers import KNNRouter, AvengersProRouter
    parts = [simulate(p, n_train=16, n_test=8, seed=7)[0] for p in ('gpqa_like', 'math_like', 'drop_like')]
    obs = pd.concat(parts, ignore_index=True)
    obs = obs.assign(original_text='Question ' + obs['query_id'].astype(str) + ' of ' + obs['dataset'].astype(str))
    folder = write_release(obs, tmp_path / 'release', source='synthetic rows from dars_nb.simulate')
    back = read_release(folder, log=lambda *a: None)
    assert len(back) == len(obs)
    assert back.groupby(['dataset', 'view'], observed=True).size().to_dict() == \
        obs.groupby(['dataset', 'view'], observed=True).size().to_dict()
    tiny = Settings(n_train=16, n_draws=3, n_boot=50, grids=((1, 1), (5, 5)), betas=(0.0, 0.2))
    summary = reproduce(tmp_path / 'out', data=folder, routers={'kNN': KNNRouter(), 'AvengersPro': AvengersProRouter()},
                        settings=tiny, n_jobs=1, verbose=False, protocol='authors')
    assert summary['protocol'] == 'authors'
    assert summary['paper_line'].startswith(f'On the synthetic fixture `{folder}`')
    assert ' of the 12 router–dataset–view settings' in summary['paper_line']       # 2 routers × 3 × 2
    out = tmp_path / 'out'
    report = (out / 'report.md').read_text()
    assert 'Protocol: `authors`' in report and "### The authors' printout" in report
    printout = pd.read_csv(out / 'authors_printout.csv')
    np.testing.assert_allclose(printout['utility'], printout['score'] - 0.05 * printout['cost'], atol=1e-12)
    assert set(printout['policy']) >= {'kNN (DARS)', 'best fixed model (authors: test view, by score)'}
    results = pd.read_csv(out / 'protocol_results.csv')
    np.testing.assert_allclose(results['utility'], results['score'] - 0.05 * results['cost'], atol=1e-12)
    assert len(pd.read_csv(out / 'table1_vs_paper.csv')) == 12
    # min–max costs: the cheapest chosen answers cost 0, no chosen cost above 1
    assert results['cost'].between(0, 1).all()


def test_unknown_protocol_is_one_line(tmp_path, capsys):
    from dars_nb.cli import main
    assert main(['reproduce', '--out', str(tmp_path / 'out'), '--protocol', 'nope']) == 1
    assert capsys.readouterr().err == "dars reproduce: error: unknown protocol 'nope' (expected one of paper, authors)\n"
    assert not list(tmp_path.iterdir())                                      # nothing written


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason='three minutes: run with DARS_TEST_FLAGS=slow')
def test_cli_reproduce_authors_quick_on_the_fixture(tmp_path):
    "`dars reproduce --data data/authors_release --protocol authors --quick`: all seven families, every table."
    done = subprocess.run([sys.executable, '-m', 'dars_nb', 'reproduce', '--data', str(FIXTURE), '--protocol', 'authors',
                           '--quick', '--quiet', '--out', str(tmp_path / 'out')], capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr
    report = (tmp_path / 'out' / 'report.md').read_text()
    assert 'On the synthetic fixture' in report and 'of the 42 router–dataset–view settings' in report
    assert len(pd.read_csv(tmp_path / 'out' / 'table1_vs_paper.csv')) == 42
    printout = pd.read_csv(tmp_path / 'out' / 'authors_printout.csv')
    assert len(printout) == 3 * 2 * (7 * 2 + 2)        # datasets × views × (routers × supervisions + two baselines)


def _their_knn_views(R: int = 3) -> pd.DataFrame:
    "The authors' kNN protocol written out from the JSON lines with scikit-learn and numpy alone."
    from sklearn.feature_extraction.text import TfidfVectorizer
    lines = {d: _lines(d) for d in ('gpqa', 'math-500', 'drop-800')}
    def text(r):
        context = r['context'].strip() if isinstance(r.get('context'), str) else ''
        question = r['original_question'].strip()
        return f"{context[:1200]}\nQuestion: {question}" if context else question
    meta = {(d, s): df[df['split'] == s].groupby('query_id', sort=False).first().apply(text, axis=1)
            for d, df in lines.items() for s in ('train', 'test')}
    tfidf = TfidfVectorizer(max_features=20000, ngram_range=(1, 2)).fit(
        pd.concat([meta[(d, 'train')] for d in lines]).tolist())
    rows = []
    for d, df in lines.items():
        train, test = df[df['split'] == 'train'], df[df['split'] == 'test']
        models = sorted(df['model'].unique())
        Xtr, Xte = (tfidf.transform(meta[(d, s)].tolist()).toarray() for s in ('train', 'test'))
        dist = np.sqrt(((Xte[:, None, :] - Xtr[None, :, :]) ** 2).sum(-1))
        k = min(16, len(Xtr))
        near = np.argsort(dist, axis=1, kind='stable')[:, :k]
        w = 1.0 / (np.take_along_axis(dist, near, 1) + 1e-8)
        w /= w.sum(1, keepdims=True)
        view = {v: test[test['observation_type'] == t].groupby(['query_id', 'model'])[['score', 'routing_cost']].mean()
                for v, t in (('rewrite', 'prompt_variation'), ('decode', 'decoding_variation'))}
        def route(targets, beta):
            T = {c: targets[c].unstack('model').loc[meta[(d, 'train')].index, models].to_numpy() for c in targets}
            pred = {c: (w[:, :, None] * T[c][near]).sum(1) for c in T}
            U = pred['score'] - 0.05 * pred['routing_cost'] - beta * pred.get('std', 0.0)
            return [models[i] for i in U.argmax(1)]
        stats = train.groupby(['query_id', 'model']).agg(score=('score', 'mean'), routing_cost=('routing_cost', 'mean'),
                                                          std=('score', 'std'))
        choices = {'dars': [route(stats, 0.2)]}
        draws = []
        for r in range(R):
            rng = np.random.default_rng(42 + r)
            picked = [g.iloc[int(rng.integers(0, len(g)))] for _, g in train.groupby(['query_id', 'model'], sort=False)]
            one = pd.DataFrame(picked).set_index(['query_id', 'model'])[['score', 'routing_cost']]
            draws.append(route(one, 0.0))
        choices['single'] = draws
        for sup, runs in choices.items():
            for v, table in view.items():
                got = [table.loc[list(zip(meta[(d, 'test')].index, c))].mean() for c in runs]
                rows.append(dict(dataset=d, supervision=sup, view=v, score=np.mean([g['score'] for g in got]),
                                 cost=np.mean([g['routing_cost'] for g in got])))
    return pd.DataFrame(rows).set_index(['dataset', 'supervision', 'view'])


def test_knn_under_the_authors_protocol_is_their_computation(authors_datasets):
    "Text, TF-IDF, draws, targets, Euclidean neighbours and the views' score and cost: the authors' kNN, recomputed."
    from dars_nb.experiments.protocol import run_protocol
    from dars_nb.routers import KNNRouter
    ours = run_protocol(list(authors_datasets.values()), AUTHORS_PROTOCOL.routers({'kNN': KNNRouter()}), n_draws=3,
                        n_boot=10, seed=AUTHORS_PROTOCOL.seed, progress=False)
    ours = ours.set_index(['dataset', 'supervision', 'view'])[['score', 'cost']].sort_index()
    theirs = _their_knn_views().loc[ours.index]
    # float64 distances on both sides; the same choices give the same means (measured max difference 0)
    np.testing.assert_allclose(ours.to_numpy(), theirs.to_numpy(), atol=1e-9)


def test_the_protocol_runs_the_authors_designs_seeded_as_theirs():
    "The four torch families are the authors' designs under their protocol (seed 42, their model order); ours under the paper's."
    pytest.importorskip('torch')
    from dars_nb.experiments.presets import PAPER_PROTOCOL, AUTHORS_MODEL_ORDER
    theirs, ours = AUTHORS_PROTOCOL.routers(), PAPER_PROTOCOL.routers()
    for name in ('MIRT', 'EmbedLLM', 'RM-Softmax', 'GraphRouter'):
        assert type(theirs[name]).__module__ == 'dars_nb.routers.nets', name
        assert type(ours[name]).__module__ != 'dars_nb.routers.nets', name
        assert (theirs[name].random_state, theirs[name].model_order) == (42, AUTHORS_MODEL_ORDER)
    epochs = {name: theirs[name].epochs for name in ('MIRT', 'EmbedLLM', 'RM-Softmax', 'GraphRouter')}
    assert epochs == {'MIRT': 30, 'EmbedLLM': 20, 'RM-Softmax': 20, 'GraphRouter': 50}
    assert (theirs['EmbedLLM'].batch_size, theirs['MIRT'].batch_size) == (2048, 256)
    assert (theirs['MLP'].random_state, theirs['MLP'].seed_offsets, theirs['AvengersPro'].random_state) == (42, (0, 991, 1991), 42)


def _seeded_layers(*shapes):
    "Weights and biases of `nn.Linear` layers built one after another from the generator's current state."
    from torch import nn
    return [p for n_in, n_out in shapes for p in nn.Linear(n_in, n_out).parameters()]


def test_the_authors_networks_start_from_their_weights():
    "Built under seed 42, each design draws the initial weights the authors' construction order draws."
    torch = pytest.importorskip('torch')
    from torch import nn
    from dars_nb.routers.nets import (AuthorsMIRTRouter, AuthorsEmbedLLMRouter, AuthorsRMSoftmaxRouter,
                                      AuthorsGraphRouter)
    d, K = 9, 6
    def same(ours, reference):
        assert len(ours) == len(reference)
        for a, b in zip(ours, reference): assert torch.equal(a, b)
    # MIRT: three heads (μ_q, μ_c, σ), each θ = Linear(d, 128), ReLU, Linear(128, 16), then a_m ~ 0.02·N(0, 1), b_m = 0
    torch.manual_seed(42); net = AuthorsMIRTRouter()._network(d, np.arange(K))
    torch.manual_seed(42)
    reference = [p for _ in range(3) for p in (*_seeded_layers((d, 128), (128, 16)), torch.randn(K, 16) * 0.02)]
    same([p for h in net for p in (*h.theta.parameters(), h.discrimination)], reference)
    # EmbedLLM: the query projection, the embedding (drawn, then redrawn at 0.02), the model bias, the cost head
    torch.manual_seed(42); net = AuthorsEmbedLLMRouter()._network(d, np.arange(K))
    torch.manual_seed(42)
    proj = _seeded_layers((d, 256)); embedding = nn.Embedding(K, 256); head = _seeded_layers((256, 1))
    nn.init.normal_(embedding.weight, std=0.02)
    same([*net.query_proj.parameters(), net.model_embed.weight, *net.cost_head.parameters()], [*proj, embedding.weight, *head])
    # RM-Softmax: an MLP on [x, λ]: (d + 1) → 256 → 256 → K
    torch.manual_seed(42); net = AuthorsRMSoftmaxRouter()._network(d + 1, np.arange(K))
    torch.manual_seed(42); same(list(net.parameters()), _seeded_layers((d + 1, 256), (256, 256), (256, K)))
    # GraphRouter: query and model projections to 128, then the edge MLP 512 → 256 → 128 → 3
    torch.manual_seed(42); net = AuthorsGraphRouter()._network(d, np.arange(K))
    torch.manual_seed(42)
    same(list(net.parameters()), _seeded_layers((d, 128), (K, 128), (512, 256), (256, 128), (128, 3)))


def test_the_authors_mirt_trains_as_their_loop_does():
    "Adam at 10⁻³ on shuffled minibatches of 256, BCE on μ_q + squared error on μ_c + ½ squared error on σ: the same weights."
    torch = pytest.importorskip('torch')
    import torch.nn.functional as F
    from dars_nb.routers.nets import AuthorsMIRTRouter
    from dars_nb.routers.ensemble import torch_threads
    from dars_nb.simulate import simulate
    from dars_nb.stats import supervision, normalize_cost
    from dars_nb.routers.base import align
    obs, feats = simulate('gpqa_like', n_train=300, n_test=10, seed=3)[:2]
    sup = supervision(normalize_cost(obs), 'dars')
    X = align(feats, sup.query_ids).astype(np.float32)
    # the models in the supervision's order on both sides (the authors' protocol gives their order as model_order)
    ours = AuthorsMIRTRouter(epochs=2, random_state=42, n_threads=1, model_order=sup.models).fit(X, sup).nets_[0]
    # the reference loop, written from the design: seed, build, then per epoch a permutation and its minibatches
    with torch.random.fork_rng(devices=[]), torch_threads(1):      # one thread on both sides: the same sums
        torch.manual_seed(42)
        net = AuthorsMIRTRouter()._network(X.shape[1], np.arange(len(sup.models)))
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        x = torch.from_numpy(X)
        t = [torch.from_numpy(np.clip(a[0], 0, 1).astype(np.float32)) for a in (sup.mu_q, sup.mu_c, sup.sigma)]
        for _ in range(2):
            order = torch.randperm(len(x))
            for start in range(0, len(x), 256):
                rows = order[start:start + 256]
                q, c, s = (h(x[rows]) for h in net)
                loss = (F.binary_cross_entropy_with_logits(q, t[0][rows]) + F.mse_loss(torch.sigmoid(c), t[1][rows])
                        + 0.5 * F.mse_loss(torch.sigmoid(s), t[2][rows]))
                opt.zero_grad(); loss.backward(); opt.step()
    for a, b in zip(ours.parameters(), net.parameters()): assert torch.equal(a, b)


# their `methods/graph_router.py` (9b6da7a): each model's node text, "name. description"
THEIR_NODE_TEXTS = [
    'google/gemma-3-12b-it. Google Gemma 3 12B instruction tuned open model.',
    'mistralai/mistral-small-3.2-24b-instruct. Mistral Small 3.2 24B instruction tuned model.',
    'qwen/qwen3-32b. Qwen3 32B general reasoning and instruction model.',
    'meta-llama/llama-3.3-70b-instruct. Meta Llama 3.3 70B instruction tuned model.',
    'google/gemini-2.5-flash-lite. Google Gemini 2.5 Flash Lite efficient model.',
    'deepseek/deepseek-chat-v3.1. DeepSeek Chat V3.1 general chat and reasoning model.']


@pytest.fixture(scope='module')
def graph_datasets():
    text = dict(method=AUTHORS_PROTOCOL.features, text=AUTHORS_PROTOCOL.text, **AUTHORS_PROTOCOL.tfidf)
    datasets, obs = load_data(FIXTURE, formulas=AUTHORS_PROTOCOL.formulas, text_features=text,
                              family_texts=AUTHORS_PROTOCOL.family_texts, log=lambda *a: None)
    return datasets, obs


def test_the_authors_graph_router_reads_their_vectorizer(graph_datasets):
    "GraphRouter's queries and model nodes: one TF-IDF of (1, 2)-grams fitted on the training texts and their six node texts."
    from sklearn.feature_extraction.text import TfidfVectorizer
    from dars_nb.experiments.inputs import authors_texts
    datasets, obs = graph_datasets
    texts = authors_texts(obs)
    train = texts[texts.index.isin(pd.MultiIndex.from_frame(
        obs.loc[obs['split'] == 'train', ['dataset', 'query_id']].astype(str)))]
    theirs = TfidfVectorizer(max_features=20000, min_df=1, ngram_range=(1, 2)).fit(train.tolist() + THEIR_NODE_TEXTS)
    for ds in datasets:
        own = ds.family_features['GraphRouter']
        names = [t.split('. ')[0] for t in THEIR_NODE_TEXTS]
        np.testing.assert_allclose(own.models.loc[names].to_numpy(), theirs.transform(THEIR_NODE_TEXTS).toarray(), atol=1e-12)
        ids = texts.index.get_level_values('query_id')
        np.testing.assert_allclose(own.queries.loc[list(ids)].to_numpy(), theirs.transform(texts.tolist()).toarray(), atol=1e-12)
        # the other families read the features fitted on the training texts alone: fewer words
        assert ds.features.shape[1] < own.queries.shape[1] and set(ds.family_features) == {'GraphRouter'}


def test_the_authors_graph_router_routes_as_their_script(graph_datasets):
    "DARS on the fixture's drop-800: the utility their graph_router.py prints at seed 42 (one-hot nodes gave 0.6457)."
    pytest.importorskip('torch')
    from dars_nb.experiments.protocol import run_experiments
    from dars_nb.routers import ROUTERS
    datasets, _ = graph_datasets
    drop = [d for d in datasets if d.name == 'drop-800']
    res = run_experiments(drop, AUTHORS_PROTOCOL.routers({'GraphRouter': ROUTERS['GraphRouter']()}), specs=(Spec('dars', 0.2),),
                          seed=AUTHORS_PROTOCOL.seed, n_boot=10, n_jobs=1, progress=False)
    got = res.set_index('view')['utility']
    # their script's decode and rewrite utilities on this folder (bench/compare_authors.py, R = 10)
    np.testing.assert_allclose([got['decode'], got['rewrite']], [0.468464, 0.605828], atol=1e-6)
