"""Running a notebook the way the tests run it, for the docs: nbdev's processors, every tested cell executed,
the first failure kept as one line naming the notebook, the cell, the line and what failed."""
from __future__ import annotations
import atexit, faulthandler, os, re, sys, threading, traceback
from pathlib import Path
from execnb.shell import CaptureShell
from fastcore.nbio import read_nb
from fastcore.xtras import working_directory
from nbdev.config import nbpath2html
from nbdev.frontmatter import nb_frontmatter
from nbdev.process import NBProcessor, Processor
from nbdev.processors import FilterDefaults, add_show_docs, exec_show_docs
from dars_nb.testing import forced_test_flags

ROOT = Path(__file__).resolve().parents[1]   # the project folder: `tools` is importable from it
IMPORT_SELF = f"import sys; sys.path.insert(0, {str(ROOT)!r}); "   # how a child process imports `tools`


class DocsError(RuntimeError):
    "The docs or README build failed (a notebook cell raised, or the renderer reported a problem)."
    def __init__(self, msg: str, # one line saying what failed
                 problems=(), # one line per broken page or renderer problem
                ):
        super().__init__(msg); self.problems = list(problems)

def doc_notebooks(nbs_path: Path, # the notebooks folder
                 ) -> list[Path]:
    "Notebooks under `nbs_path` that become pages, sorted, skipping names that start with '.' or '_'."
    nbs_path = Path(nbs_path)
    return sorted(p for p in nbs_path.rglob('*.ipynb')
                  if not any(part.startswith(('.', '_')) for part in p.relative_to(nbs_path).parts))

def page_path(nb_rel: Path, # notebook path relative to the notebooks folder
             ) -> Path:
    "Markdown page of a notebook: nbdev's html name (numeric prefix dropped) with a .md suffix."
    return nbpath2html(Path(nb_rel)).with_suffix('.md')

def joined(text) -> str:
    "Notebook text, stored as a string or a list of lines, as one string."
    return ''.join(text) if isinstance(text, list) else text


# What failed, in one line
def _abbrev(x, width: int = 60) -> str:
    "`repr(x)` on one line, cut to `width` characters."
    s = ' '.join(repr(x).split())
    return s if len(s) <= width else s[:width - 1] + '…'

def _tracebacks(e: BaseException) -> list:
    "The traceback entries of `e`, outermost first."
    tb, out = e.__traceback__, []
    while tb is not None: out.append(tb); tb = tb.tb_next
    return out

_CELL_FILE = '<ipython-input-'   # how IPython names the code of a cell it runs

def failing_line(e: BaseException, # the exception a cell raised
                 source: str, # the cell's source, as it was run
                ) -> tuple[int | None, str]:
    "(line number, stripped text) of the cell line `e` comes from; (None, '') when the traceback does not say."
    if isinstance(e, SyntaxError) and str(e.filename or '').startswith(_CELL_FILE): n = e.lineno
    else:
        mine = [tb for tb in _tracebacks(e) if tb.tb_frame.f_code.co_filename.startswith(_CELL_FILE)]
        mine = [tb for tb in mine if tb.tb_frame.f_code.co_filename == mine[0].tb_frame.f_code.co_filename] if mine else []
        n = mine[-1].tb_lineno if mine else None
    lines = source.splitlines()
    return (n, lines[n - 1].strip()) if n and 0 < n <= len(lines) else (None, '')

def _largest_difference(a, b) -> float | None:
    "max |a - b| over two numbers or equal-shaped arrays of numbers; None when they do not subtract."
    import numpy as np
    try: d = np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    except (TypeError, ValueError): return None
    return float(np.max(d)) if d.size else 0.0

def assertion_message(e: BaseException, # the exception a cell raised
                     ) -> str:
    "What failed, in one line: fastcore's checks with what they compared, else the exception's type and first line."
    for tb in _tracebacks(e):
        f = tb.tb_frame
        if Path(f.f_code.co_filename).parts[-2:] != ('fastcore', 'test.py'): continue
        name, loc = f.f_code.co_name, f.f_locals
        if name == 'test_close':
            d = _largest_difference(loc['a'], loc['b'])
            if d is not None: return f"test_close: largest difference {d:.4g} > eps {loc['eps']:g}"
            return f"test_close: {_abbrev(loc['a'])} not within eps {loc['eps']:g} of {_abbrev(loc['b'])}"
        if {'a', 'b'} <= loc.keys(): return f"{name}: {_abbrev(loc['a'])} vs {_abbrev(loc['b'])}"
    first = next(iter(str(e).strip().splitlines()), '')
    return f"{type(e).__name__}: {' '.join(first.split())[:200]}".rstrip(': ')

