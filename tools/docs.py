"""Build the offline documentation site and the README from the notebooks — no Quarto, no network.

Every notebook becomes a page of a static mkdocs site (navigation, offline search, charts as SVG, math
as MathML), `nbs/index.ipynb` becomes `README.md`, and the home page and tutorials keep static outputs.
A notebook is run the way the tests run it (nbdev's runner, honouring `tst_flags`); a failing cell
names the notebook, the failing line and the assertion, the other pages are still built, and the
build exits 1.

    python tools/docs.py --out _site        # the site (`make docs`)
    python tools/docs.py --readme           # README.md from nbs/index.ipynb (`make readme`)
    python tools/docs.py --outputs          # static outputs in index.ipynb and the tutorials (`make outputs`)

This is tooling of the project, not part of the library: it needs the `dev` extra (nbdev, execnb,
mkdocs-material, nbconvert, latex2mathml).
"""
from __future__ import annotations
import html, json, logging, os, re, shutil, sys, tempfile, time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
import yaml
from fastcore.nbio import read_nb
from fastcore.script import call_parse
from fastcore.xtras import working_directory
from execnb.shell import CaptureShell
from nbdev.config import get_config, nbpath2html
from nbdev.frontmatter import nb_frontmatter
from nbdev.process import NBProcessor, Processor
from nbdev.processors import FilterDefaults, exec_show_docs

ROOT = Path(__file__).resolve().parents[1]   # the project folder: `tools.docs` is importable from it
_IMPORT_SELF = f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
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


_EXPORT_CALL = 'nbdev_export' + '('   # spelled in two parts so that this cell is not itself skipped
def _joined(text) -> str:
    "Notebook text, stored as a string or a list of lines, as one string."
    return ''.join(text) if isinstance(text, list) else text

_SVG_CHARTS = "try:\n    import altair as _alt; _alt.renderers.enable('svg'); del _alt\nexcept ImportError: pass"

def runs_in_tests(cell, # a notebook cell (directives parsed by `NBProcessor` into `directives_`)
                  skip_flags=(), # flags whose cells are skipped
                  default_eval: bool = True, # whether cells without an `eval` directive run
                 ) -> bool:
    "Would `nbdev-test` run `cell` with these skip flags?"
    if cell.cell_type != 'code' or not cell.source.strip() or _EXPORT_CALL in cell.source: return False
    if 'skip-execution' in cell.get('metadata', {}).get('tags', []): return False
    d = getattr(cell, 'directives_', None) or {}
    ev = d.get('eval')
    if ev in ('false', 'False') or (ev is None and not default_eval): return False
    return not (set(skip_flags) & d.keys())

class ExecCells(Processor):
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
        self.k = CaptureShell(getattr(self.nb, 'path_', None))
        self.k.run_cell('from nbdev.showdoc import show_doc')
        self.k.run_cell(_SVG_CHARTS)

    def __call__(self, cell):
        if self.failure or self.off or not runs_in_tests(cell, self.flags, self.default_eval): return
        self.k.cell(cell, timeout=self.timeout)
        if self.k.exc is not None:                     # the first failure is kept; later cells do not run
            e = self.k.exc
            line, code = failing_line(e, cell.source)
            self.failure = self.nb.failure_ = dict(notebook=Path(getattr(self.nb, 'path_', 'notebook')).name,
                                                   cell=cell.get('src_idx_'), line=line, code=code,
                                                   message=assertion_message(e))

    def end(self):
        self.k.close()
        if not self.k.loop.is_running(): self.k.loop.close()


class DocFilter(FilterDefaults):
    "nbdev's docs processors, executing every cell the tests run instead of only the `show_doc` ones."
    def __init__(self, execute: bool = True, # run the cells the tests run (else keep saved outputs)
                 skip_flags=(), # flags whose cells are not run
                 timeout: int | None = None, # seconds per cell
                ):
        self.execute, self.skip_flags, self.timeout = execute, tuple(skip_flags), timeout

    def nb_proc(self, nb):
        procs = list(self.procs())
        if self.execute: procs = [ExecCells(nb, self.skip_flags, self.timeout) if p is exec_show_docs else p for p in procs]
        return NBProcessor(nb=nb, procs=procs, rm_directives='quarto')

