"""House metrics of the notebooks and modules: export-cell size, definitions per cell, function length, long lines,
`test_eq(bool)`, and how a notebook reads: definitions followed by an example or test, runs of exported cells, cells
of private helpers only, example cells with an output, files over 500 lines (the package and `tools/`).

The house a newcomer walks: example cells in the library notebooks that keep their output, tests that repeat their
example's call instead of asserting on it, modules lying flat at the top of the package, imports that cross into
another chapter for a helper that belongs elsewhere, records that travel as positional tuples, and prose cells over
200 words. Each is printed with its goal.

Run: python tools/house_metrics.py [--list]   (from the project root)"""
import ast, json, re, statistics, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPORT = re.compile(r'^#\|\s*export')

def notebooks(): return sorted(p for p in (ROOT/'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)

def code_cells(nb):
    for c in json.loads(nb.read_text())['cells']:
        if c['cell_type'] == 'code': yield ''.join(c['source'])

def body(src): return [l for l in src.splitlines() if not l.startswith('#|')]

def definitions(src):
    try: tree = ast.parse('\n'.join(l for l in body(src) if not l.lstrip().startswith(('%', '!'))))
    except SyntaxError: return 0
    return sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in tree.body)

def defined_names(src):
    "Names of the top-level functions and classes a cell defines (a `@patch`ed method counts as its function)."
    try: tree = ast.parse('\n'.join(l for l in body(src) if not l.lstrip().startswith(('%', '!'))))
    except SyntaxError: return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]

def is_export(src): return bool(src.splitlines()) and bool(EXPORT.match(src.splitlines()[0]))

def reading_order(nbs):
    "Per notebook, its code cells in order as (is exported, names defined, has an output)."
    out = {}
    for nb in nbs:
        cells = [c for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code']
        out[nb] = [(is_export(''.join(c['source'])), defined_names(''.join(c['source'])), bool(c.get('outputs')))
                   for c in cells]
    return out

def layout_metrics(order):
    "Definitions followed by an example/test before the next exported cell, runs of exported cells, private-only cells."
    followed = {'all': [0, 0], 'public': [0, 0]}; runs, private_only, def_cells, examples, kept = [], 0, 0, 0, 0
    worst = ('', 0)
    for nb, cells in order.items():
        run = 0
        for i, (exp, names, has_out) in enumerate(cells):
            if not exp:
                examples += 1; kept += has_out
                if run >= 5: runs.append(run)
                if run > worst[1]: worst = (nb.name, run)
                run = 0; continue
            run += 1
            if not names: continue
            def_cells += 1; private_only += all(n.startswith('_') for n in names)
            ok = i + 1 < len(cells) and not cells[i + 1][0]    # the very next code cell is an example or a test
            for n in names:
                for k in ('all', 'public') if not n.startswith('_') else ('all',):
                    followed[k][0] += ok; followed[k][1] += 1
        if run >= 5: runs.append(run)
        if run > worst[1]: worst = (nb.name, run)
    return dict(followed=followed, runs=runs, worst=worst, private_only=private_only, def_cells=def_cells,
                examples=examples, kept=kept)

def functions(path):
    tree = ast.parse(path.read_text())
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)): yield n.name, n.end_lineno - n.lineno + 1

def _module_name(path):
    rel = path.relative_to(ROOT).with_suffix('')
    return '.'.join(rel.parts[:-1] if rel.name == '__init__' else rel.parts)

def import_graph():
    "{module: modules of the package it imports} (every import statement, at any depth)."
    graph = {}
    for p in (ROOT/'dars_nb').rglob('*.py'):
        name, deps = _module_name(p), set()
        pkg = name if p.name == '__init__.py' else name.rsplit('.', 1)[0]
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Import): deps |= {a.name for a in n.names if a.name.startswith('dars_nb')}
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ''
                if n.level: base = '.'.join(pkg.split('.')[:len(pkg.split('.')) - n.level + 1] + ([base] if base else []))
                if base.startswith('dars_nb'): deps.add(base)
        graph[name] = {d for d in deps if d != name}
    return graph

