"""`dars reproduce` end to end: wall time and peak memory, and how the protocol scales with R and with
the number of training queries.

Run: .venv/bin/python bench/bench_reproduce.py [--quick] [--skip-full]
- full: `dars reproduce --out TMP` in a child process (wall time; peak memory of the whole process tree,
  sampled every 0.2 s);
- scaling: `run_protocol` on gpqa_like with all seven routers, R in {10, 30, 100} at 200 training queries,
  and training queries in {200, 2000, 20000} at R = 10 (test views: 250 queries).
"""
import argparse, os, subprocess, sys, tempfile, threading, time
from pathlib import Path

import pandas as pd

from summary import emit


def tree_rss(pid: int) -> int:
    "Resident memory of a process and all its descendants, in bytes (Linux /proc)."
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f'/proc/{p}/statm') as f: total += int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
            with open(f'/proc/{p}/task/{p}/children') as f: todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, ValueError): pass
    return total


def run_measured(cmd):
    "Wall time and peak tree RSS of a child command."
    peak, t = [0], time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid)); time.sleep(0.2)
    th = threading.Thread(target=sample, daemon=True); th.start()
    _, err = proc.communicate(); th.join()
    if proc.returncode: raise SystemExit(f"{' '.join(cmd)} failed: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}")
    return time.perf_counter() - t, peak[0]


def scaling(sizes, draws, n_test=250):
    from dars_nb.experiments.protocol import make_dataset, run_protocol
    from dars_nb.simulate import simulate
    rows = []
    for n_train, R in [(200, r) for r in draws] + [(n, 10) for n in sizes if n != 200 or 10 not in draws]:
        ds = make_dataset(*simulate('gpqa_like', n_train=n_train, n_test=n_test, seed=0))
        t = time.perf_counter()
        run_protocol(ds, n_draws=R, n_boot=200, progress=False, n_jobs=1)
        rows.append(dict(n_train=n_train, R=R, seconds=time.perf_counter() - t))
        print(f"  n_train={n_train:6d} R={R:3d}: {rows[-1]['seconds']:7.1f} s", flush=True)
    return pd.DataFrame(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='quick reproduce and small scaling sizes')
    ap.add_argument('--skip-full', action='store_true', help='only the scaling study')
    a = ap.parse_args(argv)
    dars = str(Path(sys.executable).with_name('dars'))
    if not a.skip_full:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [dars, 'reproduce', '--out', tmp] + (['--quick'] if a.quick else [])
            secs, peak = run_measured(cmd)
        print(f"dars reproduce{' --quick' if a.quick else ''}: {secs:.0f} s wall, peak memory {peak / 2**30:.2f} GiB "
              f"(process tree){'' if a.quick else ' — goal: <= 600 s and <= 4 GiB'}")
        emit(f"dars reproduce{' --quick' if a.quick else ' (full default)'}", f"{secs:.0f} s wall, peak {peak / 2**30:.2f} GiB",
             '' if a.quick else '<= 600 s, <= 4 GiB', None if a.quick else bool(secs <= 600 and peak <= 4 * 2**30))
    sizes, draws = ((200, 2000), (10, 30)) if a.quick else ((200, 2000, 20000), (10, 30, 100))
    print("protocol scaling (gpqa_like, seven routers, one process):")
    t = scaling(sizes, draws)
    by_r = t[t.n_train == 200].set_index('R')['seconds']
    by_n = t[t.R == 10].set_index('n_train')['seconds']
    print("seconds vs R at 200 training queries:", ', '.join(f"R={r}: {s:.1f}" for r, s in by_r.items()),
          f"(x{by_r.iloc[-1] / by_r.iloc[0]:.1f} for x{by_r.index[-1] / by_r.index[0]:.0f} draws)")
    print("seconds vs training queries at R=10:", ', '.join(f"{n}: {s:.1f}" for n, s in by_n.items()),
          f"(x{by_n.iloc[-1] / by_n.iloc[0]:.1f} for x{by_n.index[-1] / by_n.index[0]:.0f} queries)")
    emit("protocol scaling (gpqa_like, seven routers, one process)",
         "R: " + ', '.join(f"{r}: {s:.0f} s" for r, s in by_r.items()) + "; training queries at R = 10: "
         + ', '.join(f"{n:,}: {s:.0f} s" for n, s in by_n.items()))
    return t


if __name__ == '__main__':
    main()
