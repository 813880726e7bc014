"The `dars` console command, run the way a user runs it: a subprocess, exit codes, no tracebacks."
import subprocess, sys, json
from pathlib import Path

import pandas as pd
import pytest

DARS = [str(Path(sys.executable).with_name('dars'))]


def run(*args, timeout=600):
    return subprocess.run(DARS + list(args), capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_command():
    out = run('--help').stdout
    for cmd in ('reproduce', 'collect', 'diagnose', 'docs'): assert cmd in out


@pytest.mark.parametrize('content,problem', [
    (None, 'no observation file'),
    ('{"dataset": "d", "score": 1}\n', 'missing column(s)'),
    ('not json at all\n', 'cannot read'),
])
def test_bad_observation_file_is_one_line_and_nonzero(tmp_path, content, problem):
    path = tmp_path / 'obs.jsonl'
    if content is not None: path.write_text(content)
    for cmd in (['diagnose', str(path)], ['reproduce', '--out', str(tmp_path / 'r'), '--data', str(path)]):
        res = run(*cmd)
        assert res.returncode != 0
        assert 'Traceback' not in res.stderr
        assert res.stderr.strip().count('\n') == 0, res.stderr
        assert problem in res.stderr


def test_diagnose_a_real_file(tmp_path):
    from dars_nb.simulate import simulate
    obs, _, _ = simulate('math_like', n_train=40, n_test=10, seed=1)
    path = tmp_path / 'obs.parquet'
    obs.to_parquet(path)
    res = run('diagnose', str(path), '--out', str(tmp_path / 'diag'))
    assert res.returncode == 0, res.stderr
    assert 'winner_flip_rate' in res.stdout or 'Winner flip' in res.stdout


def test_reproduce_quick_end_to_end(tmp_path):
    out = tmp_path / 'report'
    res = run('reproduce', '--out', str(out), '--quick')
    assert res.returncode == 0, res.stderr[-2000:]
    report = (out / 'report.md').read_text()
    from dars_nb.routers import ROUTER_CLASSES
    for router in ROUTER_CLASSES: assert router in report, router
    assert list(out.glob('*.png')) and list(out.glob('*.svg')) and list(out.glob('*.csv'))
