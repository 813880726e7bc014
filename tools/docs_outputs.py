"""Static outputs kept in the home page and tutorial notebooks, so that a code host shows them: charts as SVG,
tables as script-free HTML, text; run as the tests run them, with the `slow` cells forced on."""
from __future__ import annotations
import json, time
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
    "The home page notebook and the tutorials."
    return [cfg.nbs_path/cfg.readme_nb] + sorted((cfg.nbs_path/'tutorials').glob('*.ipynb'))

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

def save_outputs(paths=None, # notebooks to run (default: the home page notebook and tutorials/*.ipynb)
                 force_flags: str = 'slow', # test flags whose cells run anyway
                 root: str | Path | None = None, # project folder (default: found from the working directory)
                 timeout: int | None = None, # seconds per cell (default: the project's `cell_timeout`, else 600)
                 quiet: bool = False, # no progress lines
                ) -> list[Path]:
    "Run each notebook in its own folder and store its static outputs in it, cleaned by nbdev-clean; return the paths."
    cfg = get_config(Path(root) if root else None)
    paths = [Path(p).resolve() for p in (paths if paths is not None else _default_output_notebooks(cfg))]
    if missing := [str(p) for p in paths if not p.exists()]: raise ValueError(f"no notebook at {missing[0]}")
    flags, timeout = project_skip_flags(cfg, force_flags), timeout or cfg.get('cell_timeout', 600)
    for p in paths:
        t = time.time()
        _save_one(p, flags, timeout, cfg.config_path)
        if not quiet: print(f"  {p.relative_to(cfg.config_path)}: outputs saved ({time.time() - t:.0f}s)", flush=True)
    return paths
