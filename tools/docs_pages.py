"""A processed notebook as a Markdown page of the site: Quarto cell options applied, charts drawn as legible SVG,
links made local, API headings anchored (dunder names as code), math as MathML."""
from __future__ import annotations
import html, math, os, re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from tools.docs_notebooks import failure_text, joined, page_path, processed_notebook

_re_opt = re.compile(r'^#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$')

def _cell_options(cell) -> dict:
    "Strip the leading `#| key: value` lines from a code cell, returning them."
    lines, opts = cell.source.splitlines(), {}
    while lines and (m := _re_opt.match(lines[0])):
        opts[m.group(1)] = m.group(2).strip('"\''); lines.pop(0)
    cell.source = '\n'.join(lines)
    return opts


MIN_CHART_TEXT_PX = 9   # no chart text is shown smaller: a narrow screen scrolls the chart instead of shrinking it
_re_svg_width = re.compile(r'<svg\b[^>]*?\swidth="([\d.]+)"')
_re_font_size = re.compile(r'font-size[=:]\s*"?([\d.]+)px')

def legible_svg(svg: str, # an SVG drawing (vl-convert's: a width attribute, font sizes in px)
                min_px: float = MIN_CHART_TEXT_PX, # the smallest text size it may be shown at
               ) -> str:
    "`svg` with a CSS min-width: scaled to fit a narrow column, its smallest text stays at least `min_px`."
    width, sizes = _re_svg_width.search(svg), [float(s) for s in _re_font_size.findall(svg)]
    if not width or not sizes: return svg
    least = math.ceil(float(width.group(1)) * min_px / min(sizes))
    return re.sub(r'<svg\b', f'<svg style="min-width: {least}px"', svg, count=1)

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
            data['image/svg+xml'] = re.sub(r'^\s*<\?xml[^>]*>\s*', '', joined(data['image/svg+xml']))

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


# Links
_re_mdlink = re.compile(r'(?P<code>```.*?```|~~~.*?~~~|`[^`\n]+`)'             # code is left alone
                        r'|(?P<pre>\]\(\s*<?)(?P<url>[^)\s>]+)(?P<post>>?(?:\s+"[^"]*")?\s*\))', re.S)

RESULTS = Path('../bench/RESULTS.md')              # the benchmark figures, as a notebook links them (nbs/ is the site root)
RESULTS_PAGE = Path('reference/benchmarks.md')   # ... and as a page of the site

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
    if root_rel == RESULTS: root_rel = RESULTS_PAGE
    elif root_rel.suffix == '.ipynb': root_rel = page_path(root_rel)
    elif root_rel.suffix == '.html': root_rel = root_rel.with_suffix('.md')
    else: return target
    rel = os.path.relpath(root_rel, Path(page).parent).replace(os.sep, '/')
    return urlunsplit(('', '', rel, u.query, u.fragment))

def relink(text: str, # Markdown
           f, # target -> new target
          ) -> str:
    "Apply `f` to the target of every Markdown link in `text`, outside code."
    return _re_mdlink.sub(lambda m: m.group(0) if m.group('code') else m.group('pre') + f(m.group('url')) + m.group('post'), text)

_re_doc_heading = re.compile(r'^(#{2,4}) ([A-Za-z_][\w.]*)[ \t]*$', re.M)

def anchor_headings(md: str, # the Markdown of a `show_doc` output
                   ) -> str:
    "Give each API heading its name as id; a name with `__` is set as code (Markdown would read it as bold)."
    def sub(m):
        name = m.group(2)
        if '__' not in name: return f'{m.group(1)} {name} {{ #{name.lower()} }}'
        anchor = name.lower().replace('_', r'\_')                  # escaped: Markdown would read `__x__` as bold
        return f'{m.group(1)} `{name}` {{ #{anchor} }}'
    return _re_doc_heading.sub(sub, md)

_re_anchor = re.compile(r'\{ #([^\s}]+) \}')

