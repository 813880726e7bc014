"""Reading the authors' release at its full size: seconds and peak memory of `read_release`.

Run: .venv/bin/python bench/bench_release.py [--quick] [--reps 2] [--keep DIR]

A synthetic release of the real one's size is written to a temporary folder with `write_release`: the
simulator's three profiles renamed gpqa, math-500 and drop-800, 200 training queries x 6 models x 5 x 5
and 248 / 300 / 600 test queries x 6 models x (3 + 3) — 130,328 lines — with texts of realistic length
(a GPQA question of about 450 characters with four options, a MATH problem of about 250, a DROP question
of about 90 after a passage of about 1,500; answers of about 650 / 1,900 / 500 characters, held twice
on a line as the authors' scorer writes them), so that the GPQA training file is about 100 MB.

Each read runs in a fresh process (the figures are that process's): the seconds of `read_release` on the
whole folder (wall and CPU time), and the process's peak resident memory (`VmHWM`). Beside them, in the same process
before the read: the memory after importing the library (what any command costs), and the seconds of a
bare pass over the files — every line through `json.loads` and nothing else, the floor of any reader of
JSON lines. Goals: the whole release in well under a minute (held: <= 30 s) and under 2 GB. The reader
is one thread, so the time is held against its CPU time — the wall time it takes with a core to itself;
on a shared machine the wall time is printed beside it with the load average, and is the larger.
`--quick` writes a tenth of the queries.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np
import pandas as pd

from summary import emit

GOAL_SECONDS, GOAL_BYTES = 30.0, 2e9
PROFILES = {'gpqa': ('gpqa_like', 248), 'math-500': ('math_like', 300), 'drop-800': ('drop_like', 600)}
# characters: question, passage, one option, answer text
LENGTHS = {'gpqa': (450, 0, 60, 650), 'math-500': (250, 0, 0, 1900), 'drop-800': (90, 1500, 0, 500)}

CHILD = r"""
import json, sys, time
from pathlib import Path
from dars_nb.sources.release import read_release, release_files

def peak():   # this process's peak resident memory (VmHWM: since exec, not inherited from the parent)
    line = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))
    return int(line.split()[1]) * 1024

imported = peak()
t = time.perf_counter()
for _, _, path in release_files(sys.argv[1]):
    with open(path, encoding='utf-8') as f:
        for line in f: json.loads(line)
floor = time.perf_counter() - t
t, c = time.perf_counter(), time.process_time()
obs = read_release(sys.argv[1])
seconds, cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps(dict(seconds=seconds, cpu=cpu, floor=floor, rows=len(obs), imported=imported, peak=peak(),
                      table=int(obs.memory_usage(deep=True).sum()))))
"""


def words(n: int, seed: int) -> str:
    "About `n` characters of made-up words."
    rng = np.random.default_rng(seed)
    vocab = ['energy', 'sample', 'reaction', 'field', 'value', 'the', 'of', 'a', 'ratio', 'charge', 'mass',
             'number', 'given', 'find', 'which', 'after', 'before', 'team', 'points', 'year']
    out = ' '.join(rng.choice(vocab, size=n // 5 + 1))
    return out[:n]


def synthetic(name: str, quick: bool) -> pd.DataFrame:
    "One dataset of the release's shape, with texts of realistic length."
    from dars_nb.simulate import simulate
    from dars_nb.sources.release import RELEASE_MODELS
    from dars_nb.observations import format_options
    profile, n_test = PROFILES[name]
    scale = 10 if quick else 1
    obs, _, _ = simulate(profile, n_train=200 // scale, n_test=n_test // scale, seed=0)
    obs['dataset'] = name
    models = dict(zip(sorted(obs['model'].unique(), key=list(obs['model'].unique()).index), RELEASE_MODELS))
    obs['model'] = obs['model'].map(models)
    q, p, o, _ = LENGTHS[name]
    ids = obs['query_id'].astype(str)
    texts = {qid: words(q, i) for i, qid in enumerate(ids.unique())}
    obs['original_text'] = ids.map(texts)
    obs['query_text'] = [t if r == 0 else f'Rewrite {r}: {t}' for t, r in zip(obs['original_text'], obs['rewrite_id'])]
    if p: obs['passage'] = ids.map({qid: words(p, 10_000 + i) for i, qid in enumerate(ids.unique())})
    if o: obs['options'] = ids.map({qid: format_options([words(o, 20_000 + 4 * i + k) for k in range(4)])
                                    for i, qid in enumerate(ids.unique())})
    return obs


def write(folder: Path, quick: bool) -> tuple[float, dict]:
    "Write the synthetic release; its seconds and the size of each file."
    from dars_nb.sources.release_writer import write_release
    t = time.perf_counter()
    for name in PROFILES:
        write_release(synthetic(name, quick), folder, output_chars=LENGTHS[name][3], source='bench_release.py')
    sizes = {f'{p.parent.name}/{p.name}': p.stat().st_size for p in sorted(folder.glob('*/*.jsonl'))}
    return time.perf_counter() - t, sizes


def read_once(folder: Path) -> dict:
    "One read in a fresh process."
    done = subprocess.run([sys.executable, '-c', CHILD, str(folder)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='a tenth of the queries')
    ap.add_argument('--reps', type=int, default=2, help='reads, each in its own process (medians shown)')
    ap.add_argument('--keep', help='write the release to this folder and keep it')
    a = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix='dars_release_') as tmp:
        folder = Path(a.keep) if a.keep else Path(tmp)
        seconds, sizes = write(folder, a.quick)
        total = sum(sizes.values())
        print(f"wrote {len(sizes)} files, {total / 1e6:.0f} MB in {seconds:.1f} s")
        for name, size in sizes.items(): print(f"  {name:42s} {size / 1e6:8.1f} MB")
        runs = [read_once(folder) for _ in range(a.reps)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rows = int(med['rows'])
    print(f"\nread_release: {rows:,} rows in {med['seconds']:.1f} s ({rows / med['seconds']:,.0f} rows/s; "
          f"runs {', '.join(format(r['seconds'], '.1f') for r in runs)} s), {med['cpu']:.1f} s of CPU time "
          f"(load average {os.getloadavg()[0]:.2f}: on a shared machine the wall time is the larger)")
    print(f"  json.loads alone over the same lines: {med['floor']:.1f} s "
          f"(the reader takes {med['seconds'] / med['floor']:.1f}x the bare parse)")
    print(f"  peak memory {med['peak'] / 1e9:.2f} GB (after imports {med['imported'] / 1e9:.2f} GB); "
          f"the table itself {med['table'] / 1e6:.0f} MB for {total / 1e6:.0f} MB of files")
    full = '' if not a.quick else ' (--quick: a tenth of the queries)'
    emit(f'read the authors\' release ({rows:,} rows, {total / 1e6:.0f} MB){full}',
         f"{med['seconds']:.1f} s, {med['cpu']:.1f} s CPU ({med['seconds'] / med['floor']:.1f}x a bare json.loads pass), "
         f"peak {med['peak'] / 1e9:.2f} GB", f'<= {GOAL_SECONDS:.0f} s of CPU time (one thread), < 2 GB',
         bool(med['cpu'] <= GOAL_SECONDS and med['peak'] < GOAL_BYTES))
    return 0


if __name__ == '__main__':
    sys.exit(main())
