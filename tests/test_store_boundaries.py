"""The store at its boundaries, through the real `dars collect`: a full disk, two runs creating one store, odd paths.

A full disk is made without root: in a subprocess of its own, either the kernel's file size limit (`RLIMIT_FSIZE`,
with SIGXFSZ ignored, so a write past it fails with EFBIG: sqlite's "disk I/O error") or sqlite's own page limit
(`PRAGMA max_page_count` on every connection: the same SQLITE_FULL, "database or disk is full", a full disk gives).
The endpoint is a `FixedEndpoint` with long answers, so a few dozen observations fill a few hundred kilobytes.
"""
import json
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dars_nb.collect.command import collect_main
from dars_nb.collect.store import SCHEMA_VERSION, Store, status_main
from dars_nb.testing import FixedEndpoint

from dars_command import DARS_SCRIPT as DARS
ENV = {**os.environ, 'PYTHONUNBUFFERED': '1'}
PAD = ' and so on' * 200                    # ~2 KB in every question and every answer

# `dars` with sqlite's page limit on every connection: sqlite refuses to grow a store past PAGES pages
PAGE_LIMITED = '''
import sqlite3, sys
pages, connect = int(sys.argv[1]), sqlite3.connect
def limited(*args, **kwargs):
    conn = connect(*args, **kwargs)
    conn.execute(f"PRAGMA max_page_count = {pages}")
    return conn
sqlite3.connect = limited
from dars_nb.cli import main
sys.exit(main(sys.argv[2:]))
'''


def write_config(folder: Path, base_url: str, train: int = 30, test: int = 10, store: str = 'store.sqlite') -> Path:
    "A collection of `train` + `test` math queries from one fixed-answer model (also the rewriter)."
    tasks = folder / 'tasks.jsonl'
    tasks.write_text(''.join(json.dumps(dict(query_id=f'q{i}', kind='math', question=f'What is {i} + {i}?{PAD}',
                                             gold=str(2 * i))) + '\n' for i in range(train + test)))
    cfg = folder / 'collect.toml'
    cfg.write_text(f'rewriter = "m"\n[limits]\ntimeout_s = 30\nbackoff_s = 0.05\n'
                   f'[models.m]\nbase_url = "{base_url}"\nremote_name = "fixed"\nprice_in = 0.1\nprice_out = 0.2\n'
                   f'concurrency = 1\n'
                   f'[collection]\nstore = "{store}"\noutput = "obs.parquet"\nn_rewrites = 1\nn_decodes = 2\n'
                   f'test_rewrites = 1\ntest_decodes = 2\nsimilarity = "tfidf"\n'
                   f'[[datasets]]\nname = "sums"\npath = "tasks.jsonl"\ntrain = {train}\ntest = {test}\n')
    return cfg


def snapshot(db: Path) -> dict:
    "Every row of the tables a run fills (observations, rewrites, raw rewriter answers), read-only."
    if not db.exists(): return {t: set() for t in ('observations', 'rewrites', 'rewriter_answers')}
    with Store(db, readonly=True) as s:
        return {t: set(s._q(f'SELECT * FROM {t}')) for t in ('observations', 'rewrites', 'rewriter_answers')}


def kept(before: dict, after: dict) -> bool:
    return all(before[t] <= after[t] for t in before)


def file_size_limit(limit: int):
    "A preexec_fn: files of the child can grow to `limit` bytes; a write past it fails (EFBIG), not kills."
    def set_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return set_limit


def run_collect(cfg: Path, limit: str | None = None, size: int = 0) -> subprocess.CompletedProcess:
    "`dars collect CONFIG --quiet` in a process of its own, its disk 'full' at `size` (bytes or pages) if `limit`."
    args = ['collect', str(cfg), '--quiet']
    if limit == 'pages': cmd, pre = [sys.executable, '-c', PAGE_LIMITED, str(size), *args], None
    else: cmd, pre = [DARS, *args], file_size_limit(size) if limit == 'bytes' else None
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, preexec_fn=pre, cwd=cfg.parent, env=ENV)


def assert_one_line(res: subprocess.CompletedProcess, start: str):
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    assert res.stderr.count('\n') == 1 and 'Traceback' not in res.stderr, res.stderr[-3000:]
    assert res.stderr.startswith(start), res.stderr


# ---------------------------------------------------------------------------------------------------------------
# a full disk: one line on the first run and on a re-run, nothing stored lost, a run after space is freed completes

@pytest.mark.timeout(600)
@pytest.mark.parametrize('limit, sizes, reported', [('bytes', (600_000, 1_000_000), 'disk I/O error'),
                                                    ('pages', (40, 150), 'database or disk is full')])
def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path, limit, sizes, reported):
    db = tmp_path / 'store.sqlite'
    with FixedEndpoint(text='Final Answer: 4.' + PAD, delay_s=0) as endpoint:
        cfg = write_config(tmp_path, endpoint.base_url)
        before = snapshot(db)
        # the disk fills in the rewriter phase, then (more room) among the observations; each time the same
        # command runs again while the disk is still full
        for size, filled in zip(sizes, ('rewriter_answers', 'observations')):
            for attempt in ('first', 'again'):
                res = run_collect(cfg, limit, size)
                assert_one_line(res, f'dars collect: error: store {db}: {reported}; ')
                assert 'free space' in res.stderr and 'nothing already stored is lost' in res.stderr, res.stderr
                now = snapshot(db)
                assert kept(before, now), (size, attempt)
                before = now
            assert now[filled], f'nothing was stored before the disk was full at {size}'
        # space freed: the same command completes the plan, every earlier row unchanged
        done = run_collect(cfg)
        assert done.returncode == 0, done.stderr[-2000:]
    end = snapshot(db)
    assert kept(before, end)
    assert len(end['observations']) == 30 * 2 + 10 * (1 + 2)
    assert subprocess.run([DARS, 'store', 'check', str(db)], capture_output=True, text=True,
                          timeout=60).stdout.startswith(f'store {db}: sound; 90 observations')


