"""dars_nb's `--protocol authors` against the authors' own router scripts, cell by cell, on one release-layout folder.

Run: .venv/bin/python bench/compare_authors.py --code DIR --data DIR [--runs 10] [--families MLP kNN ...]
     [--seeds 43 44 45 46] [--markdown FILE]
     .venv/bin/python bench/compare_authors.py --simulate DIR [--n-train 200 --n-test 100]   (writes a folder, then compares)

`--code` is a folder holding the authors' `methods/` scripts (GitHub AIGNLAI/DARS; the tool never ships them).
Both sides run on one thread. Their side: each family's script as it is, in a subprocess, with its own
command-line options (`--data-dir`, `--output-dir`, `--feature-backend tfidf`, `--single-point-runs R`,
`--seed S`, `--device cpu` where it has one), and its `*_summary.csv` read back. Our side: the folder read
once under the authors' protocol, then `run_protocol` per family with `AUTHORS_PROTOCOL.routers`. A cell
is (router, dataset, view, supervision); U = mean score − 0.05 · mean normalised cost, single-shot
averaged over the R draws. The table prints U on both sides, ΔU, and per family the mean and the largest
|ΔU|, the cells equal to 1e-12, both sides' seconds and their ratio.

`--seeds` reruns the authors' scripts of the order-sensitive families (MLP and the torch ones) with other
seeds: the spread of their own code is the mean and the largest |U(seed) − U(42)| over those reruns and
cells, the yardstick for a family that cannot be equal bit for bit.
"""
import os
os.environ.setdefault('OMP_NUM_THREADS', '1')      # both sides on one thread, set before numpy is imported
os.environ.setdefault('MKL_NUM_THREADS', '1')
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
import argparse, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np
import pandas as pd

from summary import emit

FAMILIES = ('MLP', 'kNN', 'MIRT', 'EmbedLLM', 'RM-Softmax', 'GraphRouter', 'AvengersPro')
# their script per family: the released names first, the names of their earlier commits after
SCRIPTS = {'MLP': ('mlp.py',), 'kNN': ('knn_router.py', 'knn.py'), 'MIRT': ('mirt.py',),
           'EmbedLLM': ('embed_llm.py', 'EmbedLLM.py'), 'RM-Softmax': ('rm_softmax.py', 'causalrouter.py'),
           'GraphRouter': ('graph_router.py', 'graphrouter.py'), 'AvengersPro': ('avengers_pro.py', 'avengerspro.py')}
WITH_DEVICE = {'kNN', 'MIRT', 'EmbedLLM', 'RM-Softmax', 'GraphRouter'}
SEED_SENSITIVE = ('MLP', 'MIRT', 'EmbedLLM', 'RM-Softmax', 'GraphRouter')
THEIR_DATASETS = ('gpqa', 'math-500', 'drop-800')
LAM = 0.05
VIEWS = {'rewrite': 'rewrite', 'decode': 'decoding'}
MODES = {'distribution': 'dars', 'single-point': 'single'}
EXACT = 1e-12


def script(code: Path, family: str) -> Path:
    "The authors' script of one family in `code` (or its `methods/`)."
    for name in SCRIPTS[family]:
        for folder in (code / 'methods', code):
            if (folder / name).is_file(): return folder / name
    raise SystemExit(f"compare_authors: no {' or '.join(SCRIPTS[family])} in {code} or {code / 'methods'}")


def run_theirs(code: Path, data: Path, family: str, runs: int, seed: int = 42) -> tuple[pd.DataFrame, float]:
    "Their script on `data`: U per (dataset, supervision, view), and its wall seconds."
    datasets = [d for d in THEIR_DATASETS if (data / d).is_dir()]
    with tempfile.TemporaryDirectory(prefix='theirs_') as out:
        cmd = [sys.executable, str(script(code, family)), '--data-dir', str(data), '--output-dir', out,
               '--datasets', *datasets, '--feature-backend', 'tfidf', '--single-point-runs', str(runs),
               '--seed', str(seed), *(['--device', 'cpu'] if family in WITH_DEVICE else [])]
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=6 * 3600)
        seconds = time.perf_counter() - t
        if done.returncode != 0:
            raise SystemExit(f"compare_authors: their {family} script failed: {done.stderr.strip().splitlines()[-1]}")
        summary = next(p for p in Path(out).glob('*_summary.csv') if not p.name.endswith('_by_mode.csv'))
        table = pd.read_csv(summary)
    rows = []
    for (dataset, mode), g in table.groupby(['dataset', 'mode']):
        for view, prefix in VIEWS.items():
            score, cost = g[f'{prefix}_score'].mean(), g[f'{prefix}_cost'].mean()
            rows.append(dict(router=family, dataset=dataset, view=view, supervision=MODES[mode],
                             utility=score - LAM * cost))
    return pd.DataFrame(rows), seconds


