"""Static outputs kept in every notebook, so that a code host shows them: charts as SVG, tables as script-free HTML,
text; run as the tests run them (the home page and the tutorials with their `slow` cells forced on). `compare_outputs`
is how the tests check that the kept outputs are the ones the code produces now."""
from __future__ import annotations
import json, math, re, socket, tempfile, time
from pathlib import Path
from fastcore.nbio import read_nb
from fastcore.xtras import working_directory
from nbdev.config import get_config
from nbdev.process import NBProcessor
from tools.docs_notebooks import DocsError, ExecCells, failure_text, joined, project_skip_flags

STATIC_TYPES = ('image/svg+xml', 'image/png', 'text/plain', 'text/html', 'text/markdown')   # what a code host can show

def _static_html(text: str) -> bool:
    "An HTML output worth keeping: a table, without any script."
    low = text.lower()
    return '<table' in low and '<script' not in low and 'javascript:' not in low

def static_outputs(outputs: list, # a code cell's outputs (nbformat dicts)
                  ) -> list:
    "`outputs` with only static displays: allowed types kept (HTML only as a script-free table), empty displays dropped."
    kept = []
    for o in outputs:
        if o.get('output_type') not in ('display_data', 'execute_result'): kept.append(o); continue
        data = {k: v for k, v in o.get('data', {}).items()
                if k in STATIC_TYPES and (k != 'text/html' or _static_html(joined(v)))}
        if not data: continue
        meta = {k: v for k, v in (o.get('metadata') or {}).items() if k in data}
        kept.append(dict(o, data=data, metadata=meta))
    return kept

def _default_output_notebooks(cfg) -> list[Path]:
    "Every notebook that becomes a page: the library's, the home page, the tutorials and the reference and how-to pages."
    from tools.docs_notebooks import doc_notebooks
    return doc_notebooks(cfg.nbs_path)

def forced_flags(path: Path, # a notebook
                 nbs_path: Path, # the notebooks folder
                 force: str = 'slow', # flags forced on outside the library notebooks
                ) -> str:
    """The test flags forced on when saving `path`'s outputs: none for a library notebook (its saved outputs are the ones
    `make test` checks), `force` for the home page and the pages (their slow cells show real runs)."""
    library = Path(path).parent == Path(nbs_path) and Path(path).name[:1].isdigit()
    return '' if library else force

def _save_one(p: Path, flags: list, timeout: int, root: Path):
    "Run notebook `p` in its folder and store its static outputs in it, cleaned by nbdev-clean; DocsError on a failed cell."
    from nbdev.clean import nbdev_clean
    nb = read_nb(p)
    nb.failure_ = None
    for i, c in enumerate(nb.cells): c['src_idx_'] = i
    with working_directory(p.parent): NBProcessor(nb=nb, procs=[ExecCells(nb, flags, timeout)], rm_directives=False).process()
    if nb.failure_: raise DocsError(failure_text(nb.failure_))
    raw = json.loads(p.read_text(encoding='utf-8'))
    for cell, ran in zip(raw['cells'], nb.cells, strict=True):
        if cell['cell_type'] == 'code': cell['outputs'] = static_outputs([dict(o) for o in ran.get('outputs', [])])
    p.write_text(json.dumps(raw, indent=1, ensure_ascii=False) + '\n', encoding='utf-8')
    with working_directory(root): nbdev_clean(fname=str(p))

def save_outputs(paths=None, # notebooks to run (default: every notebook that becomes a page)
                 force_flags: str = 'slow', # test flags whose cells run anyway, outside the library notebooks
                 root: str | Path | None = None, # project folder (default: found from the working directory)
                 timeout: int | None = None, # seconds per cell (default: the project's `cell_timeout`, else 600)
                 quiet: bool = False, # no progress lines
                ) -> list[Path]:
    "Run each notebook in its own folder and store its static outputs in it, cleaned by nbdev-clean; return the paths."
    cfg = get_config(Path(root) if root else None)
    paths = [Path(p).resolve() for p in (paths if paths is not None else _default_output_notebooks(cfg))]
    if missing := [str(p) for p in paths if not p.exists()]: raise ValueError(f"no notebook at {missing[0]}")
    timeout = timeout or cfg.get('cell_timeout', 600)
    for p in paths:
        t = time.time()
        flags = project_skip_flags(cfg, forced_flags(p, Path(cfg.nbs_path).resolve(), force_flags))
        _save_one(p, flags, timeout, cfg.config_path)
        if not quiet: print(f"  {p.relative_to(cfg.config_path)}: outputs saved ({time.time() - t:.0f}s)", flush=True)
    return paths