def _skip_flags(cfg, force=None):
    "`tst_flags` of the project less the forced ones (`DARS_TEST_FLAGS`, as in the test suite)."
    force = (os.environ.get('DARS_TEST_FLAGS', '') if force is None else force).split()
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


_re_opt = re.compile(r'^#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$')


def _cell_options(cell) -> dict:
    "Strip the leading `#| key: value` lines from a code cell, returning them."
    lines, opts = cell.source.splitlines(), {}
    while lines and (m := _re_opt.match(lines[0])):
        opts[m.group(1)] = m.group(2).strip('"\''); lines.pop(0)
    cell.source = '\n'.join(lines)
    return opts

def _svg_outputs(cell):
    "Give every Vega-Lite output an SVG drawing, and make each SVG embeddable inline."
    for o in cell.get('outputs', []):
        data = o.get('data', {})
        vl = next((k for k in data if k.startswith('application/vnd.vegalite')), None)
        if vl and 'image/svg+xml' not in data:
            import vl_convert as vlc
            data['image/svg+xml'] = vlc.vegalite_to_svg(data[vl])
        if vl: data.pop('text/html', None); data.pop(vl, None)
        if 'image/svg+xml' in data:
            svg = data['image/svg+xml']
            data['image/svg+xml'] = re.sub(r'^\s*<\?xml[^>]*>\s*', '', _joined(svg))

def markdown_ready(nb, # a notebook passed through `DocFilter`
                  ) -> list:
    "The cells of `nb` with Quarto options applied and charts drawn as SVG, front matter cell removed."
    cells = []
    for c in nb.cells:
        if c.cell_type == 'raw' and c.source.lstrip().startswith('---'): continue
        if c.cell_type == 'code':
            opts = _cell_options(c)
            if opts.get('include') == 'false': continue
            if opts.get('output') == 'false': c.outputs = []
            if opts.get('echo') == 'false' or not c.source.strip(): c.setdefault('metadata', {})['transient'] = {'remove_source': True}
            c.outputs = [o for o in c.get('outputs', []) if o.get('output_type') not in ('display_data', 'execute_result')
                         or o.get('data')]                      # an empty display has nothing to show
            if not c.source.strip() and not c.outputs: continue
            _svg_outputs(c)
        cells.append(c)
    return cells


_re_mdlink = re.compile(r'(?P<code>```.*?```|~~~.*?~~~|`[^`\n]+`)'             # code is left alone
                        r'|(?P<pre>\]\(\s*<?)(?P<url>[^)\s>]+)(?P<post>>?(?:\s+"[^"]*")?\s*\))', re.S)

def site_link(target: str, # a link target as written in a page
              page: Path, # the page the link sits on, relative to the site root (e.g. 'tutorials/why.md')
              doc_url: str = '', # the hosted docs address, whose links are made local
             ) -> str:
    "`target` as a relative link to a generated page when it points at a notebook or a page of this site."
    u = urlsplit(target)
    if doc_url and target.startswith(doc_url.rstrip('/') + '/'):
        root_rel = Path(urlsplit(target[len(doc_url.rstrip('/')) + 1:]).path)
    elif u.scheme or u.netloc or not u.path: return target
    else: root_rel = Path(os.path.normpath(Path(page).parent/u.path))
    if root_rel.suffix == '.ipynb': root_rel = page_path(root_rel)
    elif root_rel.suffix == '.html': root_rel = root_rel.with_suffix('.md')
    else: return target
    rel = os.path.relpath(root_rel, Path(page).parent).replace(os.sep, '/')
    return urlunsplit(('', '', rel, u.query, u.fragment))

def _relink(text: str, f) -> str:
    "Apply `f` to the target of every Markdown link in `text`, outside code."
    return _re_mdlink.sub(lambda m: m.group(0) if m.group('code') else m.group('pre') + f(m.group('url')) + m.group('post'), text)


_re_doc_heading = re.compile(r'^(#{2,4}) ([A-Za-z_][\w.]*)[ \t]*$', re.M)

