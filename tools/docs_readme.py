"""README.md from `nbs/index.ipynb`, readable both on a code host and as a package description: the home page's
tables of tutorials and modules, its charts as committed image files, links that need no notebook beside them."""
from __future__ import annotations
import json, os, re, tomllib
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from fastcore.nbio import read_nb
from nbdev.config import get_config
from tools.docs_notebooks import DocsError, doc_notebooks, failure_text, joined, page_path, processed_notebook, project_skip_flags
from tools.docs_pages import CODE_INPUT, markdown_ready, to_markdown

# The home page's tables
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
    end = next((i for i, l in enumerate(lines) if i > start and l.startswith('## ')), len(lines))   # notes by hand below
    return '\n'.join(lines[start:end]).strip() + '\n'

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


# Links and images that work without the repository beside the README
def docs_url(root: Path, # the project folder
            ) -> str:
    "The docs site the project declares (`[project.urls]` Documentation in pyproject.toml), else ''."
    urls = tomllib.loads((Path(root)/'pyproject.toml').read_text()).get('project', {}).get('urls', {})
    return next((u.rstrip('/') for k, u in urls.items() if k.lower() in ('documentation', 'docs')), '')

_re_link = re.compile(r'(?P<code>```.*?```|~~~.*?~~~|`[^`\n]+`)|(?<!!)\[(?P<text>[^\]]+)\]\((?P<url>[^)\s]+)\)', re.S)

def readme_link(text: str, # the link's text
                target: str, # its target, as written in the index notebook
                nbdir: Path, # the index notebook's folder, relative to the project root
                site: str = '', # the declared docs site ('' when there is none)
               ) -> str:
    """The Markdown a link becomes in the README: an absolute link to the docs site when one is declared, else the
    text with the file's path in the repository (a word linked to an anchor of a page: the word alone)."""
    u = urlsplit(target)
    if u.scheme or u.netloc or not u.path: return f'[{text}]({target})'   # a web address, or an anchor of the README
    if site and u.path.endswith('.ipynb'):
        page = page_path(Path(u.path)).with_suffix('.html').as_posix()
        return f'[{text}]({urlunsplit(("", "", f"{site}/{page}", u.query, u.fragment))})'
    if u.fragment: return text
    return f'{text} (`{Path(os.path.normpath(Path(nbdir)/u.path)).as_posix()}`)'

def readme_links(md: str, nbdir: Path, site: str = '') -> str:
    "Every link of `md` outside code through `readme_link`."
    return _re_link.sub(lambda m: m.group(0) if m.group('code') else readme_link(m.group('text'), m.group('url'), nbdir, site), md)

_re_chart_title = re.compile(r'role-title.*?<text[^>]*>([^<]+)</text>', re.S)

def chart_alt(svg: str) -> str:
    "Words for a chart image: 'Chart: ' and its title(s) (vl-convert's title text marks)."
    titles = list(dict.fromkeys(t.strip() for t in _re_chart_title.findall(joined(svg)) if t.strip()))
    return 'Chart: ' + '; '.join(titles) if titles else 'Chart'

_README_TEMPLATE = CODE_INPUT + r"""{% block data_svg %}
![{{ output.data['image/svg+xml'] | chart_alt }}]({{ output.metadata.filenames['image/svg+xml'] | image_url }})
{% endblock data_svg %}
{% block data_png %}
![Chart]({{ output.metadata.filenames['image/png'] | image_url }})
{% endblock data_png %}
{% block data_html scoped %}

{{ output.data['text/html'] }}

{% endblock data_html %}
"""

_re_style = re.compile(r'<style[^>]*>.*?</style>\s*', re.S)
_re_attrs = re.compile(r'(\]\([^)]*\))\{[^}]*\}')

def _readme_cells(cfg, execute: bool, site: str) -> tuple:
    "The index notebook's cells ready for the README, and its front matter."
    nb = processed_notebook(cfg.nbs_path/cfg.readme_nb, execute, project_skip_flags(cfg), cfg.get('cell_timeout', 600))
    if nb.failure_: raise DocsError(failure_text(nb.failure_))
    cells = markdown_ready(nb)
    nbdir = (cfg.nbs_path/cfg.readme_nb).parent.relative_to(cfg.config_path)
    for c in cells:
        if c.cell_type == 'markdown': c.source = readme_links(c.source, nbdir, site)
        for o in c.get('outputs', []):
            d = o.get('data', {})
            if 'text/html' in d: d['text/html'] = _re_style.sub('', joined(d['text/html']))
            if 'text/markdown' in d: d['text/markdown'] = readme_links(_re_attrs.sub(r'\1', joined(d['text/markdown'])), nbdir, site)
    return cells, getattr(nb, 'frontmatter_', {}) or {}

README_ASSETS = 'docs_assets'   # the README's chart images: committed, and published by the site at the same path

def build_readme(root: str | Path | None = None, # project folder (default: found from the working directory)
                 execute: bool = True, # run the notebook's cells for their outputs
                 assets: str = README_ASSETS, # folder (in the project, committed) for the README's chart images
                ) -> Path:
    "Write README.md, and its chart images under `assets`, from the project's index notebook; return its path."
    cfg = get_config(Path(root) if root else None)
    if not (cfg.nbs_path/cfg.readme_nb).exists(): raise ValueError(f"no {cfg.readme_nb} in {cfg.nbs_path}")
    refresh_index(cfg.config_path)
    site = docs_url(cfg.config_path)
    cells, fm = _readme_cells(cfg, execute, site)
    key = Path(cfg.readme_nb).stem
    image_url = lambda f: f'{site}/{f}' if site else f       # build_docs publishes the same folder
    body, files = to_markdown(cells, key, assets, template=_README_TEMPLATE, extract=('image/svg+xml', 'image/png'),
                              filters=dict(chart_alt=chart_alt, image_url=image_url))
    for old in (cfg.config_path/assets).glob(f'{key}_*'): old.unlink()
    for f, data in files.items():
        (cfg.config_path/f).parent.mkdir(parents=True, exist_ok=True)
        (cfg.config_path/f).write_bytes(data if isinstance(data, bytes) else str(data).encode())
    head = f"# {fm.get('title', cfg.lib_name)}\n\n<!-- WARNING: THIS FILE WAS AUTOGENERATED! DO NOT EDIT! -->\n\n"
    if fm.get('description'): head += f"> {fm['description']}\n\n"
    body = body.replace('<!-- WARNING: THIS FILE WAS AUTOGENERATED! DO NOT EDIT! -->\n\n', '')
    readme = cfg.config_path/'README.md'
    readme.write_text(head + body, encoding='utf-8')
    return readme

_re_python_block = re.compile(r'^```python\n(.*?)^```', re.S | re.M)

def readme_snippets(text: str, # a README's Markdown
                   ) -> list[str]:
    "The Python code blocks of a README, each meant to run alone."
    return _re_python_block.findall(text)
