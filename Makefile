# The README's two commands (`make reproduce`, `make test`) each set up .venv first when it is missing
# or older than the files that define it; the others are the maintainer loop.
.PHONY: setup test reproduce export readme docs bench outputs dist

VENV = .venv/.setup-done

$(VENV): pyproject.toml tools/setup.sh tools/constraints.txt
	bash tools/setup.sh
	touch $@

setup:            ## (re)create .venv: the library with every extra, its tests and docs tools
	bash tools/setup.sh
	touch $(VENV)

reproduce: $(VENV) ## the main job on the embedded simulator default
	.venv/bin/dars reproduce --out report

test: $(VENV)     ## every notebook (through nbdev's runner, honouring tst_flags) and tests/, on two workers
	.venv/bin/python -m pytest -n 2 --dist loadgroup --max-worker-restart=0 --durations=25

export: $(VENV)   ## regenerate dars_nb/ from the notebooks and clean them
	.venv/bin/nbdev-export && .venv/bin/nbdev-clean

readme: $(VENV)   ## README.md from nbs/index.ipynb
	.venv/bin/python tools/docs.py --readme

docs: $(VENV)     ## static, offline HTML site in _site/
	.venv/bin/python tools/docs.py --out _site

bench: $(VENV)    ## benchmarks: figures and ratios, written with date and machine to bench/RESULTS.md and the README
	.venv/bin/python bench/run_all.py --markdown bench/RESULTS.md
	.venv/bin/python tools/docs.py --readme

outputs: $(VENV)  ## run every notebook and keep its static outputs (SVG/PNG/text/tables) in it; NBS=a.ipynb,b.ipynb for some
	.venv/bin/python tools/docs.py --outputs $(if $(NBS),--only $(NBS))

dist: $(VENV)     ## the sdist and the wheel an index takes, in dist/, checked by twine
	rm -rf dist && .venv/bin/python -m build --outdir dist && .venv/bin/twine check --strict dist/*
