"The `dars` console command, run the way a user runs it: a subprocess, exit codes, no tracebacks."
import subprocess, sys
from pathlib import Path

import pytest

from dars_nb.cli import COMMANDS

DARS = [str(Path(sys.executable).with_name('dars'))]


def run(*args, timeout=600, cmd=DARS):
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(res, command, code=1):
    assert res.returncode == code, (res.returncode, res.stderr)
    assert 'Traceback' not in res.stderr
    assert res.stderr.strip().count('\n') == 0, res.stderr
    assert res.stderr.startswith(f'dars {command}: error: '), res.stderr


def test_help_lists_every_command():
    "The installed `dars` script lists every subcommand (each one's `--help` is checked in nbs/90_cli.ipynb)."
    res = run('--help')
    assert res.returncode == 0
    for cmd in COMMANDS: assert f'\n    {cmd} ' in res.stdout or f'\n    {cmd}\n' in res.stdout, cmd
    assert {'reproduce', 'collect', 'diagnose', 'train', 'route', 'serve', 'local'} <= set(COMMANDS)


def test_version_and_python_m():
    from dars_nb import __version__
    for cmd in (DARS, [sys.executable, '-m', 'dars_nb']):
        res = run('--version', cmd=cmd)
        assert res.returncode == 0 and res.stdout.strip() == f'dars {__version__}'


@pytest.mark.parametrize('args', [[], ['no-such-command'], ['reproduce'], ['diagnose'], ['route', 'r.dars', '--lam', 'high'],
                                  ['serve', '--router', 'r.dars'], ['local', '--port', 'eighty']])
def test_usage_error_exits_2(args):
    res = run(*args)
    assert res.returncode == 2, res
    assert 'usage: dars' in res.stderr and 'Traceback' not in res.stderr


@pytest.mark.parametrize('content,problem', [
    (None, 'no observation file'),
    ('{"dataset": "d", "score": 1}\n', 'missing column(s)'),
    ('not json at all\n', 'cannot read'),
])
def test_bad_observation_file_is_one_line_and_exit_1(tmp_path, content, problem):
    path = tmp_path / 'obs.jsonl'
    if content is not None: path.write_text(content)
    res = run('diagnose', str(path))
    assert_one_line_error(res, 'diagnose')
    assert problem in res.stderr


def test_reproduce_bad_file_exit_1(tmp_path):
    res = run('reproduce', '--out', str(tmp_path / 'r'), '--data', str(tmp_path / 'missing.jsonl'))
    assert_one_line_error(res, 'reproduce')
    assert 'no observation file' in res.stderr


@pytest.mark.parametrize('args', [
    ['train', 'missing.toml', '--out', 'r.dars'],
    ['route', 'missing.dars', 'What is 2 + 2?'],
    ['collect', 'missing.toml', '--dry-run'],
])
def test_missing_input_file_is_one_line_and_exit_1(tmp_path, args):
    res = subprocess.run(DARS + args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert_one_line_error(res, args[0])


def test_diagnose_a_real_file(tmp_path):
    from dars_nb.simulate import simulate
    obs, _, _ = simulate('math_like', n_train=40, n_test=10, seed=1)
    path = tmp_path / 'obs.parquet'
    obs.to_parquet(path)
    res = run('diagnose', str(path), '--out', str(tmp_path / 'diag'))
    assert res.returncode == 0, res.stderr
    assert '| dataset |' in res.stdout and 'winner_flip_rate' in res.stdout and 'written:' in res.stdout
    quiet = run('diagnose', str(path), '--out', str(tmp_path / 'diag2'), '--quiet')
    assert quiet.returncode == 0 and 'written:' not in quiet.stdout and '| dataset |' in quiet.stdout
    assert (tmp_path / 'diag2' / 'instability.svg').exists()


@pytest.mark.xdist_group('quick_report')
def test_reproduce_quiet_shows_no_progress_bar(quick_report):
    "The console script's `reproduce --quick --quiet` (its report is checked in tests/test_reproduce.py)."
    _, res = quick_report
    assert res.returncode == 0, res.stderr[-2000:]
    assert '%|' not in res.stderr    # no progress bar: stderr is not a terminal, and --quiet
