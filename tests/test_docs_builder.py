"""The docs and README builder (`tools/docs.py` and its modules): pages, failure reports, links, math, the site,
the README, saved outputs.

Each test builds what it needs in a temporary folder: a toy notebook, or a toy project with an index and two pages."""
import contextlib
import shutil
import io
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import running_cells
from fastcore.nbio import mk_cell, new_nb, read_nb, write_nb
from fastcore import test as fc
from fastcore.xtras import working_directory

from tools.docs_notebooks import (EXPORT_CALL, assertion_message, doc_notebooks, failing_line, failure_text, joined,
                                  page_path, processed_notebook, runs_in_tests)
from tools.docs_pages import (anchor_headings, error_box, legible_svg, markdown_ready, math_to_mathml, notebook_page,
                              page_anchors, relink, resolve_doc_links, site_link, to_markdown, unique_anchors)
from tools.docs_site import _Collect, build_docs, docs_main, mkdocs_config
from tools.docs_readme import (build_readme, chart_alt, docs_url, feature_table, notebook_summary, readme_link,
                               readme_snippets, README_ASSETS)
from tools.docs_outputs import compare_outputs, forced_flags, same_text, save_outputs, static_outputs

DOC = 'https://docs.example.org/toy/'


def toy_nb(folder):
    "A notebook with an export, a hidden cell, a link, a slow cell and a chart."
    nb = new_nb([mk_cell('#| default_exp toy'),
                 mk_cell('#| export\ndef double(x: int, # a number\n          ) -> int:\n    "Twice `x`."\n    return 2 * x'),
                 mk_cell('# Toy\n> A notebook to test the docs build', cell_type='markdown'),
                 mk_cell('#| hide\nsecret = 41'),
                 mk_cell('`double` doubles; see [the next page](02_next.ipynb).', cell_type='markdown'),
                 mk_cell('double(secret + 1)'),
                 mk_cell('#| slow\nprint("slow")'),
                 mk_cell('import altair as alt, pandas as pd\n'
                         'alt.Chart(pd.DataFrame({"a": [1, 2]}), title="Two bars").mark_bar().encode(x="a:Q")')])
    nb.metadata = {'kernelspec': {'name': 'python3', 'language': 'python', 'display_name': 'Python 3'}}
    write_nb(nb, Path(folder)/'01_toy.ipynb')
    return Path(folder)/'01_toy.ipynb'


def toy_project(folder):
    "A project with an index, the toy notebook and a second page."
    folder = Path(folder); folder.mkdir(parents=True, exist_ok=True)
    (folder/'pyproject.toml').write_text('[project]\nname = "toy"\ndescription = "A toy"\n'
                                         '[tool.nbdev]\nlib_path = "toy"\ntst_flags = "notest slow"\n')
    (folder/'nbs').mkdir()
    toy_nb(folder/'nbs')
    write_nb(new_nb([mk_cell('# toy\n> The home page', cell_type='markdown'),
                     mk_cell('Start with [the toy](01_toy.ipynb).', cell_type='markdown')]), folder/'nbs'/'index.ipynb')
    write_nb(new_nb([mk_cell('# Next\n> A second page', cell_type='markdown'), mk_cell('1 + 1')]),
             folder/'nbs'/'02_next.ipynb')
    return folder


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
    "(folder, the toy notebook processed with execution)."
    folder = tmp_path_factory.mktemp('toy')
    return folder, processed_notebook(toy_nb(folder))


def test_pages_and_notebooks(tmp_path):
    fc.test_eq(page_path(Path('01_stats.ipynb')), Path('stats.md'))
    fc.test_eq(page_path(Path('tutorials/01_why_single_shot_labels_flip.ipynb')),
            Path('tutorials/why_single_shot_labels_flip.md'))
    fc.test_eq(page_path(Path('index.ipynb')), Path('index.md'))
    for p in ['00_a.ipynb', 'tutorials/01_b.ipynb', '_hidden/x.ipynb', '.ipynb_checkpoints/00_a-checkpoint.ipynb', '_c.ipynb']:
        (tmp_path/p).parent.mkdir(parents=True, exist_ok=True); (tmp_path/p).write_text('{}')
    fc.test_eq([p.relative_to(tmp_path).as_posix() for p in doc_notebooks(tmp_path)], ['00_a.ipynb', 'tutorials/01_b.ipynb'])