def private_imports():
    "(module, imported module, name) for every private name a module imports from another module of the package."
    out = []
    for p in (ROOT/'dars_nb').rglob('*.py'):
        name = _module_name(p)
        pkg = name if p.name == '__init__.py' else name.rsplit('.', 1)[0]
        for n in ast.walk(ast.parse(p.read_text())):
            if not isinstance(n, ast.ImportFrom): continue
            base = n.module or ''
            if n.level: base = '.'.join(pkg.split('.')[:len(pkg.split('.')) - n.level + 1] + ([base] if base else []))
            if base.startswith('dars_nb') and base != name:
                out += [(name, base, a.name) for a in n.names if a.name.startswith('_') and not a.name.startswith('__')]
    return sorted(out)

def import_cycles(graph):
    "Strongly connected groups of more than one module (Tarjan)."
    index, low, stack, on, out, i = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = i[0]; i[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in graph: continue
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in graph:
        if v not in index: visit(v)
    return out

# The house a newcomer walks
def library_notebooks():
    "The numbered notebooks of the library (not the home page, tutorials, how-to or reference pages)."
    return sorted(p for p in (ROOT/'nbs').glob('[0-9]*.ipynb'))

def _parsed(src):
    try: return ast.parse('\n'.join(l for l in body(src) if not l.lstrip().startswith(('%', '!'))))
    except SyntaxError: return None

def _is_test_stmt(n) -> bool:
    "An assert, or a call of a `test_*` function."
    if isinstance(n, ast.Assert): return True
    return (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
            and n.value.func.id.startswith('test_'))

def example_cells(nb):
    "(cell, its parsed body) of the example cells: code cells neither exported nor hidden, not only imports or tests."
    for c in json.loads(nb.read_text())['cells']:
        if c['cell_type'] != 'code': continue
        src = ''.join(c['source']); first = src.splitlines()[0] if src.splitlines() else ''
        if EXPORT.match(first) or re.match(r'^#\|\s*hide', first): continue
        tree = _parsed(src)
        if tree is None or not tree.body: continue
        if all(isinstance(n, (ast.Import, ast.ImportFrom)) or _is_test_stmt(n) for n in tree.body): continue
        yield c, tree

def outputs_kept():
    "(example cells that keep an output, example cells) over the library notebooks."
    kept = total = 0
    for nb in library_notebooks():
        for c, _ in example_cells(nb): total += 1; kept += bool(c.get('outputs'))
    return kept, total

def _calls(tree):
    return {ast.dump(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}

def repeated_calls():
    "(notebook, call) where a test cell calls again, with the same arguments, the call its example cell just showed."
    out = []
    for nb in library_notebooks():
        cells = [c for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code']
        for a, b in zip(cells, cells[1:]):
            ta, tb = _parsed(''.join(a['source'])), _parsed(''.join(b['source']))
            if not (ta and tb and ta.body and isinstance(ta.body[-1], ast.Expr)): continue
            if not any(_is_test_stmt(n) for n in tb.body): continue
            shown = ta.body[-1].value
            shown = shown.elts if isinstance(shown, ast.Tuple) else [shown]
            again = _calls(tb)
            out += [(nb.name, ast.unparse(e)) for e in shown if isinstance(e, ast.Call) and ast.dump(e) in again]
    return out

FLAT_EXEMPT = {'__init__.py', '__main__.py', '_modidx.py'}

def flat_modules():
    "Modules at the top of `dars_nb/` (the package's own __init__, __main__ and index aside)."
    return sorted(p.stem for p in (ROOT/'dars_nb').glob('*.py') if p.name not in FLAT_EXEMPT)

# Imports that went into another chapter for a helper that belongs elsewhere (each checked by name)
CROSS_ROOM = {
    "serve takes the λ-in-the-model-name convention from calibration": ('dars_nb.serve.requests', 'dars_nb.bundle.calibrate'),
    "serve takes native thread pools from the routers' base": ('dars_nb.serve.app', 'dars_nb.routers.base'),
    "format_options from the release reader": (None, 'dars_nb.sources.release', 'format_options'),
    "load_observations from the release reader": (None, 'dars_nb.sources.release', 'load_observations'),
    "collect holds a module nothing in collect uses": ('dars_nb.collect.local',),
}

def _imported_names(path):
    "(module imported, name) for every `from … import name` of a module, relative imports resolved."
    name = _module_name(path)
    pkg = name if path.name == '__init__.py' else name.rsplit('.', 1)[0]
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.ImportFrom):
            base = n.module or ''
            if n.level: base = '.'.join(pkg.split('.')[:len(pkg.split('.')) - n.level + 1] + ([base] if base else []))
            for a in n.names: yield base, a.name

def cross_room_imports():
    "The named cross-chapter imports still present."
    files = {_module_name(p): p for p in (ROOT/'dars_nb').rglob('*.py') if p.name != '_modidx.py'}
    graph = import_graph()
    found = []
    for what, rule in CROSS_ROOM.items():
        if len(rule) == 1:
            if rule[0] in files: found.append(what)
        elif rule[0] is not None:
            if rule[1] in graph.get(rule[0], ()): found.append(what)
        elif any((rule[1], rule[2]) in set(_imported_names(p)) for m, p in files.items() if m != rule[1]):
            found.append(what)
    return found

def positional_records():
    """Tuples of 4 or more values returned, and calls with 6 or more positional arguments, in the package. An array
    shape (a `shape` property, as numpy's own) is a tuple by convention, not a record."""
    out = []
    for p in (ROOT/'dars_nb').rglob('*.py'):
        if p.name == '_modidx.py': continue
        tree = ast.parse(p.read_text())
        shapes = {id(r) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == 'shape'
                  for r in ast.walk(f) if isinstance(r, ast.Return)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple) and len(n.value.elts) >= 4 and id(n) not in shapes:
                out.append((str(p.relative_to(ROOT)), n.lineno, f'returns a {len(n.value.elts)}-tuple'))
            if isinstance(n, ast.Call) and sum(not isinstance(a, ast.Starred) for a in n.args) >= 6:
                out.append((str(p.relative_to(ROOT)), n.lineno, f'{ast.unparse(n.func)} with {len(n.args)} positional arguments'))
    return sorted(out)

def long_prose(limit: int = 200):
    "(notebook, words) of the markdown cells over `limit` words in the library notebooks."
    out = []
    for nb in library_notebooks():
        for c in json.loads(nb.read_text())['cells']:
            if c['cell_type'] == 'markdown':
                words = len(re.findall(r"[\w'’-]+", ''.join(c['source'])))
                if words > limit: out.append((nb.name, words))
    return out

def house(listing=False):
    kept, total = outputs_kept()
    print(f"example cells in library notebooks that keep an output: {kept / max(total, 1):.0%} of {total} (goal >= 60 %)")
    rep = repeated_calls()
    print(f"test cells that repeat their example's call: {len(rep)} (goal: none)"
          + (''.join(f"\n  {nb}: {call[:80]}" for nb, call in rep) if listing else ''))
    flat = flat_modules()
    print(f"modules flat at the top of dars_nb/: {len(flat)} (goal <= 12): {', '.join(flat)}")
    cross = cross_room_imports()
    print(f"cross-chapter imports of a helper that belongs elsewhere: {len(cross)} of {len(CROSS_ROOM)} (goal: none)"
          + ''.join(f"\n  {w}" for w in cross))
    rec = positional_records()
    print(f"records as positional tuples (returns of 4+ values, calls with 6+ positional arguments): {len(rec)} (goal: none)"
          + ''.join(f"\n  {p}:{l} {w}" for p, l, w in rec))
    prose = long_prose()
    print(f"prose cells over 200 words in library notebooks: {len(prose)} (goal: none)"
          + ''.join(f"\n  {nb}: {w} words" for nb, w in prose))

def main(listing=False):
    sizes, defs, long_lines, code_lines, bool_eq, test_lines = [], [], 0, 0, 0, 0
    for nb in notebooks():
        for src in code_cells(nb):
            lines = body(src)
            code_lines += len(lines); long_lines += sum(len(l) > 100 for l in lines)
            if src.splitlines() and EXPORT.match(src.splitlines()[0]):
                sizes.append(len(lines)); defs.append(definitions(src))
                if listing and (len(lines) > 40 or defs[-1] >= 3): print(f'  cell {len(lines):4d} lines {defs[-1]} defs  {nb.name}: {lines[0][:60] if lines else ""}')
            else:
                tl = [l for l in lines if re.search(r'\btest_\w+\(', l)]
                test_lines += len(tl); bool_eq += sum(bool(re.search(r'test_eq\(.*,\s*(True|False)\)\s*$', l)) for l in tl)
    files = [p for p in sorted((ROOT/'dars_nb').rglob('*.py')) + sorted((ROOT/'tools').glob('*.py')) if p.name != '_modidx.py']
    fns = [(p.relative_to(ROOT), n, k) for p in files for n, k in functions(p)]
    if listing:
        for p, n, k in sorted(fns, key=lambda t: -t[2]):
            if k > 40: print(f'  function {k:4d} lines  {p}:{n}')
    print(f"export cells: {len(sizes)}, median lines {statistics.median(sizes)}, over 40 lines {sum(s > 40 for s in sizes)/len(sizes):.0%}, "
          f">= 3 definitions {sum(d >= 3 for d in defs)/len(defs):.0%}")
    print(f"functions over 40 / over 60 lines: {sum(k > 40 for *_, k in fns)} / {sum(k > 60 for *_, k in fns)}")
    print(f"notebook code lines over 100 characters: {long_lines/code_lines:.1%} of {code_lines}")
    print(f"test_eq(<bool>, True/False) lines: {bool_eq} of {test_lines} test lines")
    lay = layout_metrics(reading_order(notebooks()))
    pct = lambda k: lay['followed'][k][0] / max(lay['followed'][k][1], 1)
    print(f"exported definitions followed by an example or test: {pct('all'):.0%} of {lay['followed']['all'][1]} "
          f"(goal >= 55 %); public only {pct('public'):.0%} of {lay['followed']['public'][1]} (goal >= 70 %)")
    print(f"runs of >= 5 exported cells with no other code cell between: {len(lay['runs'])} "
          f"(longest {lay['worst'][1]}, {lay['worst'][0]}; goal: none over 4)")
    print(f"definition cells holding only private helpers: {lay['private_only'] / max(lay['def_cells'], 1):.0%} of {lay['def_cells']}")
    print(f"example cells that keep an output: {lay['kept'] / max(lay['examples'], 1):.0%} of {lay['examples']}")
    big = [(p.relative_to(ROOT), len(p.read_text().splitlines())) for p in files]
    print(f"files over 500 lines (dars_nb/ and tools/): {sum(k > 500 for _, k in big)}"
          + ''.join(f"\n  {k:5d}  {p}" for p, k in sorted(big, key=lambda t: -t[1]) if k > 500))
    priv = private_imports()
    print(f"private names imported from another module: {len(priv)}"
          + ''.join(f"\n  {m} <- {b}.{n}" for m, b, n in priv))
    cycles = import_cycles(import_graph())
    print(f"import cycles in dars_nb: {cycles if cycles else 'none'}")

if __name__ == '__main__':
    main('--list' in sys.argv)
    house('--list' in sys.argv)