def _anchor_headings(md: str) -> str:
    return _re_doc_heading.sub(lambda m: f'{m.group(1)} {m.group(2)} {{ #{m.group(2).lower()} }}', md)

_re_anchor = re.compile(r'\{ #([^\s}]+) \}')

def resolve_doc_links(md: str, # a page's Markdown
                      page: Path, # the page, relative to the site root
                      anchors: dict, # {page path: set of its `show_doc` anchors}, for every page of the site
                      doc_links: dict, # {local link target: hosted address} of the links nbdev made on this page
                     ) -> str:
    "Settle the links nbdev made: entry, else class entry, else page top; hosted address when the page is not in the site."
    def fix(target):
        if target not in doc_links: return target
        u = urlsplit(target)
        have = anchors.get(Path(os.path.normpath(Path(page).parent/u.path)))
        if have is None: return doc_links[target]
        if not u.fragment or u.fragment in have: return target
        owner = u.fragment.rsplit('.', 1)[0]
        return urlunsplit(('', '', u.path, u.query, owner if owner in have else ''))
    return _relink(md, fix)


_CODE_INPUT = r"""{% extends 'markdown/index.md.j2' %}
{% block input %}
```python
{{ cell.source }}
```
{% endblock input %}
"""   # both templates: code cells as fenced Python

_SITE_TEMPLATE = _CODE_INPUT + r"""{% block data_svg %}

<div class="chart-output">
{{ output.data['image/svg+xml'] }}
</div>

{% endblock data_svg %}
{% block data_html scoped %}

<div class="html-output">
{{ output.data['text/html'] }}
</div>

{% endblock data_html %}
"""

_README_NO_IMAGE = "*(This cell draws a chart: run the notebook, or see the home page of the documentation site.)*"

_README_TEMPLATE = _CODE_INPUT + r"""{% block data_svg %}
""" + _README_NO_IMAGE + r"""
{% endblock data_svg %}
{% block data_png %}
""" + _README_NO_IMAGE + r"""
{% endblock data_png %}
{% block data_html scoped %}

{{ output.data['text/html'] }}

{% endblock data_html %}
"""

def _plain_output(o) -> dict:
    "Output `o` with its text joined into strings, as nbconvert's templates expect."
    o = dict(o)
    if 'text' in o: o['text'] = _joined(o['text'])
    if 'data' in o: o['data'] = {k: _joined(v) for k, v in o['data'].items()}
    return o

def _plain_cell(c) -> dict:
    "`c` as a plain nbformat cell: nbdev's working attributes and execution timings dropped."
    meta = {k: v for k, v in (c.get('metadata') or {}).items() if k in ('transient', 'tags')}
    cell = dict(cell_type=c.cell_type, source=c.source, metadata=meta)
    if c.cell_type == 'code': cell.update(outputs=[_plain_output(o) for o in c.get('outputs', [])],
                                          execution_count=c.get('execution_count'))
    if c.get('attachments'): cell['attachments'] = c['attachments']
    return cell

def to_markdown(cells: list, # cells from `markdown_ready`
                key: str, # file-name stem for extracted images
                files_dir: str, # folder (relative to the page) for extracted images
                readme: bool = False, # README flavour: no image at all (a package index shows no file beside it)
               ) -> tuple[str, dict]:
    "Markdown text of `cells` and the extracted files {relative path: bytes}."
    from jinja2 import DictLoader
    from nbconvert import MarkdownExporter
    from nbformat import from_dict
    from traitlets.config import Config
    types = set() if readme else {'image/png', 'image/jpeg'}
    c = Config({'ExtractOutputPreprocessor': {'enabled': True, 'extract_output_types': types}})
    name = 'readme.md.j2' if readme else 'site.md.j2'
    ex = MarkdownExporter(config=c, template_file=name,
                          extra_loaders=[DictLoader({name: _README_TEMPLATE if readme else _SITE_TEMPLATE})])
    nb = from_dict({'cells': [_plain_cell(c) for c in cells], 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 4})
    body, res = ex.from_notebook_node(nb, resources={'unique_key': key, 'output_files_dir': files_dir})
    return re.sub(r'\n{3,}', '\n\n', body).strip() + '\n', res.get('outputs', {})