def test_failure_report():
    from execnb.shell import CaptureShell
    sh = CaptureShell()
    sh.run('from fastcore.test import test_close, test_eq\nimport numpy as np\ndef check(x): test_eq(x, 2)')
    src = 'x = np.array([1., 2., 3.])\ntest_close(x, x + [0, 0.5, 0.25], eps=1e-3)\ny = 2'
    sh.run(src)
    fc.test_eq(failing_line(sh.exc, src), (2, 'test_close(x, x + [0, 0.5, 0.25], eps=1e-3)'))
    fc.test_eq(assertion_message(sh.exc), 'test_close: largest difference 0.5 > eps 0.001')
    src = 'a = 1\ncheck([3, 4] * 40)'                      # the check fails inside a function of an earlier cell
    sh.run(src)
    fc.test_eq(failing_line(sh.exc, src), (2, 'check([3, 4] * 40)'))
    msg = assertion_message(sh.exc)
    assert msg.startswith('test_eq: [3, 4, 3, 4') and msg.endswith('… vs 2'), msg
    assert len(msg) < 140                                 # both values shortened
    sh.run('z = 1\n1/0')
    fc.test_eq((failing_line(sh.exc, 'z = 1\n1/0'), assertion_message(sh.exc)), ((2, '1/0'), 'ZeroDivisionError: division by zero'))
    sh.run('def f(:\n    pass')
    fc.test_eq(failing_line(sh.exc, 'def f(:\n    pass'), (1, 'def f(:'))
    fc.test_eq(failure_text(dict(notebook='02_a.ipynb', cell=3, line=2, code='1/0', message='ZeroDivisionError: division by zero')),
            '02_a.ipynb: cell 3, line 2 `1/0`: ZeroDivisionError: division by zero')
    sh.close()


def _cell(src, **directives):
    c = mk_cell(src); c.directives_ = directives; return c


def test_runs_in_tests():
    assert runs_in_tests(_cell('x = 1'))
    assert not runs_in_tests(_cell('x = 1', slow=''), skip_flags=['notest', 'slow'])
    assert runs_in_tests(_cell('x = 1', slow=''), skip_flags=['notest'])     # flag forced on
    assert not runs_in_tests(_cell('x = 1', eval='false'))
    assert not runs_in_tests(_cell('import nbdev; nbdev.' + EXPORT_CALL + ')'))
    assert not runs_in_tests(mk_cell('# Title', cell_type='markdown'))


def test_processed_notebook(toy):
    _, nb = toy
    srcs = [c.source for c in nb.cells]
    fc.test_eq(nb.frontmatter_['title'], 'Toy')
    assert not any('secret = 41' in s for s in srcs)                     # hidden cell gone
    assert not any('return 2 * x' in s for s in srcs)                    # exported source gone
    sd = [c for c in nb.cells if 'show_doc(double)' in c.source][0]      # show_doc added and run
    assert '### double' in joined(sd.outputs[0]['data']['text/markdown'])
    fc.test_eq(joined([c for c in nb.cells if 'double(secret' in c.source][0].outputs[0]['data']['text/plain']), '84')
    fc.test_eq([c for c in nb.cells if 'print("slow")' in c.source][0].get('outputs', []), [])
    assert 'image/svg+xml' in [c for c in nb.cells if 'alt.Chart' in c.source][0].outputs[0]['data']


def test_processed_notebook_leaves_no_shell_to_the_exit(tmp_path):
    """IPython resets, when the process exits, every shell still registered (a full garbage collection apiece: in a docs
    worker that exit took longer than half its rendering). A rendered notebook, run or not, leaves none, and leaves the
    process its own `__main__` (a shell's emptied namespace there breaks `multiprocessing`'s spawn)."""
    import subprocess, sys
    root = Path(__file__).resolve().parents[1]
    code = (f"import sys; sys.path[:0] = [{str(root)!r}, {str(root / 'tests')!r}]\n"
            "from IPython.core.interactiveshell import InteractiveShell\n"
            "InteractiveShell.atexit_operations = lambda self: print('a shell reset at exit', flush=True)\n"
            "from tools.docs_notebooks import processed_notebook\n"
            "from test_docs_builder import toy_nb\n"
            "main = sys.modules['__main__']\n"
            f"for execute in (False, True): processed_notebook(toy_nb({str(tmp_path)!r}), execute=execute)\n"
            "print('rendered twice', sys.modules['__main__'] is main, hasattr(sys.modules['__main__'], '__spec__'), flush=True)\n")
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    fc.test_eq(res.stdout.splitlines(), ['rendered twice True True'])


