"""The daily spend ledger's cost per attempt: one reserve and one settle, in memory and kept in its file.

Run: .venv/bin/python bench/bench_ledger.py [--attempts 20000] [--reps 5]
`dars serve` with a daily limit keeps its ledger in a file (`SharedLedger`, `nbs/36b_serve_spend_ledger.ipynb`) so
that restarts and workers keep one limit; without a limit it keeps it in memory (`DailyLedger`). Each attempt of a
routed request reserves before it is sent and settles when it ends. Measured side by side in one process: the CPU time
per attempt (reserve + settle) of each, then of two processes taking turns on one file (each process's own CPU time).
Medians over the repetitions.
"""
import argparse, multiprocessing as mp, statistics, sys, tempfile, time
from pathlib import Path

from dars_nb.serve.ledger import SharedLedger
from dars_nb.serve.metrics import DailyLedger

from summary import emit


def per_attempt(ledger, n: int) -> float:
    "CPU seconds of this process per reserve + settle, over `n` attempts."
    start = time.process_time()
    for _ in range(n): ledger.settle(ledger.reserve('m', 1e-6).entry, 5e-7)
    return (time.process_time() - start) / n


def _contender(path: str, n: int, out):
    out.put(per_attempt(SharedLedger(path, 1e9), n))


def two_processes(folder: Path, n: int) -> list:
    "Each of two processes' CPU seconds per attempt, both on one file at once."
    ctx, out = mp.get_context('fork'), mp.get_context('fork').Queue()
    procs = [ctx.Process(target=_contender, args=(str(folder / 'shared.ledger'), n, out)) for _ in range(2)]
    for p in procs: p.start()
    got = [out.get(timeout=600) for _ in procs]
    for p in procs: p.join()
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--attempts', type=int, default=20_000, help='attempts per measurement')
    ap.add_argument('--reps', type=int, default=5, help='repetitions (median reported)')
    a = ap.parse_args(argv)
    memory, kept, shared = [], [], []
    for rep in range(a.reps):
        folder = Path(tempfile.mkdtemp(prefix='dars-bench-ledger-'))
        memory.append(per_attempt(DailyLedger(1e9), a.attempts))
        kept.append(per_attempt(SharedLedger(folder / f'alone-{rep}.ledger', 1e9), a.attempts))
        shared.extend(two_processes(folder, a.attempts))
        print(f"rep {rep + 1}: in memory {memory[-1] * 1e6:.1f} µs, in its file {kept[-1] * 1e6:.1f} µs, "
              f"two processes on one file {shared[-2] * 1e6:.1f} / {shared[-1] * 1e6:.1f} µs per attempt", flush=True)
    m, k, s = (statistics.median(v) * 1e6 for v in (memory, kept, shared))
    print(f"median CPU per attempt (reserve + settle): in memory {m:.1f} µs; in its file {k:.1f} µs ({k / m:.1f}x); "
          f"two processes on one file {s:.1f} µs each ({s / m:.1f}x)")
    emit('daily spend ledger, CPU per attempt (reserve + settle)',
         f"in memory {m:.1f} µs; kept in its file {k:.1f} µs ({k / m:.1f}x); two processes on one file {s:.1f} µs "
         f"each ({s / m:.1f}x)")


if __name__ == '__main__':
    sys.exit(main())
