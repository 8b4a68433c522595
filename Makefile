# Every target creates .venv if needed and installs torch==2.13.0 (CPU) before anything else,
# so no later install can pull a CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

ZOO_STAMP := $(VENV)/.zoo-installed

.PHONY: install demo lint test test-all browser bench zoo fuzz matrix clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# The suite on every core (pytest-xdist), one test file per worker so that a file's fixtures
# are built once. make test leaves out the tests marked slow (pyproject.toml: markers); make
# test-all, CI and make matrix run every test. WORKERS=1 for one process.
WORKERS ?= auto
PYTEST := $(PY) -m pytest -q -n $(WORKERS) --dist loadfile

# ruff, and the layering of the package as import contracts (.importlinter)
lint: $(STAMP)
	$(PY) -m ruff check rewrite bench tests tools
	$(VENV)/bin/lint-imports

test: lint
	$(PYTEST) -m "not slow"

test-all: lint
	$(PYTEST)

# Debian's Chromium for the tests that open explain --html in a real browser (tests/
# test_html_report.py; skipped, with the reason, where it is missing) and bench.html_report.
# A test never installs anything: CI runs this target (root and apt-get).
browser:
	command -v chromium >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q --no-install-recommends chromium; }

bench: $(STAMP)
	$(PY) -m bench.run

# timm without its dependencies: they would pull torchvision (CUDA wheels); timm's models do
# not need it (tools/zoo_models.py imports timm against a stub torchvision)
$(ZOO_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[test,bench,zoo]'
	$(PY) -m pip install -q --no-deps 'timm>=1.0,<2'
	touch $(ZOO_STAMP)

zoo: $(ZOO_STAMP)
	HF_HUB_OFFLINE=1 nice $(PY) -m tools.zoo

# The full fuzzers (the suite runs a few hundred of their cases): 10,000 rule texts, 2,000
# mutated model files.
fuzz: $(STAMP)
	nice $(PY) -m tools.fuzz_rules --cases 10000 --seed 0
	nice $(PY) -m tools.fuzz_models --cases 2000 --seed 0

# The suite on each supported torch (one venv per version under .matrix/, torch first), the
# table in docs/MATRIX.md: see tools/matrix.py. MATRIX_ARGS="--versions 2.9.1 2.14.1" for some.
MATRIX_ARGS ?=
matrix:
	$(PYTHON) tools/matrix.py $(MATRIX_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache demo-out
