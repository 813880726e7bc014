"""Every code cell a tutorial, a how-to or the index shows runs when copied with the shown cells before it: no name it
reads comes only from a hidden cell (an import, a helper, a variable), which a reader copying the page never sees."""
import ast
import builtins
import json
from pathlib import Path

import pytest

NBS = Path(__file__).parent.parent / 'nbs'
PAGES = sorted([*NBS.glob('tutorials/*.ipynb'), *NBS.glob('how_to/*.ipynb'), *NBS.glob('reference/*.ipynb'), NBS / 'index.ipynb'])


def names(source: str) -> tuple:
    "(names a cell binds, names it reads) of a cell's Python; magics and shell lines left out, top-level await allowed."
    lines = [l for l in source.splitlines() if not l.lstrip().startswith(('%', '!'))]
    try: tree = ast.parse('\n'.join(lines))
    except SyntaxError: tree = ast.parse('async def _cell():\n' + '\n'.join('    ' + l for l in lines))
    bound, read = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name): (bound if isinstance(n.ctx, (ast.Store, ast.Del)) else read).add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): bound.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)): bound |= {(a.asname or a.name).split('.')[0] for a in n.names}
        elif isinstance(n, ast.arg): bound.add(n.arg)
    return bound, read


def hidden(source: str) -> bool:
    return any(l.strip().replace(' ', '') == '#|hide' for l in source.splitlines()[:3])


def needs_hidden(cells: list) -> list:
    "'cell i: names' for each shown code cell of `cells` that reads a name only a hidden cell before it binds."
    only_hidden, shown, missing = set(), set(), []
    for i, cell in enumerate(cells):
        if cell['cell_type'] != 'code': continue
        source = ''.join(cell['source'])
        bound, read = names(source)
        if hidden(source): only_hidden |= bound - shown; continue
        needs = sorted(n for n in read & only_hidden if n not in bound | shown and not hasattr(builtins, n))
        if needs: missing.append(f'cell {i}: {", ".join(needs)}')
        shown |= bound
    return missing


@pytest.mark.parametrize('page', PAGES, ids=lambda p: str(p.relative_to(NBS)))
def test_shown_cells_need_no_hidden_cell(page):
    missing = needs_hidden(json.loads(page.read_text())['cells'])
    assert not missing, f'{page.name}: shown cells read names only a hidden cell defines: ' + '; '.join(missing)


def test_a_name_from_a_hidden_cell_is_caught():
    code = lambda *lines: {'cell_type': 'code', 'source': list(lines)}
    cells = [code('#| hide\n', 'import altair as alt\n', 'u = 1'), code('alt.Chart(u)'), code('import altair as alt\n', 'alt.Chart()')]
    assert needs_hidden(cells) == ['cell 1: alt, u']
    assert needs_hidden([code('u = 1'), code('#| hide\n', 'u = 2'), code('print(u)')]) == []   # shown first: fine
