# Every target creates .venv if needed and installs torch==2.13.0 (CPU) before anything else,
# so no later install can pull a CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

ZOO_STAMP := $(VENV)/.zoo-installed

.PHONY: install demo test bench zoo fuzz matrix clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m ruff check rewrite bench tests
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench.run

# timm without its dependencies: they would pull torchvision (CUDA wheels); timm's models do
# not need it (bench/zoo_models.py imports timm against a stub torchvision)
$(ZOO_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[test,bench,zoo]'
	$(PY) -m pip install -q --no-deps 'timm>=1.0,<2'
	touch $(ZOO_STAMP)

zoo: $(ZOO_STAMP)
	HF_HUB_OFFLINE=1 nice $(PY) -m bench.zoo

# The suite on each supported torch (one venv per version under .matrix/, torch first), the
# table in docs/MATRIX.md: see bench/matrix.py. MATRIX_ARGS="--versions 2.9.1 2.14.1" for some.
MATRIX_ARGS ?=
matrix:
	$(PYTHON) bench/matrix.py $(MATRIX_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-out