def error_box(error: str, # what failed, one line
              title: str = 'This page did not build: a cell failed and the cells after it were not run', # the box's heading
             ) -> str:
    "An HTML failure box for the top of a page (HTML, so that the message is shown as written)."
    return (f'<div class="admonition failure build-error">\n<p class="admonition-title">{html.escape(title)}</p>\n'
            f'<p><code>{html.escape(error)}</code></p>\n</div>\n\n')

def notebook_page(nb_path: Path, # the notebook
                  nbs_path: Path, # the notebooks folder (pages keep the folder structure under it)
                  execute: bool = True, # run the cells the tests run
                  skip_flags=('notest', 'slow'), # flags whose cells are not run
                  doc_url: str = '', # hosted docs address; links to it become local
                  timeout: int | None = 600, # seconds per cell
                 ) -> dict:
    "The Markdown page of one notebook: {'page', 'title', 'markdown', 'anchors', 'doc_links', 'files', 'error'}."
    page = page_path(Path(nb_path).relative_to(nbs_path))
    nb = processed_notebook(nb_path, execute, skip_flags, timeout)
    cells, doc_links = markdown_ready(nb), {}
    def local(target):
        new = site_link(target, page, doc_url)
        if doc_url and new != target and target.startswith(doc_url): doc_links[new] = target
        return new
    for c in cells:
        if c.cell_type == 'markdown': c.source = _relink(c.source, local)
        for o in c.get('outputs', []):
            md = o.get('data', {}).get('text/markdown')
            if md is not None: o['data']['text/markdown'] = _anchor_headings(_relink(_joined(md), local))
    body, files = to_markdown(cells, page.stem, page.stem + '_files')
    fm = getattr(nb, 'frontmatter_', {}) or {}
    title = str(fm.get('title') or page.stem.replace('_', ' ').capitalize())
    head = f"# {title}\n\n" + (f"{fm['description']}\n{{: .subtitle }}\n\n" if fm.get('description') else '')
    error = failure_text(nb.failure_) if getattr(nb, 'failure_', None) else None
    if error: head += error_box(error)
    return dict(page=page, title=title, markdown=head + body, anchors=set(_re_anchor.findall(body)),
                doc_links=doc_links, files={page.parent/k: v for k, v in files.items()}, error=error)


_re_math = re.compile(r'<(span|div) class="arithmatex">\s*\\([(\[])(.*?)\\[)\]]\s*</\1>', re.S)

def math_to_mathml(page_html: str, # HTML of one page, as mkdocs renders it
                  ) -> str:
    "`page_html` with arithmatex formulas replaced by MathML."
    from latex2mathml.converter import convert
    def sub(m):
        tex = html.unescape(m.group(3)).strip()
        try: return convert(tex, display='block' if m.group(2) == '[' else 'inline')
        except Exception: return m.group(0)
    return _re_math.sub(sub, page_html)


_SITE_CSS = """
.md-typeset .subtitle { font-size: 1.15em; color: var(--md-default-fg-color--light); margin-top: -0.6em; }
.md-typeset .chart-output { margin: 0.5em 0 1.2em; }
.md-typeset .chart-output svg { max-width: 100%; height: auto; }
.md-typeset .html-output { overflow-x: auto; font-size: 0.8em; }
.md-typeset .html-output table.dataframe { border-collapse: collapse; }
.md-typeset .html-output table.dataframe th, .md-typeset .html-output table.dataframe td { padding: 0.2em 0.6em; border-bottom: 1px solid var(--md-default-fg-color--lightest); text-align: right; }
.md-typeset math[display="block"] { margin: 0.8em 0; font-size: 1.1em; }
.md-typeset td:first-child code { white-space: nowrap; }
"""

