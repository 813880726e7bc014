"""One summary line per benchmark, so `run_all.py` can print every figure in one table.

A benchmark calls `emit(name, measured, goal, met)` for each headline figure; the line it prints
starts with `MARK` and carries JSON. `collect(text)` reads them back from a benchmark's output.
"""
import json

MARK = 'BENCH-SUMMARY '


def emit(benchmark: str, # what was measured
         measured: str, # the figures and ratios, as the reader should see them
         goal: str = '', # the goal they are held against ('' for none)
         met: bool | None = None, # whether the goal is met (None: no goal)
        ) -> None:
    "Print one machine-readable summary line."
    print(MARK + json.dumps(dict(benchmark=benchmark, measured=measured, goal=goal, met=met)), flush=True)


def collect(text: str) -> list[dict]:
    "The summary rows in a benchmark's output."
    return [json.loads(line[len(MARK):]) for line in text.splitlines() if line.startswith(MARK)]
