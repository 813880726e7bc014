"""Options that cannot apply, and what the CLI claims: `dars calibrate`, `dars store`, `dars cache`, `dars status`.

Each command runs as a user runs it (a subprocess of the installed `dars` script): an option that cannot go with the
rest is refused in one line on stderr with exit code 1, and what is printed on success is true of the files.
"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dars_command import DARS, run, assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_env(tmp_path):
    "The environment of a run whose cache is an empty temporary folder."
    (tmp_path / 'cache').mkdir()
    return {**os.environ, 'DARS_CACHE': str(tmp_path / 'cache')}


def _store(path: Path, n: int = 400) -> Path:
    "A sound store of `n` observations (with text, so that they spread over a few dozen pages) and three meta keys."
    from dars_nb.collect.store import Store
    row = dict(dataset='mmlu', split='train', view='grid', model='m', rewrite_id=1, sample_id=0, score=1.0, cost=1e-6)
    with Store(path) as s:
        s.insert_many([{**row, 'query_id': f'q{i}', 'response': 'x' * 200} for i in range(n)])
        for k in ('decoding', 'pool', 'plan'): s.set_meta(k, {'k': k})
    return path


# ---------------------------------------------------------------------------------------------------------------
# dars calibrate: --model goes with --share only

def test_calibrate_refuses_model_with_a_cost_target(tmp_path, cache_env):
    router = tmp_path / 'r.dars'
    trained = run('train', str(ROOT / 'data/local_grid/router.toml'), '--out', str(router), '--quiet', env=cache_env)
    assert trained.returncode == 0, trained.stderr
    assert run('calibrate', str(router), '--cost', '0.000001', '--quiet', env=cache_env).returncode == 0
    res = run('calibrate', str(router), '--cost', '0.000001', '--model', 'gemma3', env=cache_env)
    assert_one_line_error(res, 'calibrate')
    assert '--model gemma3 goes with a target share (--share), not with a target cost (--cost)' in res.stderr
    assert res.stdout == ''


# ---------------------------------------------------------------------------------------------------------------
# dars store: --out goes with salvage; a salvage says what it read, what was there, what it copied

def test_store_check_refuses_out(tmp_path):
    db = _store(tmp_path / 's.sqlite', n=3)
    res = run('store', 'check', str(db), '--out', str(tmp_path / 'x.sqlite'))
    assert_one_line_error(res, 'store')
    assert 'goes with salvage; check writes nothing' in res.stderr
    assert not (tmp_path / 'x.sqlite').exists()


def test_salvage_of_a_sound_store_counts_every_row(tmp_path):
    db = _store(tmp_path / 's.sqlite')
    res = run('store', 'salvage', str(db), '--out', str(tmp_path / 'new.sqlite'))
    assert res.returncode == 0 and res.stderr == '', res
    assert '  observations: 400 of 400 row(s) copied\n' in res.stdout
    assert '  meta: 3 of 3 row(s) copied besides the schema version' in res.stdout, res.stdout
    with sqlite3.connect(tmp_path / 'new.sqlite') as new:
        assert new.execute('SELECT COUNT(*) FROM observations').fetchone()[0] == 400
        assert new.execute("SELECT COUNT(*) FROM meta WHERE key != 'schema_version'").fetchone()[0] == 3


def test_salvage_of_a_store_cut_in_half_copies_the_rows_left_and_says_the_total_is_unknown(tmp_path):
    db = _store(tmp_path / 's.sqlite')
    half = tmp_path / 'half.sqlite'
    half.write_bytes(db.read_bytes()[:db.stat().st_size // 2])
    before = half.read_bytes()
    res = run('store', 'salvage', str(half), '--out', str(tmp_path / 'new.sqlite'))
    assert res.returncode == 0, res
    line = next(l for l in res.stdout.splitlines() if l.startswith('  observations: '))
    got = int(line.split()[1])
    assert 0 < got < 400, res.stdout
    assert line == f'  observations: {got} row(s) readable of an unknown number (the table cannot be counted), {got} copied'
    assert '0 of 0' not in line
    with sqlite3.connect(tmp_path / 'new.sqlite') as new:
        assert new.execute('SELECT COUNT(*) FROM observations').fetchone()[0] == got
    assert half.read_bytes() == before                      # the damaged file is only read


def test_salvage_that_recovers_nothing_is_an_error_and_leaves_no_store(tmp_path):
    db = _store(tmp_path / 's.sqlite')
    first_page = tmp_path / 'first_page.sqlite'
    first_page.write_bytes(db.read_bytes()[:4096])
    res = run('store', 'salvage', str(first_page), '--out', str(tmp_path / 'new.sqlite'))
    assert_one_line_error(res, 'store')
    assert 'nothing could be salvaged from' in res.stderr and 'no new store was written' in res.stderr
    assert res.stdout == '' and not list(tmp_path.glob('new.sqlite*'))


# ---------------------------------------------------------------------------------------------------------------
# dars cache: --part goes with clear; a cache folder that is missing or a file is said to be so

def test_cache_info_refuses_part(tmp_path, cache_env):
    res = run('cache', 'info', '--part', 'embeddings', env=cache_env)
    assert_one_line_error(res, 'cache')
    assert '--part embeddings goes with clear, not info' in res.stderr


@pytest.mark.parametrize('action', ['info', 'clear'])
def test_cache_folder_that_is_a_file_is_refused(tmp_path, cache_env, action):
    (tmp_path / 'a.zip').write_bytes(b'PK')
    res = run('cache', action, '--cache-dir', str(tmp_path / 'a.zip'), env=cache_env)
    assert_one_line_error(res, 'cache')
    assert f"cache folder {tmp_path / 'a.zip'} is a file, not a folder" in res.stderr
    assert (tmp_path / 'a.zip').read_bytes() == b'PK'


def test_cache_folder_that_does_not_exist_is_said_to_be_missing(tmp_path, cache_env):
    missing = tmp_path / 'nowhere'
    res = run('cache', 'info', '--cache-dir', str(missing), env=cache_env)
    assert res.returncode == 0 and res.stderr == '', res
    assert res.stdout.startswith(f'no cache folder at {missing} yet: nothing is cached'), res.stdout
    assert 'file(s)' not in res.stdout
    res = run('cache', 'clear', '--cache-dir', str(missing), env=cache_env)
    assert res.returncode == 0 and res.stdout == f'nothing to clear: no cache folder at {missing}\n', res
    assert not missing.exists()


# ---------------------------------------------------------------------------------------------------------------
# dars status: a collection stopped with Ctrl-C is reported as interrupted

def _collect_config(tmp_path: Path, base_url: str) -> Path:
    tasks = tmp_path / 'tasks.jsonl'
    tasks.write_text(''.join(json.dumps(dict(query_id=f'q{i}', kind='math', question=f'{i} + {i}?', gold=str(2 * i))) + '\n'
                             for i in range(6)))
    cfg = tmp_path / 'collect.toml'
    cfg.write_text(f'rewriter = "m"\n[limits]\nbackoff_s = 0.05\n[models.m]\nbase_url = "{base_url}"\nremote_name = "fixed"\n'
                   'concurrency = 1\nprice_in = 0.1\nprice_out = 0.2\n'
                   '[collection]\nstore = "store.sqlite"\noutput = "obs.parquet"\nn_rewrites = 1\nn_decodes = 4\n'
                   'test_rewrites = 1\ntest_decodes = 4\nrewrite_attempts = 1\nsimilarity = "tfidf"\n'
                   '[[datasets]]\npath = "tasks.jsonl"\ntrain = 4\ntest = 2\n')
    return cfg


def _observations(db: Path) -> int:
    try:
        with sqlite3.connect(f'{db.resolve().as_uri()}?mode=ro', uri=True) as c:
            return c.execute('SELECT COUNT(*) FROM observations').fetchone()[0]
    except sqlite3.Error: return 0


def test_status_reports_a_collection_stopped_with_ctrl_c(tmp_path, cache_env):
    from dars_nb.testing import FixedEndpoint
    with FixedEndpoint('Final Answer: 2', delay_s=0.2) as up:
        cfg = _collect_config(tmp_path, up.base_url)
        proc = subprocess.Popen(DARS + ['collect', str(cfg), '--quiet'], cwd=tmp_path, env=cache_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while _observations(tmp_path / 'store.sqlite') < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err)
    assert 'interrupted' in err
    res = run('status', str(tmp_path / 'store.sqlite'), env=cache_env)
    assert res.returncode == 0, res
    last = [l for l in res.stdout.splitlines() if l.startswith('last run:')]
    assert len(last) == 1 and last[0].startswith('last run: interrupted (started '), res.stdout
    assert last[0].endswith('resume with the same command'), last