_HOOKS = _IMPORT_SELF + "from tools.docs import math_to_mathml\n\ndef on_page_content(html, **kwargs):\n    return math_to_mathml(html)\n"

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
    order = {'Home': 0, 'Tutorials': 1, 'Reference': 2, 'Library': 3}   # other sections after these
    nav.sort(key=lambda d: order.get(next(iter(d)), len(order)))
    return {
        'site_name': site_name, 'site_description': description, 'use_directory_urls': False,
        'theme': {'name': 'material', 'font': False, 'language': 'en',
                  'features': ['navigation.sections', 'navigation.top', 'navigation.footer', 'toc.follow',
                               'search.highlight', 'search.suggest', 'content.code.copy']},
        'plugins': ['search'],
        'markdown_extensions': ['tables', 'attr_list', 'md_in_html', 'admonition', 'def_list',
                                {'toc': {'permalink': True}}, {'pymdownx.highlight': {'use_pygments': True}},
                                'pymdownx.superfences', {'pymdownx.arithmatex': {'generic': True}}],
        'extra_css': ['assets/dars.css'], 'hooks': ['hooks.py'], 'nav': nav,
        'validation': {'omitted_files': 'warn', 'absolute_links': 'info', 'unrecognized_links': 'warn',
                       'anchors': 'warn'},
    }


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

