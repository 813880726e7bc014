"""Build the offline documentation site and the README from the notebooks — no Quarto, no network.

Every notebook becomes a page of a static mkdocs site (navigation, offline search, charts as SVG, math
as MathML), `nbs/index.ipynb` becomes `README.md` (its charts as image files in `docs_assets/`), and every
notebook keeps static outputs. A notebook's cells are run with execnb's shell under the
flag rules of nbdev's test runner (`tst_flags`, as the tests run them), or not at all with
`build_docs(execute=False)`, which renders the stored outputs; a failing cell names the notebook, the
failing line and the assertion, the other pages are still built, and the build exits 1.

    python tools/docs.py --out _site        # the site (`make docs`)
    python tools/docs.py --readme           # README.md from nbs/index.ipynb (`make readme`)
    python tools/docs.py --outputs          # static outputs kept in every notebook (`make outputs`)
    python tools/docs.py --outputs --only nbs/01b_stats.ipynb,nbs/02_diagnostics.ipynb   # in these only

The work is done by five modules, one idea each: `docs_notebooks` (running a notebook as the tests do),
`docs_pages` (a notebook as a Markdown page), `docs_site` (the mkdocs site), `docs_readme` (the README),
`docs_outputs` (saved outputs). This is tooling of the project, not part of the library: it needs the
`dev` extra (nbdev, execnb, mkdocs-material, nbconvert, latex2mathml).
"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # `tools` importable when run as a script
from fastcore.script import call_parse
from tools.docs_readme import build_readme
from tools.docs_outputs import save_outputs
from tools.docs_site import docs_main

@call_parse
def main(out: str = '_site', # folder for the site
         readme: bool = False, # write README.md from nbs/index.ipynb instead of the site
         outputs: bool = False, # run the notebooks and keep their static outputs in them instead
         only: str = '', # with --outputs: these notebooks only (comma-separated paths; default: every page)
         quiet: bool = False, # no progress lines
        ):
    "Build the offline docs site (default), the README, or the saved outputs of the home page and tutorials."
    if readme: return print(build_readme())
    if outputs:
        save_outputs([p for p in only.split(',') if p.strip()] or None, quiet=quiet)
        return
    sys.exit(docs_main(out, quiet))
