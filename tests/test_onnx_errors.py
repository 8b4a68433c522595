"""The one error rule of the ONNX backend (docs/ARCHITECTURE.md, "Errors"): unusable input is
an ``InputError`` (exit 2); a library failing on a valid program is its own type with the
library's exception chained (shown with ``-v``); a bug in rewrite's own code surfaces (exit 3).
"""

from __future__ import annotations

import pytest

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from rewrite.errors import InputError, LibraryError
from tests.onnx_fixtures import MODULARIZE


def test_an_optimizer_failure_is_onnxscripts_exit_3_with_its_cause(shared_program, monkeypatch):
    """The optimizer runs on rewrite's own, valid program: its failure is the library's
    (exit 3, onnxscript and its version named), never the input's (exit 2)."""
    from rewrite.backends.onnx.finishing import _optimize as optimize_module

    def broken(model, **_):
        raise RuntimeError("folding exploded")

    monkeypatch.setattr(optimize_module, "optimize_ir", broken)
    with pytest.raises(LibraryError, match=r"onnxscript \S+ failed optimizing function ") as e:
        lower(rewrite.apply(MODULARIZE, shared_program))
    assert e.value.exit_code == 3 and not isinstance(e.value, InputError)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert str(e.value.__cause__) == "folding exploded"


def test_a_bug_in_rewrite_while_optimizing_is_not_the_optimizers(shared_program, monkeypatch):
    """An error raised in rewrite's own code around the optimizer (here: a call with the wrong
    arguments) surfaces as it is (exit 3, a bug in rewrite), not as "onnxscript failed"
    (with the advice to turn the optimizer off)."""
    from rewrite.backends.onnx.finishing import _optimize as optimize_module
    from rewrite.errors import first_line

    monkeypatch.setattr(optimize_module, "_optimize_body", first_line)  # one argument, not two
    with pytest.raises(Exception) as e:
        lower(rewrite.apply(MODULARIZE, shared_program))
    assert not isinstance(e.value, (InputError, LibraryError))  # exit 3, "internal error"
    assert "OptimizeBodies" in str(e.value)  # the finishing pass that failed, named
    assert isinstance(e.value.__cause__, TypeError)


def _exporter_apis_changed(monkeypatch):
    from rewrite._private import torch_exporter

    monkeypatch.setattr(torch_exporter, "available", lambda: "_core.renamed is gone")


def test_changed_private_apis_are_unavailable_not_unsupported(shared_program, monkeypatch):
    """The per-body path's check raises the private-API layer's own type, not a program
    shape error rebuilt from its text."""
    from rewrite._private.errors import Unavailable
    from rewrite.backends.onnx.lowering import check

    _exporter_apis_changed(monkeypatch)
    with pytest.raises(Unavailable, match=r"private exporter APIs changed \(_core.renamed"):
        check(shared_program)


def test_a_fallback_keeps_the_exception_behind_it(shared_program, monkeypatch, run_cli,
                                                  shared_pt2, tmp_path):
    """The flat fallback's warning carries what the per-body strategy raised; ``-v`` shows its
    traceback, without ``-v`` one line."""
    from rewrite._private.errors import Unavailable

    _exporter_apis_changed(monkeypatch)
    lowering = lower(rewrite.apply(MODULARIZE, shared_program), OnnxOptions(optimize=False))
    (warning,) = lowering.warnings
    assert lowering.path == "flat"
    assert isinstance(warning.cause, Unavailable)
    with pytest.raises(InputError, match="cannot lower this program per body") as e:
        lower(rewrite.apply(MODULARIZE, shared_program), OnnxOptions(lowering="per-body"))
    assert isinstance(e.value.__cause__, Unavailable)

    quiet = run_cli("apply", MODULARIZE, shared_pt2, "-o", tmp_path / "a.onnx", "--no-optimize")
    verbose = run_cli("-v", "apply", MODULARIZE, shared_pt2, "-o", tmp_path / "b.onnx",
                      "--no-optimize")
    assert quiet.code == verbose.code == 0, (quiet, verbose)
    assert "per-body lowering is not possible" in quiet.err and "Traceback" not in quiet.err
    assert "Traceback" in verbose.err and "Unavailable: torch's private exporter" in verbose.err


def test_the_inlining_loop_stops_when_it_does_not_grow(shared_program, monkeypatch):
    """The loop's progress check is a real error (``python -O`` would drop an assert and loop
    forever)."""
    from rewrite.backends.onnx import _standins, pipeline

    monkeypatch.setattr(pipeline, "_translate_and_outline",
                        lambda *_: _standins.MustInline({1}, "cannot stand in"))
    with pytest.raises(RuntimeError, match=r"calls to inline found again: \[1\]"):
        lower(rewrite.apply(MODULARIZE, shared_program), OnnxOptions(lowering="per-body"))
