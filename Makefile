# The three commands the README promises, plus the maintainer loop.
.PHONY: setup test reproduce export readme docs bench

setup:            ## one command: .venv with everything the library, its tests and docs need
	bash tools/setup.sh

# the tests and the docs run the tutorials on the benchmark data: say so at once when it is missing
NEEDS_DATA = @test -n "$$DARS_DATA" -a -d "$$DARS_DATA" || { echo "DARS_DATA must name the benchmark data folder (README: Set up, reproduce, test)" >&2; exit 2; }

test:             ## every notebook (through nbdev's runner, honouring tst_flags) and tests/
	$(NEEDS_DATA)
	.venv/bin/python -m pytest

reproduce:        ## the main job on the embedded default
	.venv/bin/dars reproduce --out report

export:           ## regenerate dars_nb/ from the notebooks and clean them
	.venv/bin/nbdev-export && .venv/bin/nbdev-clean

readme:           ## README.md (and its charts in docs_assets/) from nbs/index.ipynb
	.venv/bin/python -c "from dars_nb.docs import build_readme; build_readme()"

docs:             ## static, offline HTML site in _site/
	$(NEEDS_DATA)
	.venv/bin/dars docs --out _site

bench:            ## benchmarks with measured figures and ratios
	.venv/bin/python bench/run_all.py
