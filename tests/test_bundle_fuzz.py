"""The bundle reader under attack. Zip bombs, huge claims and lying headers are refused in one line, in a subprocess
whose peak memory barely moves (the probes of an adversarial pass: a 1 MB file inflating to 1 GiB, a 1 GiB whitespace
manifest, a 6 GiB member, a `.npy` header claiming a terabyte, 20,000 members); `dars route` and `dars serve` refuse
such a file at start (exit 1, one line). Hypothesis then fuzzes the reader — any bytes, a valid bundle with bytes
changed, a manifest with any field replaced, an array member replaced — and every input either loads a bundle that
routes or raises one `BundleError` line, within memory bounded by the cap (traced with tracemalloc).

`make test` runs 20 examples per fuzz test (about 10 s); `DARS_TEST_FLAGS=slow` runs 300."""
import io, json, os, struct, subprocess, sys, tracemalloc, zipfile, zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dars_nb.bundle import RouterBundle, load_bundle, save_bundle
from dars_nb.bundle.format import BundleError
from dars_nb.features import TfidfFeaturizer
from dars_nb.bundle.guard import cross_validate
from dars_nb.routers import ROUTERS
from dars_nb.simulate import simulate
from dars_nb.stats import supervision
from dars_nb.testing import forced_test_flags, simulated_texts

MiB = 2**20
from dars_command import DARS
CAP_MB = 2            # the fuzzed loads' cap: a fuzzed bundle holds 50 kB
FUZZ = settings(max_examples=300 if 'slow' in forced_test_flags() else 20, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope='module')
def valid(tmp_path_factory) -> dict:
    "Two small guarded bundles (kNN, MLP) on TF-IDF: their paths, bytes, manifests and members."
    obs, feats, _ = simulate('gpqa_like', n_train=30, n_test=5, seed=0)
    obs = simulated_texts(obs, feats)
    sup = supervision(obs, 'dars')
    texts = obs.drop_duplicates('query_id').set_index('query_id')['query_text'].loc[sup.query_ids].tolist()
    tf = TfidfFeaturizer().fit(texts)
    X, out = tf.transform(texts), {}
    for family, params in (('kNN', dict(n_neighbors=3)), ('MLP', dict(hidden_layer_sizes=(4,), max_iter=5, random_state=0))):
        router = ROUTERS[family](**params)
        cv = cross_validate(router, X, sup, sup, folds=3)
        bundle = RouterBundle(models=list(sup.models), lam=0.05, beta=0.2, mode='dars', featurizer=tf,
                              router=router.fit(X, sup), guard=cv.margin(0.05), guard_cv=cv)
        path = save_bundle(bundle, tmp_path_factory.mktemp('b') / f'{family}.zip')
        with zipfile.ZipFile(path) as z: members = {n: z.read(n) for n in z.namelist()}
        out[family] = dict(path=path, raw=path.read_bytes(), manifest=json.loads(members['manifest.json']),
                           members=members, models=list(sup.models))
    return out


# ---- crafting zips by hand: declared sizes that lie, streams that inflate far -------------------------------------

def zeros_stream(mib: int, byte: bytes = b'\0', head: bytes = b'') -> bytes:
    "A raw deflate stream of `head`, then `mib` MiB of `byte`: full-flushed blocks (each independent of the ones before)."
    flushed = lambda data: (lambda c: c.compress(data) + c.flush(zlib.Z_FULL_FLUSH))(zlib.compressobj(9, zlib.DEFLATED, -15))
    return flushed(head) + flushed(byte * MiB) * mib + zlib.compressobj(9, zlib.DEFLATED, -15).flush()