def test_patched_method_documented_once(tmp_path):
    "A `@patch`-ed method documented by its own `show_doc(Class.method)` gets no second entry from nbdev."
    path = tmp_path/'03_patch.ipynb'
    write_nb(new_nb([mk_cell('#| default_exp patched'),
                     mk_cell('#| export\nfrom fastcore.basics import patch'),
                     mk_cell('# Patched\n> One entry per method', cell_type='markdown'),
                     mk_cell('#| export\nclass Store:\n    "A store."'),
                     mk_cell('#| export\n@patch\ndef insert(self: Store, x: int):\n    "Insert `x`."\n    return x'),
                     mk_cell('show_doc(Store.insert)'),
                     mk_cell('#| export\n@patch\ndef __call__(self: Store, x: int):\n    "Call with `x`."\n    return x')]), path)
    nb = processed_notebook(path)
    docs = [l for c in nb.cells for l in c.source.splitlines() if l.startswith('show_doc(')]
    fc.test_eq(sorted(docs), ['show_doc(Store)', 'show_doc(Store.__call__)', 'show_doc(Store.insert)'])
    md, _ = to_markdown(markdown_ready(nb), 'patched', 'patched_files')
    fc.test_eq(md.count('### Store.insert'), 1)


def test_charts_stay_legible():
    svg = '<svg xmlns="x" width="600" height="200"><text font-size="10px">a</text><text style="font-size: 12px">b</text></svg>'
    fc.test_eq(legible_svg(svg), svg.replace('<svg ', '<svg style="min-width: 540px" ', 1))   # 600 × 9/10: its 10 px text at 9 px
    fc.test_eq(legible_svg('<svg width="600"></svg>'), '<svg width="600"></svg>')                # no text: nothing to keep legible
    titled = '<g class="mark-group role-title"><g><text font-size="13px">Two bars</text></g></g>'
    fc.test_eq((chart_alt(titled), chart_alt('<svg/>')), ('Chart: Two bars', 'Chart'))


def test_failing_notebook_stops_and_names_the_line(tmp_path):
    bad = tmp_path/'02_bad.ipynb'
    write_nb(new_nb([mk_cell('# Bad', cell_type='markdown'), mk_cell('#| hide\nx = 1\n1/0'), mk_cell('print("after")')]), bad)
    nb_bad = processed_notebook(bad)
    fc.test_eq(failure_text(nb_bad.failure_), '02_bad.ipynb: cell 1, line 3 `1/0`: ZeroDivisionError: division by zero')
    fc.test_eq([c for c in nb_bad.cells if 'after' in c.source][0].get('outputs', []), [])
    fc.test_eq(processed_notebook(bad, skip_flags=(), execute=False).failure_, None)   # saved outputs only: no run


def test_a_cell_out_of_time_fails_with_every_threads_stack(tmp_path, capfd):
    # the cell waits until the test lets it go: a cell past its limit runs on in its shell's thread, and when it ends
    # it puts back the streams it found (this test's capture); it must end before the capture does
    release = tmp_path / 'release'
    slow = tmp_path/'03_slow.ipynb'
    write_nb(new_nb([mk_cell('import time, pathlib'),
                     mk_cell(f'def wait():\n    while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.05)'),
                     mk_cell('wait()'), mk_cell('print("after")')]), slow)
    before = set(threading.enumerate())
    try: nb = processed_notebook(slow, timeout=2)
    finally:
        release.touch()
        for t in set(threading.enumerate()) - before:
            if t.name == 'CaptureShell-loop': t.join(30)     # the shell's thread, ending with its cell
    fc.test_eq(failure_text(nb.failure_), '03_slow.ipynb: cell 2: TimeoutError: Timed out after 2s')
    err = capfd.readouterr().err
    assert 'a cell ran out of time; every thread' in err and 'in wait' in err, err[-2000:]   # where it waited
    assert not running_cells()                   # the shell's thread ended with the cell


def test_markdown_ready(toy):
    cells = markdown_ready(toy[1])
    sd = [c for c in cells if 'show_doc(double)' in c.source][0]
    fc.test_eq(sd.source, 'show_doc(double)')
    fc.test_eq(sd.metadata['transient'], {'remove_source': True})
    assert not any(c.cell_type == 'raw' for c in cells)
    import altair as alt, pandas as pd
    vl = alt.Chart(pd.DataFrame({'a': [1, 2]})).mark_bar().encode(x='a:Q').to_dict()
    c = mk_cell('chart'); c.outputs = [dict(output_type='display_data', metadata={},
                                            data={'application/vnd.vegalite.v5+json': vl, 'text/plain': '<Chart>'})]
    markdown_ready(SimpleNamespace(cells=[c]))
    assert c.outputs[0]['data']['image/svg+xml'].startswith('<svg')
    assert not any(k.startswith('application/vnd.vegalite') for k in c.outputs[0]['data'])