def unique_anchors(md: str, # a page's Markdown, its API headings anchored by `anchor_headings`
                  ) -> str:
    "`md` with each API heading id used once: a name that only differs in case from an earlier one gets `-2`, `-3`…"
    seen = {}
    def sub(m):
        i = m.group(1); seen[i] = seen.get(i, 0) + 1
        return m.group(0) if seen[i] == 1 else f'{{ #{i}-{seen[i]} }}'
    return _re_anchor.sub(sub, md)

def page_anchors(md: str) -> set:
    "The ids of a page's API headings, as the browser sees them."
    return {a.replace('\\_', '_') for a in _re_anchor.findall(md)}

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
    return relink(md, fix)


# Markdown through nbconvert
CODE_INPUT = r"""{% extends 'markdown/index.md.j2' %}
{% block input %}
```python
{{ cell.source }}
```
{% endblock input %}
"""   # code cells as fenced Python

_SITE_TEMPLATE = CODE_INPUT + r"""{% block data_svg %}

<div class="chart-output">
{{ output.data['image/svg+xml'] | legible_svg }}
</div>

{% endblock data_svg %}
{% block data_html scoped %}

<div class="html-output">
{{ output.data['text/html'] }}
</div>

{% endblock data_html %}
{% block stream %}

{{ output.text | text_block }}

{% endblock stream %}
{% block data_text scoped %}

{{ output.data['text/plain'] | text_block }}

{% endblock data_text %}
"""   # printed text as `text` blocks: the site keeps their lines as printed (tables stay aligned) and scrolls them

def text_block(text: str, # printed output of a cell
              ) -> str:
    "`text` as a fenced Markdown block of language `text`, its fence longer than any run of backticks inside it."
    fence = '`' * max(3, 1 + max(map(len, re.findall(r'`+', text)), default=0))
    return f"{fence}text\n{text.rstrip(chr(10))}\n{fence}"

def _plain_output(o) -> dict:
    "Output `o` with its text joined into strings, as nbconvert's templates expect."
    o = dict(o)
    if 'text' in o: o['text'] = joined(o['text'])
    if 'data' in o: o['data'] = {k: joined(v) for k, v in o['data'].items()}
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
                template: str = _SITE_TEMPLATE, # the nbconvert Markdown template
                extract: tuple = ('image/png', 'image/jpeg'), # output types written as files beside the page
                filters: dict | None = None, # more Jinja filters the template uses
               ) -> tuple[str, dict]:
    "Markdown text of `cells` and the extracted files {relative path: bytes}."
    from jinja2 import DictLoader
    from nbconvert import MarkdownExporter
    from nbformat import from_dict
    from traitlets.config import Config
    c = Config({'ExtractOutputPreprocessor': {'enabled': True, 'extract_output_types': set(extract)}})
    ex = MarkdownExporter(config=c, template_file='page.md.j2', extra_loaders=[DictLoader({'page.md.j2': template})])
    ex.environment.filters.update(dict(legible_svg=legible_svg, text_block=text_block) | (filters or {}))
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
        if c.cell_type == 'markdown': c.source = relink(c.source, local)
        for o in c.get('outputs', []):
            md = o.get('data', {}).get('text/markdown')
            if md is not None: o['data']['text/markdown'] = anchor_headings(relink(joined(md), local))
    body, files = to_markdown(cells, page.stem, page.stem + '_files')
    body = unique_anchors(body)
    fm = getattr(nb, 'frontmatter_', {}) or {}
    title = str(fm.get('title') or page.stem.replace('_', ' ').capitalize())
    head = f"# {title}\n\n" + (f"{fm['description']}\n{{: .subtitle }}\n\n" if fm.get('description') else '')
    error = failure_text(nb.failure_) if getattr(nb, 'failure_', None) else None
    if error: head += error_box(error)
    return dict(page=page, title=title, markdown=head + body, anchors=page_anchors(body),
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
