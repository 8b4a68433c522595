"""Programs using another library's custom operator: loading names the operator and the way
to register it (``--import MODULE``); torch.onnx's failure to translate it shows its cause."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

import rewrite
from tests.test_bad_input import assert_refused, listing

HELPER = "tests.custom_op_helper"
OP = "torch.ops.rewrite_test.scale2.default"


def _drop_helper() -> None:
    helper = sys.modules.pop(HELPER, None)
    if helper is not None:
        helper.unregister()


@pytest.fixture
def scaled_pt2(tmp_path):
    """A .pt2 using the helper's operator, saved while registered; unregistered afterwards,
    as in a fresh process that never imported the library."""
    helper = importlib.import_module(HELPER)
    program = torch.export.export(helper.Scaled().eval(), (torch.randn(2, 4),))
    path = tmp_path / "scaled.pt2"
    torch.export.save(program, str(path))
    _drop_helper()
    assert not hasattr(torch.ops.rewrite_test, "scale2")
    yield path
    _drop_helper()  # what --import registered


def test_unregistered_custom_op_is_one_line_naming_it(run_cli, scaled_pt2):
    r = run_cli("explain", "modularize", scaled_pt2)
    assert_refused(r, 2, f"{scaled_pt2}: the program uses the custom operator {OP}, which is "
                   "not registered")
    assert "rewrite --import MODULE" in r.err and len(r.err) < 400
    with pytest.raises(rewrite.InputError, match="custom operator torch.ops.rewrite_test"):
        rewrite.apply(rewrite.load_rules("modularize"), scaled_pt2)


def test_import_option_registers_it(run_cli, scaled_pt2):
    r = run_cli("explain", "modularize", scaled_pt2, "--import", HELPER)
    assert r.code == 0, r
    assert "proj" in r.out and "Linear" in r.out


def test_import_of_a_missing_module_is_an_input_error(run_cli, scaled_pt2):
    r = run_cli("explain", "modularize", scaled_pt2, "--import", "tests.no_such_helper")
    assert_refused(r, 2, "--import tests.no_such_helper: no module named 'tests.no_such_helper'")


def test_torch_onnx_failure_shows_its_cause(run_cli, scaled_pt2, tmp_path):
    """torch.onnx has no translation for the operator: the cause is shown, and that torch's
    exporter (not the rules) failed; no traceback, no output file."""
    out = tmp_path / "out.onnx"
    r = run_cli("apply", "modularize", scaled_pt2, "--import", HELPER, "-o", out)
    assert r.code == 2, r
    assert "Traceback" not in r.err and "\x1b[" not in r.err
    lines = r.err.splitlines()
    if lines[0].startswith("torch.onnx: decomposing each distinct body once: done in "):
        lines = lines[1:]  # the per-body path decomposed it; translating it failed
    assert lines[0] == ("torch.onnx.export cannot convert this program: torch's ONNX exporter, "
                        "not the rules, failed at step 3/3 (convert the exported program to an "
                        "ONNX model)")
    assert lines[-1].startswith("  cause: DispatchError: No ONNX function found for "
                                "<OpOverload(op='rewrite_test.scale2', overload='default')>")
    assert len(lines) <= 5
    assert listing(tmp_path) == ["scaled.pt2"]


def test_a_failed_decomposition_shows_the_view_error_under_it():
    """Step 2 (decomposition) fails with torch's own wrapper text around the real cause, as
    torch.onnx.export raises it (its message constants and exception summary)."""
    from torch.onnx._internal.exporter import _core, _errors

    from rewrite.backends.onnx.lowering._torch_failure import torch_onnx_failure

    cause = RuntimeError("Cannot view a tensor with shape [2, 8] and strides [1, 2] as a tensor "
                         "with shape (16,)!\nFurther details: ...")
    try:
        try:
            raise cause
        except RuntimeError as e:
            raise _errors.ConversionError(
                _core._STEP_TWO_ERROR_MESSAGE + _core._summarize_exception_stack(e)) from e
    except _errors.ConversionError as e:
        error = torch_onnx_failure(e)
    assert isinstance(error, rewrite.InputError)
    assert str(error).splitlines() == [
        "torch.onnx.export cannot convert this program: torch's ONNX exporter, not the rules, "
        "failed at step 2/3 (decompose the FX graph for ONNX compatibility)",
        "  cause: RuntimeError: Cannot view a tensor with shape [2, 8] and strides [1, 2] as a "
        "tensor with shape (16,)!",
    ]