@pytest.mark.timeout(300)
def test_a_disk_full_before_the_store_exists_leaves_nothing_behind(tmp_path):
    with FixedEndpoint(delay_s=0) as endpoint:
        cfg = write_config(tmp_path, endpoint.base_url, train=2, test=1)
        for _ in range(2):
            res = run_collect(cfg, 'bytes', 20_000)
            assert_one_line(res, f"dars collect: error: store {tmp_path / 'store.sqlite'}: disk I/O error; ")
            # not even a temporary file, nor an empty store a later run would refuse
            assert sorted(p.name for p in tmp_path.iterdir()) == ['collect.toml', 'tasks.jsonl']
        assert run_collect(cfg).returncode == 0


# ---------------------------------------------------------------------------------------------------------------
# two runs start together on a new store: one writes, the other is told who does (never to delete a file)

# a racer: for each config path it is given, `dars collect CONFIG --quiet`, then one JSON line (exit code, stderr)
RACER = '''
import io, json, sys
from dars_nb.cli import main
print('ready', flush=True)
for line in sys.stdin:
    sys.stderr = err = io.StringIO()
    code = main(['collect', line.strip(), '--quiet'])
    sys.stderr = sys.__stderr__
    print(json.dumps([code, err.getvalue()]), flush=True)
'''


@pytest.mark.timeout(600)
def test_two_runs_creating_one_store_one_writes_the_other_is_told_who(tmp_path):
    host = socket.gethostname()
    # two processes, each run let go at the same moment in both; every round on a new store in a new folder
    racers = [subprocess.Popen([sys.executable, '-c', RACER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=ENV) for _ in range(2)]
    try:
        for r in racers: assert r.stdout.readline().strip() == 'ready'
        with FixedEndpoint(delay_s=0.1) as endpoint:      # 10 calls: the winner writes for a second or more
            for round in range(20):
                folder = tmp_path / f'round{round}'
                folder.mkdir()
                cfg = write_config(folder, endpoint.base_url, train=2, test=1, store='runs/store.sqlite')
                db = cfg.parent / 'runs' / 'store.sqlite'
                for r in racers: r.stdin.write(f'{cfg}\n'); r.stdin.flush()
                (code0, err0), (code1, err1) = [json.loads(r.stdout.readline()) for r in racers]
                assert sorted([code0, code1]) == [0, 1], (round, code0, err0, code1, err1)
                winner, err = (racers[0], err1) if code0 == 0 else (racers[1], err0)
                assert err.count('\n') == 1 and 'Traceback' not in err, (round, err)
                assert err.startswith(f'dars collect: error: store {db} is being written by dars collect '
                                      f'(pid {winner.pid} on {host}, started '), (round, err)
                # nothing temporary left next to the store; the winner's run is whole
                assert sorted(p.name for p in db.parent.iterdir()) == ['store.sqlite', 'store.sqlite.lock']
                with Store(db, readonly=True) as s: assert s.count() == 2 * 2 + 1 * (1 + 2)
    finally:
        for r in racers:
            r.stdin.close()
            try: r.wait(timeout=30)
            except subprocess.TimeoutExpired: r.kill(); r.wait()


# ---------------------------------------------------------------------------------------------------------------
# a store path that is a folder, under a file, or a store written by a newer dars_nb: one line each

def _one_line(capsys, code, start):
    out, err = capsys.readouterr()
    assert code == 1, (code, out, err)
    assert err.count('\n') == 1 and err.startswith(start) and 'Traceback' not in err, err
    return err


@pytest.mark.timeout(120)
def test_odd_store_paths_are_one_line(tmp_path, capsys):
    with FixedEndpoint(delay_s=0) as endpoint:
        # a folder where the store should be
        (tmp_path / 'folder.sqlite').mkdir()
        cfg = write_config(tmp_path, endpoint.base_url, train=2, test=1, store='folder.sqlite')
        err = _one_line(capsys, collect_main(str(cfg)), 'dars collect: error: ')
        assert f"store {tmp_path / 'folder.sqlite'} is a folder, not a store file" in err
        _one_line(capsys, status_main(str(tmp_path / 'folder.sqlite')), 'dars status: error: ')
        # under a file: its folder cannot be made
        (tmp_path / 'plain').write_text('')
        cfg = write_config(tmp_path, endpoint.base_url, train=2, test=1, store='plain/sub/store.sqlite')
        err = _one_line(capsys, collect_main(str(cfg)), 'dars collect: error: ')
        assert f"cannot create the folder of store {tmp_path / 'plain' / 'sub' / 'store.sqlite'}: a file has that name" in err
        # a folder that does not exist yet is made; for `dars status` there is no store there
        cfg = write_config(tmp_path, endpoint.base_url, train=2, test=1, store='new/deeper/store.sqlite')
        assert collect_main(str(cfg), quiet=True) == 0
        _one_line(capsys, status_main(str(tmp_path / 'elsewhere' / 'store.sqlite')), 'dars status: error: no store at ')
        # a store written by a newer dars_nb is refused, and left as it was
        db = tmp_path / 'new' / 'deeper' / 'store.sqlite'
        with sqlite3.connect(db) as c:
            c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
        for run in (lambda: collect_main(str(cfg)), lambda: collect_main(str(cfg), dry_run=True),
                    lambda: status_main(str(db))):
            err = _one_line(capsys, run(), 'dars ')
            assert f'store {db} was written by a newer dars_nb (store schema {SCHEMA_VERSION + 1}' in err
        with sqlite3.connect(db) as c:
            assert c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION + 1)
