"""The store survives SIGKILL: a writer process is killed mid-run, the file is reopened and checked.

Rows are a pure function of their index, so "every committed row intact" is checked value by value;
the writer prints an index only after `insert` has returned (committed).
"""
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from dars_nb.collect.store import Store
from dars_nb.observations import KEY_COLUMNS

WRITER = textwrap.dedent('''
    import sys, time
    from dars_nb.collect.store import Store
    sys.path.insert(0, {here!r})
    from test_store_kill import row
    path, start, stop, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    s = Store(path)
    print('open', flush=True)
    if batch:
        for b in range(start, stop, batch):
            n = s.insert_many([row(i) for i in range(b, min(b + batch, stop))])
            print('batch', b, n, flush=True)
    else:
        for i in range(start, stop):
            new = s.insert(row(i))
            print(i, int(new), flush=True)
    print('done', flush=True)
''')


def row(i: int) -> dict:
    "The observation with index i (its key and every value follow from i)."
    return dict(dataset='kill', split='train' if i % 5 else 'test', view='grid' if i % 5 else 'decode',
                query_id=f'q{i // 25:05d}', model=('small', 'large')[i % 2], rewrite_id=(i // 5) % 5, sample_id=i % 5,
                score=(i % 7) / 6, cost=i * 1e-7, prompt_tokens=100 + i % 13, completion_tokens=i % 97,
                latency_s=0.001 * i, temperature=0.7, parsed=bool(i % 3), response=f'response {i} ' + 'x' * (i % 300),
                query_text=f'query {i // 25}', finish_reason='stop')


def start_writer(path, start, stop, batch=0):
    script = path.parent / 'writer.py'
    script.write_text(WRITER.format(here=os.path.dirname(__file__)))
    return subprocess.Popen([sys.executable, str(script), str(path), str(start), str(stop), str(batch)],
                            stdout=subprocess.PIPE, text=True, bufsize=1)


def read_until(proc, n_lines):
    "Lines from the writer until `n_lines` committed rows were reported (or it ended)."
    lines = []
    while len(lines) < n_lines:
        line = proc.stdout.readline()
        if not line: break
        if line.strip() not in ('open', 'done'): lines.append(line.split())
    return lines


def check_rows(path, upto=None):
    "Reopen the store: integrity, unique keys, and every row equal to row(i)."
    with sqlite3.connect(path) as con:
        assert con.execute('PRAGMA integrity_check').fetchone()[0] == 'ok'
    with Store(path) as s:
        frame = s.to_frame()             # validates: unique natural keys, scores in range, ...
        n = s.count()
        assert len(s.keys()) == n == len(frame)
    idx = frame['response'].str.split(' ').str[1].astype(int).to_numpy()
    for i, rec in zip(idx, frame.to_dict('records')):
        want = row(int(i))
        for k, v in want.items():
            got = str(rec[k]) if k in KEY_COLUMNS[:5] else rec[k]
            if isinstance(v, float): assert got == pytest.approx(v, rel=1e-12), (i, k, got, v)
            else: assert got == v, (i, k, got, v)
    return set(int(i) for i in idx)


def test_sigkill_mid_run_loses_nothing_and_restart_duplicates_nothing(tmp_path):
    path = tmp_path / 'obs.sqlite'
    committed = set()
    for round_, kill_after in enumerate((150, 400, 700)):
        start = max(committed) + 1 if committed else 0
        w = start_writer(path, start, 100_000)
        lines = read_until(w, kill_after - start if round_ else kill_after)
        time.sleep(0.01 * round_)                    # kill at a different point of the loop each round
        w.send_signal(signal.SIGKILL)
        w.wait()
        tail = w.stdout.read().split('\n')[:-1]     # lines printed in full before the kill (a cut-off last line is not)
        lines += [l.split() for l in tail if l not in ('open', 'done')]
        committed |= {int(i) for i, _ in lines}
        stored = check_rows(path)
        assert committed <= stored                   # every row reported committed is there, unchanged
        assert stored - committed <= {max(committed) + 1}   # at most the one committed but not yet printed
        assert stored == set(range(len(stored)))
        committed = stored
    # restart from zero, re-sending everything: nothing already stored is written again
    n_before = len(committed)
    final = 1000
    w = start_writer(path, 0, final)
    out, _ = w.communicate(timeout=120)
    assert w.returncode == 0
    flags = [tuple(map(int, l.split())) for l in out.splitlines() if l not in ('open', 'done')]
    assert [i for i, _ in flags] == list(range(final))
    assert all(new == 0 for i, new in flags if i in committed)
    assert sum(new for _, new in flags) == final - n_before
    assert check_rows(path) == set(range(final))


def test_sigkill_during_a_batch_writes_all_or_none(tmp_path):
    path = tmp_path / 'obs.sqlite'
    batch = 2000
    w = start_writer(path, 0, 200_000, batch=batch)
    read_until(w, 2)                                  # two batches committed, then kill
    w.send_signal(signal.SIGKILL)
    w.wait()
    stored = check_rows(path)
    assert len(stored) % batch == 0 and len(stored) >= 2 * batch
    assert stored == set(range(len(stored)))


def test_a_reader_process_sees_a_growing_consistent_table_while_a_writer_runs(tmp_path):
    path = tmp_path / 'obs.sqlite'
    Store(path).close()
    w = start_writer(path, 0, 600)
    seen = []
    with Store(path) as reader:
        while w.poll() is None:
            seen.append(reader.count())
            keys = reader.keys()
            assert len(keys) >= seen[-1]
            time.sleep(0.01)
        seen.append(reader.count())
    assert w.returncode == 0
    assert seen == sorted(seen) and seen[-1] == 600
    assert check_rows(path) == set(range(600))
