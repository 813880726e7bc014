"""Run every benchmark, each in its own process, and print their figures and ratios.

Run: .venv/bin/python bench/run_all.py [--quick] [--only bench_stats.py ...] [--markdown FILE]
With `--only` and `--markdown`, only the rows of the scripts run are replaced in the table FILE already holds.
Benchmarks are measurements, never pass/fail tests: these machines are noisy, so each comparison is
measured side by side in one process and reported as medians of repeated runs. The last table
gathers every benchmark's headline figures with its goal; `--markdown` also writes it as Markdown.
"""
import argparse, os, platform, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from summary import MARK, collect

HERE = Path(__file__).parent
BENCHES = [  # (script, arguments for the full run, arguments for --quick)
    ('bench_stats.py', [], ['--queries', '20000', '--reps', '2']),
    ('bench_bootstrap.py', [], ['--reps', '2']),
    ('bench_diagnostics.py', [], ['--sizes', '10000', '100000', '--reps', '2']),
    ('bench_routers.py', [], ['--quick']),
    ('bench_workers.py', [], []),
    ('bench_features.py', [], ['--quick']),
    ('bench_reproduce.py', [], ['--quick']),
    ('bench_scale.py', [], ['--quick']),      # full: 30,000 + 6,000 queries x 11 models, about 15 min
    ('bench_release.py', [], ['--quick', '--reps', '1']),   # full: the authors' release, 131,328 lines, 535 MB
    ('bench_client.py', [], ['--calls', '400']),
    ('bench_serve.py', [], ['--quick']),
    ('bench_ledger.py', [], ['--attempts', '5000', '--reps', '2']),
    ('bench_calibrate.py', [], ['--quick', '--reps', '1']),   # full: also the LLMRouter table, about 2 min
]


def machine() -> str:
    "CPU model, cores, memory and Python version of this machine."
    mem = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    try: cpu = next(l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name'))
    except (OSError, StopIteration): cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--quick', action='store_true', help='smaller sizes, for a smoke run')
    ap.add_argument('--only', nargs='*', help='run only these scripts')
    ap.add_argument('--markdown', help='also write the table of figures to this Markdown file')
    a = ap.parse_args(argv)
    if a.only and a.markdown: merged_table(Path(a.markdown), [], a.only)   # a table to update, before anything runs
    print(f"machine: {machine()}\n")
    status, rows = [], []
    for script, full, quick in BENCHES:
        if a.only and script not in a.only: continue
        if not (HERE / script).exists(): status.append((script, 'missing', 0.0)); continue
        print(f"=== {script} ===", flush=True)
        t = time.perf_counter()
        code, text = run_echoed([sys.executable, str(HERE / script), *(quick if a.quick else full)])
        status.append((script, 'ok' if code == 0 else f'exit {code}', time.perf_counter() - t))
        rows += collect(text)
        print(flush=True)
    print("=== runs ===")
    for script, state, secs in status: print(f"{script:24s} {state:10s} {secs:8.1f} s")
    table = summary_table(rows, machine())
    print("\n=== figures ===\n" + table)
    if a.markdown:
        head = ("# Benchmark figures\n\nWritten by `make bench` (`bench/run_all.py --markdown bench/RESULTS.md`); "
                "each figure is a median of repeated runs, each comparison measured side by side in one process.\n\n")
        if a.only: table = merged_table(Path(a.markdown), rows, a.only)
        Path(a.markdown).write_text(head + table + "\n" + kept_sections(Path(a.markdown)))
    return 0 if all(s == 'ok' for _, s, _ in status) else 1


def merged_table(path: Path, rows: list, scripts: list) -> str:
    """The table of `path` with `rows` in place of the rows of the same benchmark (new ones at the end), for a run of
    some `scripts` only: the other rows stay as the last full run measured them, and a line says which were re-run."""
    if not path.exists(): raise SystemExit(f"{path} has no table to update: run every benchmark first (make bench)")
    lines = path.read_text().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('measured on ')), None)
    if start is None: raise SystemExit(f"{path} has no 'measured on' line: run every benchmark first (make bench)")
    end = next((i for i, l in enumerate(lines) if i > start and l.startswith('## ')), len(lines))
    fresh = {r['benchmark']: table_row(r) for r in rows}
    table, notes = [lines[start], ''], []
    for l in lines[start + 1:end]:
        title = l[2:].split(' | ', 1)[0] if l.startswith('| ') else None
        if title in fresh: table.append(fresh.pop(title))
        elif l.startswith('re-run on '):
            if f"({', '.join(scripts)})" not in l: notes.append(l)   # an older re-run of other scripts
        elif l.strip(): table.append(l)
    table += list(fresh.values())
    notes.append(f"re-run on {time.strftime('%Y-%m-%d')} alone ({', '.join(scripts)}): its rows are from that run")
    return '\n'.join(table + [''] + notes)


def kept_sections(path: Path) -> str:
    "The measurements written by hand below the table of `path` (from its first `## ` heading on), kept on a rewrite."
    if not path.exists(): return ''
    lines = path.read_text().splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.startswith('## ')), None)
    return '' if start is None else '\n' + ''.join(lines[start:])


def run_echoed(cmd) -> tuple[int, str]:
    "Run `cmd`, echoing its output live (summary lines hidden), and return its exit code and output."
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if not line.startswith(MARK): print(line, end='', flush=True)
    return proc.wait(), ''.join(lines)


def table_row(r: dict) -> str:
    "One benchmark's summary row as a line of the Markdown table."
    mark = {True: 'met', False: 'not met', None: ''}
    return f"| {r['benchmark']} | {r['measured']} | {r['goal']} | {mark[r['met']]} |"


def summary_table(rows, machine_line) -> str:
    "Every benchmark's headline figures as one Markdown table."
    out = [f"measured on {machine_line}, {time.strftime('%Y-%m-%d')}", '',
           '| benchmark | measured | goal | |', '|---|---|---|---|']
    return '\n'.join(out + [table_row(r) for r in rows])


if __name__ == '__main__':
    sys.exit(main())
