"""Run every benchmark, each in its own process, and print their figures and ratios.

Run: .venv/bin/python bench/run_all.py [--quick]
Benchmarks are measurements, never pass/fail tests: these machines are noisy, so each comparison is
measured side by side in one process and reported as medians of repeated runs.
"""
import argparse, os, platform, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).parent
BENCHES = [  # (script, arguments for the full run, arguments for --quick)
    ('bench_stats.py', [], ['--queries', '20000', '--reps', '2']),
    ('bench_diagnostics.py', [], ['--sizes', '10000', '100000', '--reps', '2']),
    ('bench_routers.py', [], ['--quick']),
    ('bench_reproduce.py', [], ['--quick']),
    ('bench_client.py', [], ['--calls', '400']),
]


def machine() -> str:
    mem = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    return f"{platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='smaller sizes, for a smoke run')
    ap.add_argument('--only', nargs='*', help='run only these scripts')
    a = ap.parse_args(argv)
    print(f"machine: {machine()}\n")
    status = []
    for script, full, quick in BENCHES:
        if a.only and script not in a.only: continue
        if not (HERE / script).exists(): status.append((script, 'missing', 0.0)); continue
        print(f"=== {script} ===", flush=True)
        t = time.perf_counter()
        res = subprocess.run([sys.executable, str(HERE / script), *(quick if a.quick else full)])
        status.append((script, 'ok' if res.returncode == 0 else f'exit {res.returncode}', time.perf_counter() - t))
        print(flush=True)
    print("=== summary ===")
    for script, state, secs in status: print(f"{script:24s} {state:10s} {secs:8.1f} s")
    return 0 if all(s == 'ok' for _, s, _ in status) else 1


if __name__ == '__main__':
    sys.exit(main())