def load_ours(data: Path):
    "The folder's datasets under the authors' protocol, and the seconds the read and the features took."
    from dars_nb.experiments.inputs import load_data
    from dars_nb.experiments.presets import AUTHORS_PROTOCOL as P
    t = time.perf_counter()
    datasets, _ = load_data(data, formulas=P.formulas, text_features=dict(method=P.features, text=P.text, **P.tfidf),
                            family_texts=P.family_texts,
                            log=lambda *a: None)
    return datasets, time.perf_counter() - t


def run_ours(datasets, family: str, runs: int, router=None) -> tuple[pd.DataFrame, float]:
    "`run_protocol` for one family under the authors' protocol: U per cell, and the seconds it took."
    from dars_nb.experiments.presets import AUTHORS_PROTOCOL as P
    from dars_nb.experiments.protocol import run_protocol
    from dars_nb.routers import ROUTERS
    routers = P.routers({family: ROUTERS[family]() if router is None else router})
    t = time.perf_counter()
    res = run_protocol(datasets, routers, n_draws=runs, seed=P.seed, n_boot=10, n_jobs=1, progress=False)
    seconds = time.perf_counter() - t
    return res[['router', 'dataset', 'view', 'supervision', 'utility']], seconds


def cells(theirs: pd.DataFrame, ours: pd.DataFrame) -> pd.DataFrame:
    "Both sides per cell, and ΔU = ours − theirs."
    keys = ['router', 'dataset', 'view', 'supervision']
    both = theirs.merge(ours, on=keys, suffixes=('_theirs', '_ours'), how='outer', validate='one_to_one')
    if both[['utility_theirs', 'utility_ours']].isna().any(axis=None):
        raise SystemExit("compare_authors: the two sides hold different cells")
    return both.assign(delta=both['utility_ours'] - both['utility_theirs'])


def spread(code: Path, data: Path, family: str, runs: int, seeds, base: pd.DataFrame) -> pd.Series:
    "|U(seed) − U(42)| of their own code per cell and seed."
    keys = ['router', 'dataset', 'view', 'supervision']
    ref = base.set_index(keys)['utility_theirs']
    out = [(run_theirs(code, data, family, runs, s)[0].set_index(keys)['utility'] - ref).abs() for s in seeds]
    return pd.concat(out)