def test_links():
    fc.test_eq(site_link('01_stats.ipynb', Path('index.md'), DOC), 'stats.md')
    fc.test_eq(site_link('../02_diagnostics.ipynb#charts', Path('tutorials/why.md'), DOC), '../diagnostics.md#charts')
    fc.test_eq(site_link(DOC + 'stats.html#capability_stats', Path('tutorials/why.md'), DOC), '../stats.md#capability_stats')
    fc.test_eq(site_link('https://example.org/a.html', Path('index.md'), DOC), 'https://example.org/a.html')
    fc.test_eq(site_link('#section', Path('index.md'), DOC), '#section')
    # the benchmark figures of the repository are a page of the site, and their headings its anchors
    fc.test_eq(site_link('../bench/RESULTS.md#serving', Path('36d_serve_app.md'), DOC), 'reference/benchmarks.md#serving')
    fc.test_eq(site_link('../../bench/RESULTS.md', Path('how_to/serve.md'), DOC), '../reference/benchmarks.md')
    index_link = lambda t: site_link(t, Path('index.md'), DOC)
    fc.test_eq(relink('see [a](01_stats.ipynb) and [b](https://x.org)', index_link), 'see [a](stats.md) and [b](https://x.org)')
    fc.test_eq(relink('[`grid_stats`](01_stats.ipynb), `[a](01_stats.ipynb)`\n```\n[a](01_stats.ipynb)\n```', index_link),
            '[`grid_stats`](stats.md), `[a](01_stats.ipynb)`\n```\n[a](01_stats.ipynb)\n```')   # code untouched
    fc.test_eq(anchor_headings('---\n\n### Supervision.labels\n\ntext'),
            '---\n\n### Supervision.labels { #supervision.labels }\n\ntext')
    fc.test_eq(anchor_headings('### RankBatcher.__call__'), r'### `RankBatcher.__call__` { #rankbatcher.\_\_call\_\_ }')
    two = anchor_headings('### Supervision\n\n### supervision\n\n### RankBatcher.__call__')
    fc.test_eq(unique_anchors(two).count('{ #supervision-2 }'), 1)                      # one id per heading on a page
    fc.test_eq(page_anchors(unique_anchors(two)), {'supervision', 'supervision-2', 'rankbatcher.__call__'})
    have = {Path('stats.md'): {'supervision', 'supervision.soft'}, Path('index.md'): set()}
    made = {t: DOC + t.replace('../', '').replace('.md', '.html') for t in
            ['../stats.md#supervision.labels', '../stats.md#supervision.soft', '../stats.md#_helper', '../store.md#pool']}
    fc.test_eq(resolve_doc_links('[a](../stats.md#supervision.labels) [b](../stats.md#supervision.soft) '
                              '[c](../stats.md#_helper) [d](../store.md#pool) [e](../stats.md#by-hand)',
                              Path('tutorials/why.md'), have, made),
            '[a](../stats.md#supervision) [b](../stats.md#supervision.soft) [c](../stats.md) '
            f'[d]({DOC}store.html#pool) [e](../stats.md#by-hand)')


def test_markdown_and_page(toy):
    folder, nb = toy
    md, _ = to_markdown(markdown_ready(nb), 'toy', 'toy_files')
    assert '<div class="chart-output">\n<svg' in md
    assert '```python\ndouble(secret + 1)\n```' in md
    assert 'show_doc(' not in md                                     # echo: false
    assert '### double' in md
    p = notebook_page(folder/'01_toy.ipynb', folder, doc_url=DOC)
    fc.test_eq((p['page'], p['title']), (Path('toy.md'), 'Toy'))
    assert p['markdown'].startswith('# Toy\n\nA notebook to test the docs build\n{: .subtitle }')
    assert '[the next page](next.md)' in p['markdown']
    assert '### double { #double }' in p['markdown']
    fc.test_eq(p['error'], None)
    assert 'a &lt; b' in error_box('a < b')


