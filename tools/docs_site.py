"""The offline site: every notebook's page rendered (in parallel worker processes), then one mkdocs build with
the material theme, offline search, no web fonts, MathML, and a stylesheet that keeps code and charts in the column."""
from __future__ import annotations
import logging, os, re, shutil, sys, tempfile, time
from pathlib import Path
import yaml
from nbdev.config import get_config
from tools.docs_notebooks import DocsError, IMPORT_SELF, doc_notebooks, page_path, project_skip_flags
from tools.docs_pages import RESULTS, RESULTS_PAGE, error_box, notebook_page, resolve_doc_links
from tools.docs_readme import README_ASSETS

SITE_CSS = """
.md-typeset .subtitle { font-size: 1.15em; color: var(--md-default-fg-color--light); margin-top: -0.6em; }
.md-typeset .chart-output { margin: 0.5em 0 1.2em; overflow-x: auto; }
.md-typeset .chart-output svg { max-width: 100%; height: auto; }
.md-typeset .html-output { overflow-x: auto; font-size: 0.8em; }
.md-typeset .html-output table.dataframe { border-collapse: collapse; }
.md-typeset .html-output table.dataframe th, .md-typeset .html-output table.dataframe td { padding: 0.2em 0.6em; border-bottom: 1px solid var(--md-default-fg-color--lightest); text-align: right; }
.md-typeset math[display="block"] { margin: 0.8em 0; font-size: 1.1em; max-width: 100%; overflow-x: auto; overflow-y: hidden; }
.md-typeset td:first-child code { white-space: nowrap; }
.md-typeset pre > code { white-space: pre-wrap; overflow-wrap: anywhere; }
.md-typeset .language-text pre > code { white-space: pre; overflow-wrap: normal; overflow-x: auto; }
"""   # code wraps instead of scrolling sideways; printed text keeps its lines (a table its columns) and scrolls in its
# box; a chart shrinks to the column down to its legible minimum width, then scrolls in its box, as a wide formula does

_HOOKS = IMPORT_SELF + "from tools.docs_pages import math_to_mathml\n\ndef on_page_content(html, **kwargs):\n    return math_to_mathml(html)\n"

def _section(page: Path) -> str:
    if page == Path('index.md'): return 'Home'
    if page.parts[0] == 'tutorials': return 'Tutorials'
    return 'Library' if len(page.parts) == 1 else page.parts[0].replace('_', ' ').capitalize()

def mkdocs_config(pages: list, # [(title, page path)] in navigation order
                  site_name: str, # the site's name
                  description: str = '', # one line for the page metadata
                 ) -> dict:
    "mkdocs configuration: material theme with no web fonts, offline search, navigation by section."
    nav, sections = [], {}
    for title, page in pages:
        sec = _section(Path(page))
        if sec == 'Home': nav.insert(0, {'Home': Path(page).as_posix()}); continue
        if sec not in sections: sections[sec] = []; nav.append({sec: sections[sec]})
        sections[sec].append({title: Path(page).as_posix()})
    order = {'Home': 0, 'Tutorials': 1, 'How to': 2, 'Reference': 3, 'Library': 4}   # other sections after these
    nav.sort(key=lambda d: order.get(next(iter(d)), len(order)))
    return {
        'site_name': site_name, 'site_description': description, 'use_directory_urls': False,
        'theme': {'name': 'material', 'font': False, 'language': 'en',
                  'features': ['navigation.sections', 'navigation.top', 'navigation.footer', 'toc.follow',
                               'search.highlight', 'search.suggest', 'content.code.copy']},
        'plugins': ['search'],
        'markdown_extensions': ['tables', 'attr_list', 'md_in_html', 'admonition', 'def_list',
                                {'toc': {'permalink': True}}, {'pymdownx.highlight': {'use_pygments': True, 'pygments_lang_class': True}},
                                'pymdownx.superfences', {'pymdownx.arithmatex': {'generic': True}}],
        'extra_css': ['assets/dars.css'], 'hooks': ['hooks.py'], 'nav': nav,
        # anchors: a broken one fails the build, except links to dunder headings, whose ids (escaped for Markdown,
        # right in the HTML) mkdocs misses: `_Collect` passes those over, and tests/test_docs_site.py opens them
        'validation': {'omitted_files': 'warn', 'absolute_links': 'info', 'unrecognized_links': 'warn',
                       'anchors': 'warn'},
    }


# Rendering the pages
def _broken_page(nb_path: Path, nbs_path: Path, e: Exception) -> dict:
    "A page holding only the error box, for a notebook whose page could not be made at all."
    page = page_path(Path(nb_path).relative_to(nbs_path))
    error = f"{Path(nb_path).name}: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
    title = page.stem.replace('_', ' ').capitalize()
    box = error_box(error, 'This page did not build: the notebook could not be read or rendered')
    return dict(page=page, title=title, markdown=f"# {title}\n\n" + box, anchors=set(), doc_links={}, files={}, error=error)