# Are the kept outputs the ones the code produces now?
VARIES = 'varies'   # a cell flagged `#| varies` (timings, a live server's port): only that it shows something is checked
_NUMBER = re.compile(r'[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?')
PROJECT = Path(__file__).resolve().parents[1]   # where this checkout lies: a path under it is shown relative to it
PROJECT_FOLDERS = ('bench', 'dars_nb', 'data', 'docs_assets', 'examples', 'nbs', 'tests', 'tools')   # a checkout's own
_TOP = '|'.join(PROJECT_FOLDERS)   # not what lies beside them, which a run may have made (report/, build/)
_MASKS = [(re.compile(re.escape(str(PROJECT)) + r'(?=/)'), '<project>'),   # this checkout, even one cloned under /tmp
          (re.compile(re.escape(tempfile.gettempdir()) + r'/[^\s\'"),\]]+'), '<temporary path>'),
          # a checkout's own folders under whatever path it was cloned to (the outputs may be saved in another)
          (re.compile(r'(?<![\w.<>])/(?:[\w.+-]+/)*?(?=(?:' + _TOP + r')/)'), '<project>/'),
          (re.compile(r' at 0x[0-9a-fA-F]{6,}'), ''),              # nbdev-clean drops an object's address from its repr
          (re.compile(r'0x[0-9a-fA-F]{6,}'), '<address>'),
          (re.compile(r'(127\.0\.0\.1|localhost|\[::1\]):\d+'), r'\1:<port>'),
          (re.compile(r'inproc://[\d.]+/\d+/\d+'), 'inproc://<address>'),
          (re.compile(r'\bpid \d+'), 'pid <pid>'),
          (re.compile(r'\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?'), '<time>'),
          (re.compile(r'\bon ' + re.escape(socket.gethostname()) + r'\b'), 'on <host>')]
RTOL, ATOL = 1e-6, 1e-9   # numbers printed in full may differ in their last digits between CPUs' kernels

def _shown(outputs: list) -> list:
    "What a reader sees of a cell's outputs: stdout text, and per display its text, or 'a picture' for an image."
    out = []
    for o in static_outputs([dict(o) for o in outputs]):
        kind = o.get('output_type')
        if kind == 'stream':
            if o.get('name') == 'stdout': out.append(joined(o.get('text', '')))
        elif kind in ('display_data', 'execute_result'):
            data = o.get('data', {})
            if any(k.startswith('image/') for k in data): out.append('<a picture>')
            elif 'text/markdown' in data: out.append(joined(data['text/markdown']))
            elif 'text/plain' in data: out.append(joined(data['text/plain']))
        elif kind == 'error': out.append(f"<error: {o.get('ename')}>")
    text = ''.join(out)
    for pattern, repl in _MASKS: text = pattern.sub(repl, text)
    return ' '.join(text.split())   # a line wrapped at another terminal width is the same text

def same_text(a: str, b: str) -> bool:
    "Equal up to the numbers in them, which may differ by `RTOL` (relative) or `ATOL`."
    if _NUMBER.sub('#', a) != _NUMBER.sub('#', b): return False
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b)):
        if x != y and not math.isclose(float(x), float(y), rel_tol=RTOL, abs_tol=ATOL): return False
    return True

def compare_outputs(saved: list, # the code cells as kept in the notebook (nbformat dicts)
                    ran: list, # the same cells as the tests ran them, with their outputs
                    ran_ids: set, # ids of the cells the tests ran (others are not compared)
                   ) -> list[str]:
    "One line per cell whose kept output differs from the output it has now."
    diffs = []
    for i, (keep, now) in enumerate(zip(saved, ran, strict=True)):
        if keep.get('id') not in ran_ids: continue
        first = ''.join(keep.get('source', '')).splitlines()[:1]
        a, b = _shown(keep.get('outputs', [])), _shown(now.get('outputs', []))
        if first and re.match(rf'#\|\s*{VARIES}\s*$', first[0]): ok = bool(a) == bool(b)
        else: ok = same_text(a, b)
        if not ok:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            at = max(at - 40, 0)
            diffs.append(f"code cell {i} ({keep.get('id')}): kept …{a[at:at + 120]!r}, now …{b[at:at + 120]!r}")
    return diffs