def test_math_and_config():
    out = math_to_mathml(r'<p>risk <span class="arithmatex">\(\sigma_q\)</span></p>'
                         r'<div class="arithmatex">\[U = \mu_q - \lambda\,\mu_c\]</div>')
    fc.test_eq(out.count('<math'), 2)
    assert 'display="block"' in out and 'arithmatex' not in out
    cfg = mkdocs_config([('dars_nb', 'index.md'), ('Contributing', 'contributing/contributing.md'),
                         ('Glossary', 'reference/glossary.md'), ('Statistics', 'stats.md'),
                         ('Why labels flip', 'tutorials/why.md'), ('How to train a router', 'how_to/train_a_router.md')], 'x')
    fc.test_eq(cfg['nav'], [{'Home': 'index.md'}, {'Tutorials': [{'Why labels flip': 'tutorials/why.md'}]},
                         {'How to': [{'How to train a router': 'how_to/train_a_router.md'}]},
                         {'Reference': [{'Glossary': 'reference/glossary.md'}]},
                         {'Library': [{'Statistics': 'stats.md'}]},
                         {'Contributing': [{'Contributing': 'contributing/contributing.md'}]}])
    fc.test_eq(cfg['theme']['font'], False)


def test_site(tmp_path):
    proj = toy_project(tmp_path/'proj')
    site = build_docs(proj/'_site', root=proj)
    fc.test_eq(sorted(p.name for p in site.glob('*.html')), ['404.html', 'index.html', 'next.html', 'toy.html'])
    page = (site/'toy.html').read_text()
    assert '<div class="chart-output">' in page and '<svg' in page
    assert 'href="next.html"' in page
    assert 'fonts.googleapis' not in page
    assert (site/'search'/'search_index.json').exists()
    fc.test_eq(re.findall(r'<script[^>]+src="(https?:[^"]+)"', page), [])      # no script from another host
    fc.test_fail(lambda: build_docs(proj/'nbs', root=proj), contains='refusing to overwrite')
    # a broken link to another notebook fails the build with mkdocs' message
    write_nb(new_nb([mk_cell('# Next\n> A second page', cell_type='markdown'),
                     mk_cell('See [gone](09_gone.ipynb).', cell_type='markdown')]), proj/'nbs'/'02_next.ipynb')
    fc.test_fail(lambda: build_docs(proj/'_site', root=proj, quiet=True, n_workers=1), contains='gone.md')


def test_feature_table(tmp_path):
    toy_nb(tmp_path)
    (tmp_path/'tutorials').mkdir()
    write_nb(new_nb([mk_cell('# First steps\n> Start here', cell_type='markdown')]), tmp_path/'tutorials'/'01_first.ipynb')
    fc.test_eq(feature_table(tmp_path).splitlines()[2], '| [`dars_nb.toy`](01_toy.ipynb) | Toy | A notebook to test the docs build |')
    fc.test_eq(feature_table(tmp_path, tutorials=True).splitlines()[2], '| [First steps](tutorials/01_first.ipynb) | Start here |')
    fc.test_eq(notebook_summary(tmp_path/'tutorials'/'01_first.ipynb')['module'], None)


def test_readme(tmp_path):
    proj = toy_project(tmp_path/'proj')
    (proj/'nbs'/'index.ipynb').unlink()
    toy_nb(proj/'nbs').rename(proj/'nbs'/'index.ipynb')
    (proj/'docs_assets').mkdir(); (proj/'docs_assets'/'index_9_0.svg').write_text('<svg/>')   # an older build's chart
    text = build_readme(proj).read_text()
    assert text.startswith('# Toy\n\n<!-- WARNING')
    assert '> A notebook to test the docs build' in text
    fc.test_eq([p.name for p in (proj/'docs_assets').glob('index_*')], ['index_5_0.svg'])   # the chart, as a committed file
    assert '![Chart: Two bars](docs_assets/index_5_0.svg)' in text and '<svg' not in text
    assert 'secret = 41' not in text
    assert 'the next page (`nbs/02_next.ipynb`)' in text and '](' not in text.replace('](docs_assets/', '')
    # with a declared docs site, links and the chart are absolute addresses on it
    (proj/'pyproject.toml').write_text((proj/'pyproject.toml').read_text().replace(
        '[tool.nbdev]', f'[project.urls]\nDocumentation = "{DOC}"\n[tool.nbdev]'))
    fc.test_eq(docs_url(proj), DOC.rstrip('/'))
    text = build_readme(proj).read_text()
    assert f'[the next page]({DOC}next.html)' in text and f'![Chart: Two bars]({DOC}docs_assets/index_5_0.svg)' in text