def failure_text(failure: dict, # {'notebook', 'cell', 'line', 'code', 'message'} of a failed cell
                ) -> str:
    "One line naming the notebook, the cell, the line and what failed."
    where = f"cell {failure['cell']}" if failure.get('cell') is not None else 'an added show_doc cell'
    if failure.get('line'): where += f", line {failure['line']}"
    code = f" `{failure['code'][:80]}`" if failure.get('code') else ''
    return f"{failure['notebook']}: {where}{code}: {failure['message']}"


# Which cells run, and running them
EXPORT_CALL = 'nbdev_export' + '('   # spelled in two parts so that this cell is not itself skipped
SVG_CHARTS = "try:\n    import altair as _alt; _alt.renderers.enable('svg'); del _alt\nexcept ImportError: pass"

def runs_in_tests(cell, # a notebook cell (directives parsed by `NBProcessor` into `directives_`)
                  skip_flags=(), # flags whose cells are skipped
                  default_eval: bool = True, # whether cells without an `eval` directive run
                 ) -> bool:
    "Would `nbdev-test` run `cell` with these skip flags?"
    if cell.cell_type != 'code' or not cell.source.strip() or EXPORT_CALL in cell.source: return False
    if 'skip-execution' in cell.get('metadata', {}).get('tags', []): return False
    d = getattr(cell, 'directives_', None) or {}
    ev = d.get('eval')
    if ev in ('false', 'False') or (ev is None and not default_eval): return False
    return not (set(skip_flags) & d.keys())

HARD_GRACE_S = 30   # after a cell's time limit: every thread's stack, then the end of the process

def _watchdog(timeout: int | None):
    """A C thread that, `HARD_GRACE_S` after a cell's limit, writes every thread's stack and ends the process: the one
    way out of a hang in native code that holds the interpreter lock. Under the test suite, its own watchdog does this."""
    if timeout and not os.environ.get('DARS_TEST_RUN_DIR'):
        faulthandler.dump_traceback_later(timeout + HARD_GRACE_S, exit=True)

def thread_stacks() -> str:
    "Every thread's Python stack, innermost call last."
    names = {t.ident: t.name for t in threading.enumerate()}
    return '\n'.join(f'Thread {names.get(i, i)}:\n' + ''.join(traceback.format_stack(f))
                     for i, f in sys._current_frames().items())

def release_shell(shell: CaptureShell,
                  main=None, # the `__main__` module the shell replaced on creation, put back (None: left as it is)
                 ):
    """Let a shell that has run its notebook go now. IPython keeps every shell, and all its notebook made, until the
    process exits, and then resets each one, a full garbage collection apiece over everything still kept: in a process
    that renders many notebooks that exit took longer than rendering half of them."""
    atexit.unregister(shell.atexit_operations)
    shell.reset(new_session=False)
    shell.close()
    if not shell.loop.is_running(): shell.loop.close()
    # the shell's namespace, emptied, as `__main__` (no `__spec__`) would break `multiprocessing`'s spawn in this process
    if main is not None and sys.modules.get('__main__') is shell.user_module: sys.modules['__main__'] = main

class ReleasesShell:
    "A processor that makes its shell `self.k` in `begin`: the `__main__` it replaces is noted first, and both put right at `end`."
    def begin(self):
        self.main = sys.modules.get('__main__')
        if (begin := getattr(super(), 'begin', None)): begin()

    def end(self):
        if (end := getattr(super(), 'end', None)): end()
        if hasattr(self, 'k'): release_shell(self.k, self.main)