def simulated_release(folder: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    "A release-layout folder from the simulator: gpqa, math-500 and drop-800, texts that carry the latent features."
    from dars_nb.simulate import simulate
    from dars_nb.sources.release_writer import write_release
    parts = []
    for name, profile in zip(THEIR_DATASETS, ('gpqa_like', 'math_like', 'drop_like')):
        obs, feats, _ = simulate(profile, n_train=n_train, n_test=n_test, seed=seed)
        # one word per latent dimension: its sign and size, so that TF-IDF sees what the models' skill depends on
        words = {q: ' '.join(f"f{j}{'p' if x > 0 else 'n'}{min(int(abs(x) * 2), 3)}" for j, x in enumerate(row))
                 for q, row in zip(feats.index.astype(str), feats.to_numpy())}
        ids = obs['query_id'].astype(str)
        parts.append(obs.assign(dataset=name, original_text=ids.map(lambda q: f"{words[q]} item {q}")))
    return write_release(pd.concat(parts, ignore_index=True), folder, source='synthetic rows from dars_nb.simulate')


def family_summary(table: pd.DataFrame, seconds: dict, spreads: dict) -> pd.DataFrame:
    "Per family: mean and largest |ΔU|, cells equal, both sides' seconds and the ratio, their seed spread."
    rows = []
    for family, g in table.groupby('router', sort=False):
        d = g['delta'].abs()
        theirs, ours = seconds[family]
        s = spreads.get(family)
        rows.append({'family': family, 'cells': len(g), 'equal (1e-12)': int((d <= EXACT).sum()),
                     'mean |ΔU|': d.mean(), 'max |ΔU|': d.max(), 'theirs (s)': theirs, 'ours (s)': ours,
                     'speed-up': theirs / ours,
                     'their seed spread, mean': np.nan if s is None else s.mean(),
                     'their seed spread, max': np.nan if s is None else s.max()})
    return pd.DataFrame(rows)


def markdown(df: pd.DataFrame, floats: str = '.4f') -> str:
    "A DataFrame as a Markdown table."
    def fmt(v):
        if isinstance(v, float): return 'n/a' if np.isnan(v) else (f'{v:.1e}' if 0 < abs(v) < 1e-4 else format(v, floats))
        return str(v)
    lines = ['| ' + ' | '.join(str(c).replace('|', '\\|') for c in df.columns) + ' |', '|' + '---|' * len(df.columns)]
    lines += ['| ' + ' | '.join(fmt(v) for v in row) + ' |' for row in df.itertuples(index=False)]
    return '\n'.join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--code', type=Path, required=True, help="folder of the authors' code (holding methods/)")
    ap.add_argument('--data', type=Path, help='a release-layout folder')
    ap.add_argument('--simulate', type=Path, help='write a release-layout folder from the simulator here, and use it')
    ap.add_argument('--n-train', type=int, default=200, help='with --simulate: training queries per dataset')
    ap.add_argument('--n-test', type=int, default=100, help='with --simulate: test queries per dataset')
    ap.add_argument('--runs', type=int, default=10, help='R, single-shot draws on both sides')
    ap.add_argument('--families', nargs='+', default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument('--seeds', nargs='*', type=int, default=[], help="more seeds for their code's spread")
    ap.add_argument('--markdown', type=Path, help='append the tables to this file')
    ap.add_argument('--label', default='', help='what the folder is, for the tables')
    a = ap.parse_args(argv)
    if (a.data is None) == (a.simulate is None): ap.error('give one of --data or --simulate')
    data = a.data or simulated_release(a.simulate, a.n_train, a.n_test)
    datasets, load_seconds = load_ours(data)
    parts, seconds, spreads = [], {}, {}
    for family in a.families:
        theirs, their_seconds = run_theirs(a.code, data, family, a.runs)
        ours, our_seconds = run_ours(datasets, family, a.runs)
        part = cells(theirs, ours)
        parts.append(part)
        # each of their scripts reads the folder and builds its features itself: ours once, counted for each
        seconds[family] = (their_seconds, our_seconds + load_seconds)
        if a.seeds and family in SEED_SENSITIVE: spreads[family] = spread(a.code, data, family, a.runs, a.seeds, part)
        d = part['delta'].abs()
        print(f"{family:12s} mean |ΔU| {d.mean():.2e}  max {d.max():.2e}  theirs {their_seconds:.1f} s, "
              f"ours {our_seconds + load_seconds:.1f} s", flush=True)
    table = pd.concat(parts, ignore_index=True)
    summary = family_summary(table, seconds, spreads)
    label = a.label or str(data)
    print(f"\nPer cell on {label} (R = {a.runs}):")
    print(table.to_string(index=False, float_format=lambda v: f'{v:.6f}'))
    print('\nPer family:')
    print(summary.to_string(index=False))
    d = table['delta'].abs()
    print(f"\nall families: mean |ΔU| {d.mean():.2e}, max {d.max():.2e}, {int((d <= EXACT).sum())} of {len(d)} cells equal")
    if a.markdown:
        with open(a.markdown, 'a') as f:
            f.write(f"\n{label}, R = {a.runs}, one thread, seeds {', '.join(map(str, [42, *a.seeds]))}:\n\n")
            f.write(markdown(summary) + '\n\n' + markdown(table.round(6), '.6f') + '\n')
    emit(f"--protocol authors against the authors' code ({label})",
         f"mean |ΔU| {d.mean():.2e}, max {d.max():.2e}; {int((d <= EXACT).sum())} of {len(d)} cells equal",
         'mean |ΔU| <= 0.005', bool(d.mean() <= 0.005))
    return 0


if __name__ == '__main__':
    sys.exit(main())