def test_readme_links():
    nbs = Path('nbs')
    fc.test_eq(readme_link('glossary', 'reference/02_glossary.ipynb', nbs), 'glossary (`nbs/reference/02_glossary.ipynb`)')
    fc.test_eq(readme_link('router', 'reference/02_glossary.ipynb#router', nbs), 'router')   # a word: its page is named elsewhere
    fc.test_eq(readme_link('results', '../bench/RESULTS.md', nbs), 'results (`bench/RESULTS.md`)')
    fc.test_eq(readme_link('x', 'https://x.org/a.ipynb', nbs), '[x](https://x.org/a.ipynb)')
    fc.test_eq(readme_link('up', '#reproduce-test', nbs), '[up](#reproduce-test)')
    fc.test_eq(readme_link('router', 'reference/02_glossary.ipynb#router', nbs, 'https://d.org/x'),
               '[router](https://d.org/x/reference/glossary.html#router)')
    fc.test_eq(readme_snippets('text\n```python\nx = 1\n```\n```bash\nmake\n```\n```python\ny = 2\nz = 3\n```\n'),
               ['x = 1\n', 'y = 2\nz = 3\n'])


def test_saved_outputs(tmp_path):
    proj = tmp_path
    (proj/'pyproject.toml').write_text('[project]\nname = "toy"\n[tool.nbdev]\nlib_path = "toy"\ntst_flags = "notest slow"\n')
    (proj/'nbs').mkdir()
    write_nb(new_nb([mk_cell('# Outputs\n> Kept or not', cell_type='markdown'),
                     mk_cell('import altair as alt, pandas as pd\ndf = pd.DataFrame({"a": [1, 2]})\n'
                             'alt.Chart(df, title="Two bars").mark_bar().encode(x=alt.X("a:Q", title="A number"))'),
                     mk_cell('df'),
                     mk_cell('from IPython.display import HTML\nHTML("<script>alert(1)</script><b>moving</b>")'),
                     mk_cell('#| slow\nprint("slow, yet run")'),
                     mk_cell('#| notest\nprint("never run")')]), proj/'nbs'/'index.ipynb')
    save_outputs(root=proj)
    saved = read_nb(proj/'nbs'/'index.ipynb')
    outs = [c.get('outputs', []) for c in saved.cells if c.cell_type == 'code']
    fc.test_eq(sorted(outs[0][0]['data']), ['image/svg+xml', 'text/plain'])                 # the chart as SVG, no Vega-Lite
    fc.test_eq(sorted(outs[1][0]['data']), ['text/html', 'text/plain'])                     # the table
    fc.test_eq(sorted(outs[2][0]['data']), ['text/plain'])                                  # HTML with a script is dropped
    fc.test_eq(joined(outs[3][0]['text']), 'slow, yet run\n')                             # slow cells are forced on
    fc.test_eq(outs[4], [])                                                                 # notest cells are not
    text = (proj/'nbs'/'index.ipynb').read_text()
    fc.test_eq(('vegalite' in text, '<script' in str(outs), '"execution_count": null' in text), (False, False, True))
    vl = {'output_type': 'display_data', 'metadata': {},
          'data': {'application/vnd.vegalite.v5+json': {}, 'text/html': '<div id="vis"></div><script>x</script>'}}
    stream = {'output_type': 'stream', 'name': 'stdout', 'text': 'hi'}
    fc.test_eq(static_outputs([vl, stream]), [stream])
    # a failing cell writes nothing
    write_nb(new_nb([mk_cell('x = 1\nassert x == 2, "x is not 2"')]), proj/'nbs'/'bad.ipynb')
    before = (proj/'nbs'/'bad.ipynb').read_text()
    fc.test_fail(lambda: save_outputs([proj/'nbs'/'bad.ipynb'], root=proj, quiet=True),
              contains='bad.ipynb: cell 0, line 2 `assert x == 2, "x is not 2"`: AssertionError: x is not 2')
    fc.test_eq((proj/'nbs'/'bad.ipynb').read_text(), before)