class ExecCells(ReleasesShell, Processor):
    "Run the cells `nbdev-test` runs in one `CaptureShell`, keeping outputs; the first failure stops the run and is kept as `nb.failure_`."
    def __init__(self, nb, # the notebook being processed
                 skip_flags=(), # flags whose cells are not run
                 timeout: int | None = None, # seconds per cell
                ):
        super().__init__(nb)
        fm = nb_frontmatter(nb)
        self.failure = None
        self.flags, self.timeout = set(skip_flags), timeout
        self.off = str(fm.get('skip_exec', '')).lower() == 'true'
        self.default_eval = str(fm.get('eval', 'true')).lower() != 'false'

    def begin(self):
        super().begin()
        self.k = CaptureShell(getattr(self.nb, 'path_', None))
        self.k.run_cell('from nbdev.showdoc import show_doc')
        self.k.run_cell(SVG_CHARTS)

    def __call__(self, cell):
        if self.failure or self.off or not runs_in_tests(cell, self.flags, self.default_eval): return
        _watchdog(self.timeout)
        try: self.k.cell(cell, timeout=self.timeout)
        finally:
            if not os.environ.get('DARS_TEST_RUN_DIR'): faulthandler.cancel_dump_traceback_later()
        if self.k.exc is not None:                     # the first failure is kept; later cells do not run
            e = self.k.exc
            if isinstance(e, TimeoutError):            # where each thread was when the cell ran out of time
                print(f"{getattr(self.nb, 'path_', 'notebook')}: a cell ran out of time; every thread:\n{thread_stacks()}",
                      file=sys.__stderr__, flush=True)   # the cell still running holds sys.stderr
            line, code = failing_line(e, cell.source)
            self.failure = self.nb.failure_ = dict(notebook=Path(getattr(self.nb, 'path_', 'notebook')).name,
                                                   cell=cell.get('src_idx_'), line=line, code=code,
                                                   message=assertion_message(e))


class ExecShowDocs(ReleasesShell, exec_show_docs):
    "nbdev's `exec_show_docs` (the cells `show_doc` needs: exported ones and those with an import), its shell let go at the end."


_re_show_doc = re.compile(r'^show_doc\(\s*([\w.]+)\s*[,)]', re.M)

class AddShowDocs(add_show_docs):
    """nbdev's `add_show_docs`, without a second entry for a name the notebook documents itself.

    nbdev compares a definition's bare name with the names of the notebook's own `show_doc` calls, so a
    `@patch`-ed method (`def insert(self: Store)`, documented by `show_doc(Store.insert)`) gets its
    `show_doc` added again: the page shows it twice, under the same heading id."""
    def begin(self):
        super().begin()
        own = {m.group(1) for c in self.nb.cells if c.cell_type == 'code' and not getattr(c, 'has_sd', False)
               for m in _re_show_doc.finditer(c.source)}
        for c in self.nb.cells:
            if getattr(c, 'has_sd', False) and c.source[len('show_doc('):-1] in own: c.source = None   # dropped by nbdev


class DocFilter(FilterDefaults):
    "nbdev's docs processors, executing every cell the tests run instead of only the `show_doc` ones."
    def __init__(self, execute: bool = True, # run the cells the tests run (else keep saved outputs)
                 skip_flags=(), # flags whose cells are not run
                 timeout: int | None = None, # seconds per cell
                ):
        self.execute, self.skip_flags, self.timeout = execute, tuple(skip_flags), timeout

    def nb_proc(self, nb):
        procs = [AddShowDocs if p is add_show_docs else p for p in self.procs()]
        run = (lambda nb: ExecCells(nb, self.skip_flags, self.timeout)) if self.execute else ExecShowDocs
        procs = [run(nb) if p is exec_show_docs else p for p in procs]
        return NBProcessor(nb=nb, procs=procs, rm_directives='quarto')

def project_skip_flags(cfg, force=None) -> list:
    "`tst_flags` of the project less the forced ones (`DARS_TEST_FLAGS`, as in the test suite)."
    force = forced_test_flags(force)
    return [f for f in str(cfg.get('tst_flags', '')).split() if f not in force]

def processed_notebook(nb_path: Path, # the notebook
                       execute: bool = True, # run the cells the tests run (else keep saved outputs)
                       skip_flags=('notest', 'slow'), # flags whose cells are not run
                       timeout: int | None = 600, # seconds per cell
                      ):
    "`nb_path` through nbdev's docs processors, run in its own folder; a failed cell is described in `nb.failure_`."
    nb = read_nb(nb_path)
    nb.failure_ = None
    for i, c in enumerate(nb.cells): c['src_idx_'] = i     # the cell number an error message names
    prev = os.environ.get('IN_TEST')
    os.environ['IN_TEST'] = '1'
    try:
        with working_directory(Path(nb_path).parent): DocFilter(execute, skip_flags, timeout)(nb)
    finally:
        if prev is None: os.environ.pop('IN_TEST', None)
        else: os.environ['IN_TEST'] = prev
    return nb