def craft_zip(path: Path, members: list) -> Path:
    "A zip of (name, compressed bytes, declared size, CRC) members; sizes over 4 GiB in a zip64 extra field."
    body, directory, offset = [], [], 0
    for name, data, declared, crc in members:
        name = name.encode()
        big = declared >= 0xFFFFFFFF
        extra = struct.pack('<HHQQ', 1, 16, declared, len(data)) if big else b''
        sizes = (0xFFFFFFFF, 0xFFFFFFFF) if big else (len(data), declared)
        local = struct.pack('<4sHHHHHIIIHH', b'PK\x03\x04', 45, 0, 8, 0, 33, crc, *sizes, len(name), len(extra))
        directory.append(struct.pack('<4sHHHHHHIIIHHHHHII', b'PK\x01\x02', 45, 45, 0, 8, 0, 33, crc, *sizes,
                                     len(name), len(extra), 0, 0, 0, 0, offset) + name + extra)
        body.append(local + name + extra + data); offset += len(body[-1])
    body, directory = b''.join(body), b''.join(directory)
    end = struct.pack('<4sHHHHIIH', b'PK\x05\x06', 0, 0, len(members), len(members), len(directory), len(body), 0)
    path.write_bytes(body + directory + end)
    return path


def npy_header(shape, descr='<f8') -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, dict(descr=descr, fortran_order=False, shape=tuple(shape)))
    return b.getvalue()


