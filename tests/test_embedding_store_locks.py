"""The embedding cache shared by processes: another process holding a write lock neither blocks a reader nor stalls a
writer past the store's timeout (it goes on without the cache, with a warning), and two processes writing the same
store at once both finish, every vector stored and readable."""
import hashlib, subprocess, sys, textwrap, warnings

import numpy as np
import pytest

from dars_nb.features.embedding_store import EmbeddingStore

HOLD = textwrap.dedent("""
    import sqlite3, sys
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute('BEGIN EXCLUSIVE')                      # the strongest lock a writer takes
    con.execute("INSERT OR REPLACE INTO vectors VALUES ('held', x'00', x'00', 0)")
    print('held', flush=True)
    sys.stdin.readline()                                # held until the test says so
    con.execute('COMMIT')
""")


def unit_rows(n, dim=8, seed=0):
    V = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return V / np.linalg.norm(V, axis=1, keepdims=True)


def keys(n, start=0): return [hashlib.sha256(str(i).encode()).digest() for i in range(start, start + n)]


@pytest.fixture
def held(tmp_path):
    "A store with 600 vectors, and another process holding its write lock until the test ends."
    store = EmbeddingStore(tmp_path, timeout=2)
    store.put('e', keys(600), unit_rows(600))
    p = subprocess.Popen([sys.executable, '-c', HOLD, str(store.path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == 'held'
    yield store, p
    if p.returncode is None: p.communicate('go\n', timeout=30)


def test_a_reader_does_not_wait_for_a_writer(held):
    "600 vectors (two chunks of the read) come back, without a warning, while the other process holds its lock."
    store, p = held
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        got = store.get('e', keys(600), 8)
    assert p.poll() is None                              # the lock was held throughout
    np.testing.assert_array_equal(np.stack([got[k] for k in keys(600)]), unit_rows(600))


def test_a_writer_gives_up_past_the_timeout(held):
    "A write the other process keeps locked: one warning, nothing stored; once released, the same write goes in."
    store, p = held
    with pytest.warns(UserWarning, match=r'stayed locked by another process for 2 s .*: 5 vector\(s\) not stored'):
        store.put('e', keys(5, 1000), unit_rows(5, seed=1))
    assert p.poll() is None and store.get('e', keys(5, 1000), 8) == {}
    p.communicate('go\n', timeout=30)
    store.put('e', keys(5, 1000), unit_rows(5, seed=1))
    assert len(store.get('e', keys(5, 1000), 8)) == 5


WRITER = textwrap.dedent("""
    import hashlib, sys, numpy as np
    from dars_nb.features.embedding_store import EmbeddingStore
    store, seed = EmbeddingStore(sys.argv[1], timeout=60), int(sys.argv[2])
    for batch in range(20):                             # overlapping keys: both processes write 0..1449
        ids = range(batch * 50, batch * 50 + 500)
        V = np.random.default_rng([seed, batch]).standard_normal((500, 8)).astype(np.float32)
        store.put('e', [hashlib.sha256(str(i).encode()).digest() for i in ids], V / np.linalg.norm(V, axis=1, keepdims=True))
        got = store.get('e', [hashlib.sha256(str(i).encode()).digest() for i in ids], 8)
        assert len(got) == 500, len(got)
    print('done')
""")


def test_two_processes_writing_one_store(tmp_path):
    "Two processes, 20 writes and reads each of 500 overlapping vectors: both finish, no warning, all 1,450 readable."
    procs = [subprocess.Popen([sys.executable, '-W', 'error', '-c', WRITER, str(tmp_path), str(s)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for s in (1, 2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.strip() == 'done', err
    store = EmbeddingStore(tmp_path)
    assert store.counts() == {'e': 1450} and len(store.get('e', keys(1450), 8)) == 1450
