"""Correctness tools, and what the test suite (tests/) and the benchmarks (bench/) share.

Both import from here; neither imports the other, and nothing here imports either
(``tests/test_code_limits.py`` checks it). Run from the repository's root:

=======================================  ========================================================
``python -m tools.fuzz_rules``           fuzz the rules front end (``make fuzz``)
``python -m tools.fuzz_models``          fuzz model files: mutated exports (``make fuzz``)
``python -m tools.mutants``              deliberate wiring bugs the suite must catch
``python3 tools/matrix.py``              the suite on every supported torch (``make matrix``)
``python -m tools.zoo``                  rewrite on many architectures (``make zoo``)
``python -m tools.output_hashes``        sha256 of rewrite's outputs: a refactor changes none
=======================================  ========================================================

Shared pieces: :mod:`tools.models` (small random-weight models), :mod:`tools.zoo_models`,
:mod:`tools.synthetic` (transformer-shaped FX graphs of any size), :mod:`tools.browser`
(headless Chromium), :mod:`tools.feeds` (onnxruntime inputs), :mod:`tools.ort_worker`,
:mod:`tools.model_mutations`.
"""