def _page_worker(folder: str, # the work folder: tasks.pkl in, one <i>.pkl per page out
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
    done = {}
    with tempfile.TemporaryDirectory(prefix='dars-pages-') as folder:
        (Path(folder)/'tasks.pkl').write_bytes(pickle.dumps(args))
        code = _IMPORT_SELF + f"from tools.docs import _page_worker; _page_worker({folder!r})"
        threads = str(max(1, (os.cpu_count() or 1) // n_workers))   # the cores shared out, as joblib does for its workers
        env = os.environ | {v: os.environ.get(v, threads) for v in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS')}
        procs = [subprocess.Popen([sys.executable, '-c', code], env=env) for _ in range(n_workers)]
        ok = False
        try:
            while len(done) < len(args):
                exited = all(p.poll() is not None for p in procs)
                for i in set(range(len(args))) - set(done):
                    f = Path(folder)/f'{i}.pkl'
                    if not f.exists(): continue
                    status, val = pickle.loads(f.read_bytes())
                    if status == 'error': raise DocsError(val)
                    done[i] = report(args[i], val)
                if exited and len(done) < len(args): raise DocsError("a docs worker process ended without finishing its notebook")
                time.sleep(0.05)
            ok = True
        finally:
            for p in procs:   # finished workers exit by themselves; a stuck or unneeded one is stopped
                try: p.wait(timeout=60 if ok else 0.1)
                except subprocess.TimeoutExpired: p.kill(); p.wait()
    return [done[i] for i in range(len(args))]

class _Collect(logging.Handler):
    "Keep the warnings mkdocs logs during a build."
    def __init__(self): super().__init__(logging.WARNING); self.records = []
    def emit(self, record): self.records.append(record.getMessage())

def _safe_out(out: Path):
    "Refuse to empty a folder that is not a site (or empty)."
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out/'index.html').exists())):
        raise ValueError(f"refusing to overwrite {out}: not empty and not a built site")

def build_docs(out: str | Path = '_site', # folder for the site (created; replaced if it holds a site)
               execute: bool = True, # run the notebooks' cells (as the tests do) for their outputs
               root: str | Path | None = None, # project folder (default: found from the working directory)
               force_flags: str | None = None, # test flags to run anyway (default: `DARS_TEST_FLAGS`)
               quiet: bool = False, # no progress lines
               n_workers: int | None = None, # processes rendering notebooks (default: up to 2, one per core)
              ) -> Path:
    "Render every notebook into an offline HTML site; return `out`, or raise `DocsError` listing broken pages after building the rest."
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    cfg = get_config(Path(root) if root else None)
    out = Path(out).resolve()
    _safe_out(out)
    nbs = doc_notebooks(cfg.nbs_path)
    if not nbs: raise ValueError(f"no notebooks under {cfg.nbs_path}")
    flags, t0 = _skip_flags(cfg, force_flags), time.time()
    with tempfile.TemporaryDirectory(prefix='dars-docs-') as tmp:
        tmp = Path(tmp); docs = tmp/'docs'
        args = [(nb, cfg.nbs_path, execute, flags, cfg.doc_url, cfg.get('cell_timeout', 600)) for nb in nbs]
        built = render_pages(args, n_workers, quiet)
        anchors = {p['page']: p['anchors'] for p in built}
        for p in built:
            dest = docs/p['page']
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(resolve_doc_links(p['markdown'], p['page'], anchors, p['doc_links']), encoding='utf-8')
            for f, data in p['files'].items():
                (docs/f).parent.mkdir(parents=True, exist_ok=True)
                (docs/f).write_bytes(data if isinstance(data, bytes) else str(data).encode())
        pages = [(p['title'], p['page']) for p in built]
        if Path('index.md') not in anchors: raise ValueError(f"no index.ipynb in {cfg.nbs_path}")
        (docs/'assets').mkdir(exist_ok=True)
        (docs/'assets'/'dars.css').write_text(_SITE_CSS)
        (tmp/'hooks.py').write_text(_HOOKS)
        conf = mkdocs_config(pages, str(cfg.get('title') or cfg.lib_name), str(cfg.get('description', '')))
        (tmp/'mkdocs.yml').write_text(yaml.safe_dump(conf, sort_keys=False, allow_unicode=True))
        handler, log = _Collect(), logging.getLogger('mkdocs')
        log.addHandler(handler)
        try: build(load_config(str(tmp/'mkdocs.yml'), site_dir=str(out)))
        finally: log.removeHandler(handler)
    broken = [f"{p['page'].with_suffix('.html').as_posix()}: {p['error']}" for p in built if p.get('error')]
    problems = broken + [f"mkdocs: {r}" for r in handler.records]
    if problems:
        what = ([f"{len(broken)} of {len(built)} pages broken"] if broken else []) + \
               ([f"mkdocs reported {len(handler.records)} problem(s)"] if handler.records else [])
        raise DocsError(f"{', '.join(what)} (site written to {out}); first: {problems[0]}", problems)
    if not quiet: print(f"built {len(pages)} pages in {time.time() - t0:.0f}s", flush=True)
    return out


_re_default_exp = re.compile(r'^\s*#\|\s*default_exp\s+(\S+)', re.M)
_re_title = re.compile(r'^#\s+(.+?)\s*\n+>\s*(.+?)\s*$', re.M)

def notebook_summary(nb_path: Path, # a notebook
                    ) -> dict:
    "{'module', 'title', 'description'} of a notebook (module None when it exports nothing)."
    cells = read_nb(nb_path).cells
    exp = next((m.group(1) for c in cells if c.cell_type == 'code' and (m := _re_default_exp.search(c.source))), None)
    t = next((m for c in cells if c.cell_type == 'markdown' and (m := _re_title.search(c.source))), None)
    return dict(module=exp, title=t.group(1) if t else Path(nb_path).stem, description=t.group(2) if t else '')

def feature_table(nbs_path: Path | None = None, # notebooks folder (default: the project's)
                  tutorials: bool = False, # the tutorials (notebooks under tutorials/) instead of the modules
                  lib_name: str = 'dars_nb', # package name shown before each module
                 ) -> str:
    "Markdown table of the library's modules (or its tutorials), linked to their notebooks."
    nbs_path = Path(nbs_path) if nbs_path else get_config().nbs_path
    rows = []
    for nb in doc_notebooks(nbs_path):
        rel = nb.relative_to(nbs_path)
        s = notebook_summary(nb)
        if tutorials and rel.parts[0] == 'tutorials':
            rows.append(f"| [{s['title']}]({rel.as_posix()}) | {s['description']} |")
        elif not tutorials and s['module']:
            rows.append(f"| [`{lib_name}.{s['module']}`]({rel.as_posix()}) | {s['title']} | {s['description']} |")
    head = '| tutorial | what you will see |\n|---|---|' if tutorials else '| module | notebook | what it does |\n|---|---|---|'
    return '\n'.join([head] + rows)


def repository_paths(table: str) -> str:
    "A table with each notebook link written as its path in the repository, as code (the README has no links to follow)."
    return re.sub(r'\[([^\]]+)\]\(([^)\s]+\.ipynb)\)', lambda m: f"{m.group(1)} (`nbs/{m.group(2)}`)", table)

_INDEX_TABLES = {'tutorials': True, 'modules': False}   # marker in nbs/index.ipynb -> tutorials or modules

def benchmark_figures(results: Path, # the Markdown file `make bench` writes (bench/RESULTS.md)
                     ) -> str:
    "The figures table of `bench/RESULTS.md` (its machine line and table, without the file's own heading)."
    if not results.exists(): return f"`make bench` has not written {results.name} yet."
    lines = results.read_text(encoding='utf-8').splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('measured on ')), None)
    if start is None: raise ValueError(f"{results} has no 'measured on' line: rerun make bench")
    return '\n'.join(lines[start:]).strip() + '\n'

