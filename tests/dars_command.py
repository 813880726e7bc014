"The installed `dars` script run as a user runs it (a subprocess), and what a one-line refusal of it looks like."
import subprocess
import sys
from pathlib import Path

DARS_SCRIPT = str(Path(sys.executable).with_name('dars'))   # beside the interpreter that runs the tests
DARS = [DARS_SCRIPT]


def run(*args, timeout=600, cmd=DARS, cwd=None, env=None) -> subprocess.CompletedProcess:
    "`dars ARGS...` (or `cmd ARGS...`) to its end, its output captured as text."
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def assert_one_line_error(res: subprocess.CompletedProcess, command: str, code: int = 1):
    "`res` failed with `code` and one line on stderr, `dars COMMAND: error: ...`, and no traceback."
    assert res.returncode == code, (res.returncode, res.stderr)
    assert 'Traceback' not in res.stderr
    assert res.stderr.strip().count('\n') == 0, res.stderr
    assert res.stderr.startswith(f'dars {command}: error: '), res.stderr