def deflated(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def with_member(valid_one: dict, name: str, data: bytes, declared: int, crc: int = 0) -> list:
    "The bundle's members (deflated, sizes and CRCs true) with `name` replaced by the given member."
    members = [(n, deflated(b), len(b), zlib.crc32(b)) for n, b in valid_one['members'].items() if n != name]
    return members + [(name, data, declared, crc)]


BOMBS = {  # file -> (how it is made, what the one line says)
    'array_1gib': 'declares 1,024.0 MiB, over the',
    'array_lies': 'is damaged',
    'array_claims_terabyte': 'claims shape (1000000000000,) of float64',
    'manifest_1gib_whitespace': 'manifest.json declares 1,024.0 MiB, over the 16.0 MiB',
    'array_6gib': 'declares 6,144.0 MiB',
    'members_20000': 'members in a',
}


def make_bombs(valid_one: dict, folder: Path) -> dict:
    "The files of `BOMBS`, each 1-5 MB on disk."
    head = npy_header((2**27,))                                           # 1 GiB of float64
    files = {'array_1gib': with_member(valid_one, 'arrays/0.npy', zeros_stream(1024), len(head) + 2**30),
             # declares 8 floats; its stream inflates to 256 MiB
             'array_lies': with_member(valid_one, 'arrays/0.npy', zeros_stream(256, head=npy_header((8,))),
                                       len(npy_header((8,))) + 64),
             'array_claims_terabyte': with_member(valid_one, 'arrays/0.npy',
                                                  deflated(npy_header((10**12,)) + bytes(64)),
                                                  len(npy_header((10**12,))) + 64,
                                                  zlib.crc32(npy_header((10**12,)) + bytes(64))),
             'manifest_1gib_whitespace': with_member(valid_one, 'manifest.json', zeros_stream(1024, b' '), 2**30),
             'array_6gib': with_member(valid_one, 'arrays/0.npy', zeros_stream(4), 6 * 2**30),
             'members_20000': with_member(valid_one, 'pad/0', b'\x03\x00', 0)
             + [(f'pad/{i}', b'\x03\x00', 0, 0) for i in range(1, 20000)]}
    return {k: craft_zip(folder / f'{k}.zip', v) for k, v in files.items()}


@pytest.fixture(scope='module')
def bombs(valid, tmp_path_factory) -> dict:
    "The files of `BOMBS`, made once for the module."
    return make_bombs(valid['kNN'], tmp_path_factory.mktemp('bombs'))


def test_bombs_refused_in_bounded_memory(valid, bombs):
    "Each bomb is one line at load, and the loading process's peak RSS grows by less than 64 MiB over all of them."
    assert all(p.stat().st_size < 6e6 for p in bombs.values())
    script = f"""
import json, resource, sys
from dars_nb.bundle import load_bundle
from dars_nb.bundle.format import BundleError
load_bundle({str(valid['kNN']['path'])!r}).route(['warm up every import and code path'])
before, out = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, {{}}
for name, path in {({k: str(v) for k, v in bombs.items()})!r}.items():
    try: load_bundle(path); out[name] = 'LOADED'
    except BundleError as e: out[name] = str(e)
out['growth_kib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for name, says in BOMBS.items():
        assert says in out[name] and '\n' not in out[name], (name, out[name])
    assert out['growth_kib'] < 64 * 1024, out['growth_kib']


def test_route_and_serve_refuse_a_bomb_at_start(valid, bombs, tmp_path):
    "`dars route` exits 1 with one line on a 1 GiB bomb, `dars serve` on a bundle over the cap of $DARS_BUNDLE_MAX_MB."
    bomb = bombs['array_1gib']
    pool = tmp_path / 'pool.toml'
    pool.write_text(''.join(f'[models."{m}"]\nbase_url = "http://127.0.0.1:9/v1"\n' for m in valid['kNN']['models']))
    for args, env in [(['route', str(bomb), 'a question'], {}),
                      (['serve', '--router', str(valid['kNN']['path']), '--pool', str(pool)], {'DARS_BUNDLE_MAX_MB': '0.01'})]:
        res = subprocess.run(DARS + args, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        assert res.returncode == 1, (args, res.stderr)
        assert 'Traceback' not in res.stderr and res.stderr.strip().count('\n') == 0, res.stderr
        assert 'over the' in res.stderr and 'bundle size cap' in res.stderr, res.stderr


@pytest.mark.parametrize('how', ['option', 'environment'])
@pytest.mark.parametrize('cap', ['inf', '1e308'])
def test_route_refuses_a_cap_past_any_size_in_one_line(valid, cap, how):
    "A cap of 1e308 MiB (infinitely many bytes once a float) is refused like inf, from --max-bundle-mb or the environment."
    args, env = ['route', str(valid['kNN']['path']), 'a question'], {k: v for k, v in os.environ.items() if k != 'DARS_BUNDLE_MAX_MB'}
    if how == 'option': args += ['--max-bundle-mb', cap]
    else: env['DARS_BUNDLE_MAX_MB'] = cap
    res = subprocess.run(DARS + args, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 1, res.stderr
    assert 'Traceback' not in res.stderr and res.stderr.count('\n') == 1, res.stderr
    source = 'the bundle size cap' if how == 'option' else '$DARS_BUNDLE_MAX_MB'
    assert res.stderr.startswith(f'dars route: error: {source} must be a positive number of MiB'), res.stderr
    if cap == '1e308': assert 'up to 2**44 (16 EiB, the most a zip can declare)' in res.stderr, res.stderr


# ---- Hypothesis ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def traced():
    tracemalloc.start()
    yield
    tracemalloc.stop()


def outcome(path: Path) -> str:
    "'ok' for a bundle that loads and routes; else its one-line BundleError. Anything else fails the test."
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    try:
        bundle = load_bundle(path, CAP_MB)
        choice = bundle.route(['which model answers this'])
        assert len(choice) == 1 and choice[0] in bundle.models
        result = 'ok'
    except BundleError as e:
        result = str(e)
        assert result and '\n' not in result, result
    # what was read is within the cap; the arrays once, a tensor copy, parsed JSON at most 24/32 of the cap
    assert tracemalloc.get_traced_memory()[1] - start < 4 * CAP_MB * MiB
    return result


def write(tmp: Path, data: bytes) -> Path:
    p = tmp / 'fuzz.zip'; p.write_bytes(data); return p


@FUZZ
@given(data=st.binary(max_size=2048) | st.binary(max_size=2048).map(lambda b: b'PK\x03\x04' + b))
def test_any_bytes(data, tmp_path, traced):
    assert outcome(write(tmp_path, data)) != 'ok'


@FUZZ
@given(family=st.sampled_from(['kNN', 'MLP']), cut=st.none() | st.integers(0, 10**6),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6))
def test_changed_bytes(valid, family, cut, flips, tmp_path, traced):
    raw = bytearray(valid[family]['raw'])
    for at, byte in flips: raw[at % len(raw)] = byte
    outcome(write(tmp_path, bytes(raw[:None if cut is None else cut % len(raw)])))


def slots(tree, out=None) -> list:
    "Every (container, key) of a JSON tree, parents before children."
    out = [] if out is None else out
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        out.append((tree, k)); slots(v, out)
    return out


TAGGED = st.sampled_from([{'$float': 'inf'}, {'$float': 'nan'}, {'$scalar': {'dtype': '<f8', 'value': 1e308}},
                          {'$scalar': {'dtype': '|V1000000000', 'value': 0}}, {'$ndarray': 'arrays/0.npy'},
                          {'$ndarray': 'arrays/99.npy'}, {'$strings': {'shape': [10**9], 'values': ['a']}},
                          {'$dtype': '<U5'}, {'$numpy_type': '|O'}, {'$set': [[1]]}, {'$tuple': 3},
                          {'$object': {'class': 'dars_nb.routers.KNNRouter', 'state': {'$dict': []}}},
                          {'$object': {'class': 'builtins.eval', 'state': {'$dict': []}}}, {'$dict': [[1, 2, 3]]}])
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=8) | TAGGED,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=8)


@FUZZ
@given(family=st.sampled_from(['kNN', 'MLP']), changes=st.lists(st.tuples(st.integers(0, 10**6), JSON | st.just(...)),
                                                                 min_size=1, max_size=3))
def test_changed_manifest(valid, family, changes, tmp_path, traced):
    manifest = json.loads(json.dumps(valid[family]['manifest']))
    for at, value in changes:
        where = slots(manifest)
        parent, key = where[at % len(where)]
        if value is ... and isinstance(parent, dict): del parent[key]
        elif value is ...: parent.pop(key)
        else: parent[key] = value
    members = {**valid[family]['members'], 'manifest.json': json.dumps(manifest).encode()}
    path = tmp_path / 'manifest.zip'
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as z:
        for n, b in members.items(): z.writestr(n, b)
    outcome(path)


DTYPES = ['<f8', '<f4', '>f8', '<i8', '|u1', '|b1', '<c16', '<U3', '|S2', '|O', '|V8', '<M8[s]']
NPY = st.builds(lambda shape, descr, data, exact: npy_header(shape, descr)
                + (bytes(int(np.prod(shape, dtype=object)) * np.dtype(descr).itemsize) if exact and np.prod(shape, dtype=object) < 10**5 else data),
                st.lists(st.integers(0, 2**45), max_size=3), st.sampled_from(DTYPES), st.binary(max_size=256), st.booleans())


@FUZZ
@given(family=st.sampled_from(['kNN', 'MLP']), which=st.integers(0, 100), data=NPY | st.binary(max_size=512))
def test_changed_member(valid, family, which, data, tmp_path, traced):
    members = dict(valid[family]['members'])
    arrays = sorted(n for n in members if n.startswith('arrays/'))
    members[arrays[which % len(arrays)]] = data
    path = tmp_path / 'member.zip'
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as z:
        for n, b in members.items(): z.writestr(n, b)
    outcome(path)


def test_valid_bundles_load_under_the_fuzz_cap(valid, traced):
    "The fuzzed bundles themselves load and route within the cap the fuzz uses (so 'ok' outcomes are reachable)."
    for v in valid.values(): assert outcome(v['path']) == 'ok'


# ---- Hypothesis on the fitted state: indices and arrays a file can lie about --------------------------------------
# numpy, scipy, scikit-learn and torch trust the indices and shapes they are given: a TF-IDF vocabulary that maps a
# word to column -1 made scipy write outside its buffer at the first question with that word (glibc aborts the
# process), after a load whose probe question did not hold that word. Each mutated bundle below is loaded and then
# made to route a text for every word of its vocabulary in a separate process, so an abort fails the test instead of
# ending the test run.

SMALL_FAMILIES = {'MLP': dict(hidden_layer_sizes=(4,), max_iter=5, random_state=0), 'kNN': dict(n_neighbors=3),
                  'MIRT': dict(epochs=2, random_state=0), 'EmbedLLM': dict(epochs=2, random_state=0),
                  'RM-Softmax': dict(epochs=2, random_state=0), 'GraphRouter': dict(epochs=2, random_state=0),
                  'AvengersPro': dict(n_clusters=4, n_init=1, random_state=0)}

ROUTE_WORKER = f"""
import json, sys, warnings
warnings.simplefilter('ignore')
from dars_nb.bundle import load_bundle
from dars_nb.bundle.format import BundleError
for line in sys.stdin:
    try: bundle = load_bundle(line.strip(), {CAP_MB})
    except BundleError as e:
        print(json.dumps('refused: ' + str(e)), flush=True); continue
    words = list(getattr(getattr(bundle.featurizer, 'vectorizer_', None), 'vocabulary_', {{}}))
    texts = [f'What is {{w}}?' for w in words] + [' '.join(words), 'a question of no known word']
    try:
        ranked = bundle.rank(texts)
        out = 'ok' if all(sorted(r) == sorted(bundle.models) for r in ranked) else f'BAD RANKING {{ranked[0]}}'
    except Exception as e: out = f'LOADED, THEN FAILED ON A QUESTION: {{type(e).__name__}}: {{e}}'
    print(json.dumps(out), flush=True)
"""


class RouteWorker:
    "One Python process that loads bundles and routes every vocabulary word, a path per line; its death is a finding."
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, '-c', ROUTE_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def outcome(self, path: Path, timeout: float = 60) -> str:
        "'ok', or 'refused: <one line>'; an abort, a hang or any other failure fails the calling test."
        import select
        self.proc.stdin.write(f'{path}\n'); self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ''
        if not line:
            self.proc.kill(); err = self.proc.stderr.read()[-2000:]
            code = self.proc.wait(timeout=10)
            self.__init__()   # a fresh process for the next example
            pytest.fail(f'the routing process {"hung" if not ready else f"died (exit {code})"} on {path}: {err}')
        return json.loads(line)

    def close(self):
        self.proc.stdin.close(); self.proc.wait(timeout=30)


@pytest.fixture(scope='module')
def route_worker():
    worker = RouteWorker()
    yield worker
    worker.close()


@pytest.fixture(scope='module')
def every_family(tmp_path_factory) -> dict:
    "A bundle of each of the seven families on TF-IDF (AvengersPro on an SVD basis): path, manifest and members."
    pytest.importorskip('torch')
    obs, feats, _ = simulate('gpqa_like', n_train=30, n_test=5, seed=0)
    obs = simulated_texts(obs, feats)
    sup = supervision(obs, 'dars')
    texts = obs.drop_duplicates('query_id').set_index('query_id')['query_text'].loc[sup.query_ids].tolist()
    out, folder = {}, tmp_path_factory.mktemp('families')
    for family, params in SMALL_FAMILIES.items():
        tf = TfidfFeaturizer(n_components=6 if family == 'AvengersPro' else None).fit(texts)
        router = ROUTERS[family](**params).fit(tf.transform(texts), sup)
        bundle = RouterBundle(models=list(sup.models), lam=0.05, beta=0.2, mode='dars', featurizer=tf, router=router)
        path = save_bundle(bundle, folder / f'{family}.zip')
        with zipfile.ZipFile(path) as z: members = {n: z.read(n) for n in z.namelist()}
        out[family] = dict(path=path, manifest=json.loads(members['manifest.json']), members=members)
    return out


def whole_number_slots(tree) -> list:
    "Every (container, key) of a manifest tree that holds a whole number: sizes, counts, and vocabulary columns."
    return [(p, k) for p, k in slots(tree) if type(p[k]) is int]


def npy(a: np.ndarray) -> bytes:
    b = io.BytesIO(); np.save(b, a, allow_pickle=False); return b.getvalue()


def mutated_array(a: np.ndarray, how: str, at: int, value) -> np.ndarray:
    "`a` with one value changed, its shape changed or its dtype changed."
    if how == 'value' and a.size:
        out = a.astype(float) if a.dtype.kind in 'iub' and isinstance(value, float) else a.copy()
        out.flat[at % a.size] = value
        return out
    if how == 'drop' and a.ndim: return a[:-1] if at % 2 else a[..., :-1]
    if how == 'grow' and a.ndim: return np.concatenate([a, np.take(a, [0], axis=at % a.ndim)], axis=at % a.ndim)
    if how == 'transpose': return a.T
    if how == 'flatten': return a.ravel()
    if how == 'dtype': return a.astype([np.float32, np.int64, np.uint8, np.bool_, np.complex128][at % 5])
    return a


WHOLE = st.sampled_from([-1, 0, 1, 2, 3, 5, 17, 18, 19, 10**6, 10**12, 2**63]) | st.integers(-2**70, 2**70)
ARRAY_VALUE = st.sampled_from([np.nan, np.inf, -np.inf, -1.0, 0.0, 1e308, -1e308, -1, 10**6, 2**40])
MUTATION = (st.tuples(st.just('whole'), st.integers(0, 10**6), WHOLE)
            | st.tuples(st.just('array'), st.integers(0, 10**6), st.tuples(
                st.sampled_from(['value', 'value', 'drop', 'grow', 'transpose', 'flatten', 'dtype']), st.integers(0, 10**6),
                ARRAY_VALUE)))


@FUZZ
@given(family=st.sampled_from(list(SMALL_FAMILIES)), mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_changed_state(every_family, route_worker, family, mutations, tmp_path):
    "Indices, sizes and arrays of the fitted state changed: each load is refused in one line, or routes every word."
    one = every_family[family]
    manifest, members = json.loads(json.dumps(one['manifest'])), dict(one['members'])
    arrays = sorted(n for n in members if n.startswith('arrays/'))
    for kind, at, change in mutations:
        if kind == 'whole':
            where = whole_number_slots({k: manifest[k] for k in ('featurizer', 'router', 'guard_cv')})
            parent, key = where[at % len(where)]
            parent[key] = change
        else:
            name = arrays[at % len(arrays)]
            how, pos, value = change
            with zipfile.ZipFile(one['path']) as z: a = np.load(io.BytesIO(z.read(name)), allow_pickle=False)
            members[name] = npy(mutated_array(a, how, pos, value))
    members['manifest.json'] = json.dumps(manifest).encode()
    path = tmp_path / 'state.zip'
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as z:
        for n, b in members.items(): z.writestr(n, b)
    result = route_worker.outcome(path)
    assert result == 'ok' or (result.startswith('refused: ') and '\n' not in result), result


@pytest.mark.parametrize('column', [-1, 10**6])
def test_vocabulary_column_out_of_range(every_family, route_worker, column, tmp_path):
    "A word sent to column -1 or 1,000,000: the load is refused in one line (it was an abort, or a 500 per question)."
    one = every_family['kNN']
    manifest = json.loads(json.dumps(one['manifest']))
    pairs = next(p[k] for p, k in slots(manifest) if k == 1 and isinstance(p, list) and p[0] == 'vocabulary_')['$dict']
    word = pairs[0][0]
    pairs.append([word, column])      # the last of a key given twice was the one kept
    path = tmp_path / 'vocabulary.zip'
    with zipfile.ZipFile(path, 'w') as z:
        for n, b in {**one['members'], 'manifest.json': json.dumps(manifest).encode()}.items(): z.writestr(n, b)
    assert route_worker.outcome(path).startswith(f'refused: {path} is damaged:')
    pairs[-1] = ['a word of its own', column]   # a new word, not a repeated key
    with zipfile.ZipFile(path, 'w') as z:
        for n, b in {**one['members'], 'manifest.json': json.dumps(manifest).encode()}.items(): z.writestr(n, b)
    result = route_worker.outcome(path)
    assert result.startswith(f'refused: {path} is damaged:') and str(column) in result, result
    pool = tmp_path / 'pool.toml'
    pool.write_text(''.join(f'[models."{m}"]\nbase_url = "http://127.0.0.1:9/v1"\n' for m in one['manifest']['models']))
    for args in (['route', str(path), 'What is a word of its own?'], ['serve', '--router', str(path), '--pool', str(pool)]):
        res = subprocess.run(DARS + args, capture_output=True, text=True, timeout=120)
        assert res.returncode == 1 and 'Traceback' not in res.stderr and res.stderr.strip().count('\n') == 0, (args, res.returncode, res.stderr)
        assert 'is damaged' in res.stderr, res.stderr


def test_every_family_routes_every_word(every_family, route_worker):
    "The unchanged bundles load and route every word of their vocabulary (so 'ok' outcomes are reachable)."
    for one in every_family.values(): assert route_worker.outcome(one['path']) == 'ok'