def index_tables(nbs_path: Path | None = None, # notebooks folder (default: the project's)
                ) -> dict:
    "{'tutorials': …, 'modules': …, 'benchmarks': …}: markdown cells of the home page, after their markers."
    tables = {k: f"<!-- {k} table -->\n{repository_paths(feature_table(nbs_path, tutorials=t))}" for k, t in _INDEX_TABLES.items()}
    results = Path(nbs_path or get_config().nbs_path).parent/'bench'/'RESULTS.md'
    return {**tables, 'benchmarks': f"<!-- benchmarks table -->\n{benchmark_figures(results)}"}

def refresh_index(root: str | Path | None = None, # project folder (default: found from the working directory)
                 ) -> bool:
    "Rewrite the tables of tutorials and modules in the index notebook (cells that start with their marker); True if changed."
    cfg = get_config(Path(root) if root else None)
    path, tables = cfg.nbs_path/cfg.readme_nb, index_tables(cfg.nbs_path)
    raw = json.loads(path.read_text(encoding='utf-8'))
    changed = False
    for cell in raw['cells']:
        src = ''.join(cell['source'])
        key = next((k for k in tables if src.startswith(f'<!-- {k} table -->')), None)
        if cell['cell_type'] == 'markdown' and key and src != tables[key]:
            cell['source'], changed = tables[key].splitlines(keepends=True), True
    if changed: path.write_text(json.dumps(raw, indent=1, ensure_ascii=False) + '\n', encoding='utf-8')
    return changed

_re_style = re.compile(r'<style[^>]*>.*?</style>\s*', re.S)
_re_attrs = re.compile(r'(\]\([^)]*\))\{[^}]*\}')

def readme_link(target: str, # a link target in the index notebook
                nbdir: Path, # the index notebook's folder, relative to the project root
               ) -> str:
    "A link to a notebook, made relative to the project root (where README.md sits); others unchanged."
    u = urlsplit(target)
    if u.scheme or u.netloc or not u.path.endswith('.ipynb'): return target
    return urlunsplit(('', '', (Path(nbdir)/u.path).as_posix(), u.query, u.fragment))