def test_command_reports_broken_pages_and_builds_the_rest(tmp_path):
    proj = tmp_path
    (proj/'pyproject.toml').write_text('[project]\nname = "toy"\n[tool.nbdev]\nlib_path = "toy"\n')
    (proj/'nbs').mkdir()
    write_nb(new_nb([mk_cell('# toy\n> The home page', cell_type='markdown'), mk_cell('1 + 1')]), proj/'nbs'/'index.ipynb')
    write_nb(new_nb([mk_cell('# Broken\n> A failing check', cell_type='markdown'),
                     mk_cell('from fastcore.test import test_close\nimport numpy as np\n'
                             'test_close(np.array([1.0, 2.0]), np.array([1.0, 2.25]), eps=0.01)'),
                     mk_cell('print("not run")')]), proj/'nbs'/'02_broken.ipynb')
    (proj/'nbs'/'03_unreadable.ipynb').write_text('{"cells": [')          # not a notebook at all
    err = io.StringIO()
    with working_directory(proj), contextlib.redirect_stderr(err): code = docs_main(str(proj/'_site'), quiet=True)
    fc.test_eq(code, 1)
    lines = err.getvalue().strip().splitlines()
    assert lines[-1].startswith('docs: error: DocsError: 2 of 3 pages broken'), lines[-1]
    assert lines[1].startswith('  broken: unreadable.html: 03_unreadable.ipynb: JSONDecodeError'), lines[1]
    assert 'broken.html: 02_broken.ipynb: cell 1, line 3 `test_close(' in lines[0]
    assert lines[0].endswith('test_close: largest difference 0.25 > eps 0.01')
    assert 'The home page' in (proj/'_site'/'index.html').read_text()       # the good page is built
    page = (proj/'_site'/'broken.html').read_text()
    assert page.index('build-error') < page.index('test_close(np.array')     # the box comes before the cells
    assert 'largest difference 0.25 &gt; eps 0.01' in page
    assert 'could not be read or rendered' in (proj/'_site'/'unreadable.html').read_text()
    keep = tmp_path/'not_a_site'; keep.mkdir(); (keep/'keep.txt').write_text('x')
    fc.test_eq(docs_main(str(keep)), 1)        # refuses a folder that is not a site


def test_home_page_lists_every_notebook():
    "The home page's tables of tutorials and modules are the current ones (`make readme` rewrites them)."
    import json
    from tools.docs_notebooks import ROOT
    from tools.docs_readme import index_tables
    cells = json.loads((ROOT/'nbs'/'index.ipynb').read_text())['cells']
    text = '\n'.join(''.join(c['source']) for c in cells if c['cell_type'] == 'markdown')
    for name, table in index_tables(ROOT/'nbs').items():
        assert table in text, f'the {name} table of nbs/index.ipynb is out of date: run make readme'