def _timed_page(*args) -> dict:
    "`notebook_page(*args)` with the seconds it took; a notebook that cannot be made a page gives an error page."
    t = time.time()
    try: p = notebook_page(*args)
    except Exception as e: p = _broken_page(args[0], args[1], e)
    return p | {'seconds': time.time() - t}

def page_worker(folder: str, # the work folder: tasks.pkl in, one <i>.pkl per page out
               ):
    "Worker process: claim notebooks one at a time (an exclusive claim file each) and save each page."
    import pickle
    folder = Path(folder)
    tasks = pickle.loads((folder/'tasks.pkl').read_bytes())
    for i, a in enumerate(tasks):
        try: os.close(os.open(folder/f'{i}.claim', os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError: continue
        try: res = ('ok', _timed_page(*a))
        except Exception as e: res = ('error', str(e) if isinstance(e, DocsError) else f'{type(e).__name__}: {e}')
        (folder/f'{i}.part').write_bytes(pickle.dumps(res))
        (folder/f'{i}.part').rename(folder/f'{i}.pkl')
    if 'joblib' in sys.modules:   # stop the process pool a notebook's joblib call may have left, so nothing outlives the build
        from joblib.externals.loky import get_reusable_executor
        get_reusable_executor().shutdown(wait=True)

def _collect_pages(folder: Path, procs: list, args: list, report) -> dict:
    "Wait for the workers' pages, in any order; a DocsError when a worker fails or ends early."
    import pickle
    done = {}
    while len(done) < len(args):
        exited = all(p.poll() is not None for p in procs)
        for i in set(range(len(args))) - set(done):
            f = folder/f'{i}.pkl'
            if not f.exists(): continue
            status, val = pickle.loads(f.read_bytes())
            if status == 'error': raise DocsError(val)
            done[i] = report(args[i], val)
        if exited and len(done) < len(args): raise DocsError("a docs worker process ended without finishing its notebook")
        time.sleep(0.05)
    return done

def render_pages(args: list, # one tuple of `notebook_page` arguments per notebook
                 n_workers: int | None = None, # worker processes (default: up to 2, one per core); 1 renders here
                 quiet: bool = False, # no progress lines
                ) -> list[dict]:
    "Pages of several notebooks, in order; in parallel worker processes when there is more than one core."
    import pickle, subprocess
    n_workers = min(2, os.cpu_count() or 1, len(args)) if n_workers is None else min(n_workers, len(args))
    def report(a, p):
        if not quiet: print(f"  {Path(a[0]).relative_to(a[1])} -> {p['page'].with_suffix('.html')} ({p['seconds']:.1f}s)"
                            + (f"  FAILED: {p['error']}" if p.get('error') else ''), flush=True)
        return p
    if n_workers <= 1: return [report(a, _timed_page(*a)) for a in args]
    with tempfile.TemporaryDirectory(prefix='dars-pages-') as folder:
        (Path(folder)/'tasks.pkl').write_bytes(pickle.dumps(args))
        code = IMPORT_SELF + f"from tools.docs_site import page_worker; page_worker({folder!r})"
        threads = str(max(1, (os.cpu_count() or 1) // n_workers))   # the cores shared out, as joblib does for its workers
        env = os.environ | {v: os.environ.get(v, threads) for v in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS')}
        procs = [subprocess.Popen([sys.executable, '-c', code], env=env) for _ in range(n_workers)]
        ok = False
        try:
            done = _collect_pages(Path(folder), procs, args, report)
            ok = True
        finally:
            for p in procs:   # finished workers exit by themselves; a stuck or unneeded one is stopped
                try: p.wait(timeout=60 if ok else 0.1)
                except subprocess.TimeoutExpired: p.kill(); p.wait()
    return [done[i] for i in range(len(args))]


# The site
_DUNDER_ANCHOR = re.compile(r"contains a link '[^']*#[^']*__[^']*', but ")   # mkdocs' words for a missed anchor

class _Collect(logging.Handler):
    "Keep the warnings mkdocs logs during a build (not its misses of dunder headings' anchors, checked in the pages)."
    def __init__(self): super().__init__(logging.WARNING); self.records = []
    def emit(self, record):
        if not _DUNDER_ANCHOR.search(message := record.getMessage()): self.records.append(message)

def _safe_out(out: Path):
    "Refuse to empty a folder that is not a site (or empty)."
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out/'index.html').exists())):
        raise ValueError(f"refusing to overwrite {out}: not empty and not a built site")

def _write_pages(docs: Path, built: list):
    "Each page's Markdown (its links to other pages settled) and extracted files under `docs`."
    anchors = {p['page']: p['anchors'] for p in built}
    for p in built:
        dest = docs/p['page']
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(resolve_doc_links(p['markdown'], p['page'], anchors, p['doc_links']), encoding='utf-8')
        for f, data in p['files'].items():
            (docs/f).parent.mkdir(parents=True, exist_ok=True)
            (docs/f).write_bytes(data if isinstance(data, bytes) else str(data).encode())

def _mkdocs_build(tmp: Path, out: Path, conf: dict) -> list:
    "Build the site from `tmp/docs` into `out` with `conf`; the problems mkdocs logged."
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    (tmp/'docs'/'assets').mkdir(exist_ok=True)
    (tmp/'docs'/'assets'/'dars.css').write_text(SITE_CSS)
    (tmp/'hooks.py').write_text(_HOOKS)
    (tmp/'mkdocs.yml').write_text(yaml.safe_dump(conf, sort_keys=False, allow_unicode=True))
    handler, log = _Collect(), logging.getLogger('mkdocs')
    log.addHandler(handler)
    try: build(load_config(str(tmp/'mkdocs.yml'), site_dir=str(out)))
    finally: log.removeHandler(handler)
    return handler.records

def build_docs(out: str | Path = '_site', # folder for the site (created; replaced if it holds a site)
               execute: bool = True, # run the notebooks' cells (as the tests do) for their outputs
               root: str | Path | None = None, # project folder (default: found from the working directory)
               force_flags: str | None = None, # test flags to run anyway (default: `DARS_TEST_FLAGS`)
               quiet: bool = False, # no progress lines
               n_workers: int | None = None, # processes rendering notebooks (default: up to 2, one per core)
              ) -> Path:
    "Render every notebook into an offline HTML site; return `out`, or raise `DocsError` listing broken pages after building the rest."
    cfg = get_config(Path(root) if root else None)
    out = Path(out).resolve()
    _safe_out(out)
    nbs = doc_notebooks(cfg.nbs_path)
    if not nbs: raise ValueError(f"no notebooks under {cfg.nbs_path}")
    flags, t0 = project_skip_flags(cfg, force_flags), time.time()
    with tempfile.TemporaryDirectory(prefix='dars-docs-') as tmp:
        args = [(nb, cfg.nbs_path, execute, flags, cfg.doc_url, cfg.get('cell_timeout', 600)) for nb in nbs]
        built = render_pages(args, n_workers, quiet)
        if Path('index.md') not in {p['page'] for p in built}: raise ValueError(f"no index.ipynb in {cfg.nbs_path}")
        _write_pages(Path(tmp)/'docs', built)
        assets = cfg.config_path/README_ASSETS      # the README's images link here once a docs site is declared
        if assets.is_dir(): shutil.copytree(assets, Path(tmp)/'docs'/README_ASSETS)
        pages = [(p['title'], p['page']) for p in built]
        results = cfg.nbs_path/RESULTS                # the benchmark figures, which pages link to
        if results.exists():
            (Path(tmp)/'docs'/RESULTS_PAGE).write_text(results.read_text(encoding='utf-8'), encoding='utf-8')
            pages.append(('Benchmark figures', RESULTS_PAGE))
        conf = mkdocs_config(pages, str(cfg.get('title') or cfg.lib_name), str(cfg.get('description', '')))
        records = _mkdocs_build(Path(tmp), out, conf)
    broken = [f"{p['page'].with_suffix('.html').as_posix()}: {p['error']}" for p in built if p.get('error')]
    problems = broken + [f"mkdocs: {r}" for r in records]
    if problems:
        what = ([f"{len(broken)} of {len(built)} pages broken"] if broken else []) + \
               ([f"mkdocs reported {len(records)} problem(s)"] if records else [])
        raise DocsError(f"{', '.join(what)} (site written to {out}); first: {problems[0]}", problems)
    if not quiet: print(f"built {len(pages)} pages in {time.time() - t0:.0f}s", flush=True)
    return out

def docs_main(out: str = '_site', # folder for the site
              quiet: bool = False, # no progress lines and no closing note (errors are still printed)
             ) -> int:
    "Build the offline docs site into `out`; print where it is, or the broken pages and a one-line error. Exit code."
    try:
        site = build_docs(out, quiet=quiet)
    except Exception as e:
        for p in getattr(e, 'problems', []): print(f"  broken: {p}", file=sys.stderr)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ''
        print(f"docs: error: {type(e).__name__}: {msg}", file=sys.stderr)
        return 1
    if not quiet: print(f"docs: {site}/index.html  (search works when served: python -m http.server -d {out} 8000)")
    return 0