def build_readme(root: str | Path | None = None, # project folder (default: found from the working directory)
                 execute: bool = True, # run the notebook's cells for their outputs
                 assets: str = 'docs_assets', # folder (in the project) where older README builds kept chart files (emptied)
                ) -> Path:
    "Write README.md from the project's index notebook with nbdev's processors and nbconvert; return its path."
    cfg = get_config(Path(root) if root else None)
    nb_path = cfg.nbs_path/cfg.readme_nb
    if not nb_path.exists(): raise ValueError(f"no {cfg.readme_nb} in {cfg.nbs_path}")
    refresh_index(cfg.config_path)
    nb = processed_notebook(nb_path, execute, _skip_flags(cfg), cfg.get('cell_timeout', 600))
    if nb.failure_: raise DocsError(failure_text(nb.failure_))
    cells = markdown_ready(nb)
    nbdir = (cfg.nbs_path/cfg.readme_nb).parent.relative_to(cfg.config_path)
    relink = lambda md: _relink(md, lambda t: readme_link(t, nbdir))
    for c in cells:
        if c.cell_type == 'markdown': c.source = relink(c.source)
        for o in c.get('outputs', []):
            d = o.get('data', {})
            if 'text/html' in d: d['text/html'] = _re_style.sub('', _joined(d['text/html']))
            if 'text/markdown' in d: d['text/markdown'] = relink(_re_attrs.sub(r'\1', _joined(d['text/markdown'])))
    key = Path(cfg.readme_nb).stem
    body, files = to_markdown(cells, key, assets, readme=True)
    adir = cfg.config_path/assets
    for old in adir.glob(f'{key}_*'): old.unlink()
    for f, data in files.items():
        (cfg.config_path/f).parent.mkdir(parents=True, exist_ok=True)
        (cfg.config_path/f).write_bytes(data if isinstance(data, bytes) else str(data).encode())
    fm = getattr(nb, 'frontmatter_', {}) or {}
    head = f"# {fm.get('title', cfg.lib_name)}\n\n<!-- WARNING: THIS FILE WAS AUTOGENERATED! DO NOT EDIT! -->\n\n"
    if fm.get('description'): head += f"> {fm['description']}\n\n"
    body = body.replace('<!-- WARNING: THIS FILE WAS AUTOGENERATED! DO NOT EDIT! -->\n\n', '')
    readme = cfg.config_path/'README.md'
    readme.write_text(head + body, encoding='utf-8')
    return readme


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
                if k in STATIC_TYPES and (k != 'text/html' or _static_html(_joined(v)))}
        if not data: continue
        meta = {k: v for k, v in (o.get('metadata') or {}).items() if k in data}
        kept.append(dict(o, data=data, metadata=meta))
    return kept

def _default_output_notebooks(cfg) -> list[Path]:
    "The home page notebook and the tutorials."
    return [cfg.nbs_path/cfg.readme_nb] + sorted((cfg.nbs_path/'tutorials').glob('*.ipynb'))

def save_outputs(paths=None, # notebooks to run (default: the home page notebook and tutorials/*.ipynb)
                 force_flags: str = 'slow', # test flags whose cells run anyway
                 root: str | Path | None = None, # project folder (default: found from the working directory)
                 timeout: int | None = None, # seconds per cell (default: the project's `cell_timeout`, else 600)
                 quiet: bool = False, # no progress lines
                ) -> list[Path]:
    "Run each notebook in its own folder and store its static outputs in it, cleaned by nbdev-clean; return the paths."
    import json
    from nbdev.clean import nbdev_clean
    cfg = get_config(Path(root) if root else None)
    paths = [Path(p).resolve() for p in (paths if paths is not None else _default_output_notebooks(cfg))]
    if missing := [str(p) for p in paths if not p.exists()]: raise ValueError(f"no notebook at {missing[0]}")
    flags, timeout = _skip_flags(cfg, force_flags), timeout or cfg.get('cell_timeout', 600)
    for p in paths:
        t = time.time()
        nb = read_nb(p)
        nb.failure_ = None
        for i, c in enumerate(nb.cells): c['src_idx_'] = i
        with working_directory(p.parent): NBProcessor(nb=nb, procs=[ExecCells(nb, flags, timeout)], rm_directives=False).process()
        if nb.failure_: raise DocsError(failure_text(nb.failure_))
        raw = json.loads(p.read_text(encoding='utf-8'))
        for cell, ran in zip(raw['cells'], nb.cells, strict=True):
            if cell['cell_type'] == 'code': cell['outputs'] = static_outputs([dict(o) for o in ran.get('outputs', [])])
        p.write_text(json.dumps(raw, indent=1, ensure_ascii=False) + '\n', encoding='utf-8')
        with working_directory(cfg.config_path): nbdev_clean(fname=str(p))
        if not quiet: print(f"  {p.relative_to(cfg.config_path)}: outputs saved ({time.time() - t:.0f}s)", flush=True)
    return paths


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

@call_parse
def main(out: str = '_site', # folder for the site
         readme: bool = False, # write README.md from nbs/index.ipynb instead of the site
         outputs: bool = False, # run index.ipynb and the tutorials and keep their static outputs instead
         quiet: bool = False, # no progress lines
        ):
    "Build the offline docs site (default), the README, or the saved outputs of the home page and tutorials."
    if readme: return print(build_readme())
    if outputs: return save_outputs(quiet=quiet) and None
    sys.exit(docs_main(out, quiet))