def test_benchmark_figures_come_from_results(tmp_path):
    "The home page's benchmark table is RESULTS.md from its machine line on; a file without one is refused."
    from tools.docs_readme import benchmark_figures
    f = tmp_path/'RESULTS.md'
    assert 'has not written RESULTS.md' in benchmark_figures(f)
    f.write_text("# Benchmark figures\n\nWritten by make bench.\n\nmeasured on X, 2 cores\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    fc.test_eq(benchmark_figures(f), "measured on X, 2 cores\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    f.write_text(f.read_text() + "\n## Serving\n\nfigures written by hand\n")   # sections below the table stay out
    fc.test_eq(benchmark_figures(f), "measured on X, 2 cores\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    f.write_text("# Benchmark figures\n| a |\n")
    fc.test_fail(lambda: benchmark_figures(f), contains="no 'measured on' line")


def _readme():
    from tools.docs_notebooks import ROOT
    return ROOT, (ROOT/'README.md').read_text(encoding='utf-8')


def test_readme_reads_without_the_repository():
    """Every link of README.md works on a code host and in a package description: web addresses only, no relative link;
    its charts are committed image files, shown from the declared docs site (relative when none is declared)."""
    root, text = _readme()
    prose = re.sub(r'```.*?```', '', text, flags=re.S)
    links = re.findall(r'(?<!!)\[[^\]]+\]\(([^)\s]+)\)', prose)
    assert all(re.match(r'https?://|#', t) for t in links), [t for t in links if not re.match(r'https?://|#', t)]
    images = re.findall(r'!\[([^\]]+)\]\(([^)\s]+)\)', prose)
    assert images and images[0][0].startswith('Chart: '), images          # the headline chart, described in words
    site = docs_url(root)
    for _, src in images:
        if site: assert src.startswith(site + '/'), src
        else: assert (root/src).is_file(), f'{src} is not committed beside the README'


@pytest.mark.parametrize('i', range(2))
def test_readme_snippets_run_alone(i, tmp_path):
    "Each Python block of README.md runs in a fresh interpreter, outside the repository, with nothing defined before it."
    import subprocess, sys
    snippets = readme_snippets(_readme()[1])
    assert len(snippets) == 2, 'the README has another number of Python blocks: update this test'
    env = {k: v for k, v in __import__('os').environ.items() if k != 'PYTHONPATH'}
    res = subprocess.run([sys.executable, '-c', snippets[i]], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_broken_anchor_fails_the_build_unless_it_names_a_dunder_heading():
    "mkdocs misses the escaped ids of dunder headings (the browser test opens those); any other missing anchor counts."
    import logging
    assert mkdocs_config([('Home', 'index.md')], 'x', '')['validation']['anchors'] == 'warn'
    keep = _Collect()
    for link in ('app.md#rankbatcher.__call__', 'app.md#no-such-heading'):
        keep.handle(logging.LogRecord('mkdocs', logging.WARNING, '', 0, f"Doc file 'index.md' contains a link '{link}', "
                                      "but the doc 'app.md' does not contain an anchor '#x'.", None, None))
    fc.test_eq(len(keep.records), 1)
    assert 'no-such-heading' in keep.records[0]


def test_kept_outputs_are_compared_as_a_reader_sees_them():
    out = lambda text, kind='execute_result': [dict(output_type=kind, data={'text/plain': text}, metadata={})]
    cell = lambda i, text, first='x': dict(id=i, source=first, outputs=out(text) if text is not None else [])
    # numbers may differ in their last digits (another CPU's kernels), nothing else may
    assert same_text('mu 0.30000000000000004 and 2', 'mu 0.3 and 2') and not same_text('mu 0.31', 'mu 0.3')
    assert not same_text('mu 0.3 and 2', 'mu 0.3 or 2') and not same_text('0.3', '0.3 1')
    fc.test_eq(compare_outputs([cell('a', '1.0'), cell('b', 'x')], [cell('a', '1.0000000001'), cell('b', 'x')], {'a', 'b'}), [])
    diffs = compare_outputs([cell('a', 'kept'), cell('b', None)], [cell('a', 'now'), cell('b', 'new')], {'a', 'b'})
    fc.test_eq([d.split(':')[0] for d in diffs], ['code cell 0 (a)', 'code cell 1 (b)'])     # changed, and newly shown
    fc.test_eq(compare_outputs([cell('a', 'kept')], [cell('a', 'now')], set()), [])          # a cell the tests skip
    fc.test_eq(compare_outputs([cell('a', 'took 1.2 s', '#| varies')], [cell('a', 'took 3 s')], {'a'}), [])
    fc.test_eq(len(compare_outputs([cell('a', 'took 1.2 s', '#| varies')], [cell('a', None)], {'a'})), 1)
    # temporary paths, addresses and loopback ports are masked; a picture is a picture
    import tempfile
    t = tempfile.gettempdir()
    fc.test_eq(compare_outputs([cell('a', f"{t}/tmpab12/x.zip at 0x7f3a2b1c9d00 on 127.0.0.1:51234")],
                               [cell('a', f"{t}/tmpzz99/x.zip at 0x7f00aa11bb22 on 127.0.0.1:40001")], {'a'}), [])
    from tools.docs_outputs import PROJECT     # a path inside the checkout, wherever it was cloned
    fc.test_eq(compare_outputs([cell('a', "Path('/home/me/dars_nb/examples/x.toml')".replace('/home/me/dars_nb', str(PROJECT)))],
                               [cell('a', "Path('<project>/examples/x.toml')")], {'a'}), [])
    svg = lambda s: [dict(output_type='display_data', data={'image/svg+xml': s, 'text/plain': 'chart'}, metadata={})]
    fc.test_eq(compare_outputs([dict(id='a', source='', outputs=svg('<svg>1</svg>'))],
                               [dict(id='a', source='', outputs=svg('<svg>2</svg>'))], {'a'}), [])
    # library notebooks save with no flag forced (what the tests check); the pages with `slow` forced
    nbs = Path('/p/nbs')
    fc.test_eq([forced_flags(nbs / n, nbs) for n in ('01b_stats.ipynb', 'index.ipynb')], ['', 'slow'])
    fc.test_eq(forced_flags(nbs / 'tutorials' / '01_a.ipynb', nbs), 'slow')


def test_committed_readme_is_built_from_the_committed_pages(tmp_path):
    "README.md and its chart are what `make readme` makes of nbs/index.ipynb's kept outputs and bench/RESULTS.md."
    root = Path(__file__).resolve().parents[1]
    for part in ('pyproject.toml', 'nbs', 'bench/RESULTS.md'):
        copy = shutil.copytree if (root/part).is_dir() else shutil.copyfile
        (tmp_path/part).parent.mkdir(parents=True, exist_ok=True)
        copy(root/part, tmp_path/part)
    built = build_readme(tmp_path, execute=False)
    assert built.read_text() == (root/'README.md').read_text(), 'README.md is stale: run `make readme` and commit it'
    for chart in (tmp_path/README_ASSETS).glob('index_*'):
        fc.test_eq(chart.read_bytes(), (root/README_ASSETS/chart.name).read_bytes())
