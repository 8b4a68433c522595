"""``rewrite export`` runs the written model in onnxruntime against eager PyTorch before it
publishes it: a model that disagrees on the documented inputs is never written (exit 1, the
output and the largest difference named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import checkpoints


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return checkpoints.write("llama", tmp_path_factory.mktemp("ckpt") / "llama")


def test_a_good_export_says_it_was_verified(llama, tmp_path, run_cli):
    r = run_cli("export", llama, "-o", tmp_path / "model.onnx")
    assert r.code == 0, r.err
    assert ("verified against eager in onnxruntime (prefill of 5 tokens and one decode "
            "step): max |difference|") in r.out + r.err
    assert (tmp_path / "model.onnx").exists()


def test_a_wrong_model_is_exit_1_and_not_written(llama, tmp_path, run_cli, monkeypatch):
    """A bug that swaps two outputs' names (a valid model, wrong by the documented I/O) is
    caught before publishing."""
    from rewrite.exporting import module

    real = module.rename_values

    def swapped(model, input_names, output_names):
        names = list(output_names)
        names[1], names[2] = names[2], names[1]  # present.0.key <-> present.0.value
        real(model, input_names, names)

    monkeypatch.setattr(module, "rename_values", swapped)
    out = tmp_path / "model.onnx"
    r = run_cli("export", llama, "-o", out)
    assert r.code == 1, r.err
    assert "disagrees with eager PyTorch: present.0." in r.err
    assert not list(tmp_path.iterdir())  # no model, no data, no staging folder
    r = run_cli("export", llama, "-o", out, "--no-verify")
    assert r.code == 0 and out.exists()  # the user's explicit choice


@pytest.mark.slow
def test_positions_the_model_computes_itself_are_caught(tmp_path, run_cli, monkeypatch):
    """RoBERTa's positions start after its padding index: a graph that forgot the offset
    (fed the documented position_ids 0, 1, ...) disagrees with the model's own call: exit 1,
    no file."""
    from rewrite.exporting.checkpoint import cache

    monkeypatch.setattr(cache, "position_offset", lambda model: 0)
    folder = checkpoints.write("roberta", tmp_path / "roberta")
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    r = run_cli("export", folder, "-o", out)
    assert r.code == 1, r.err
    assert "disagrees with eager PyTorch: logits (prefill) differs by up to" in r.err
    assert not list(out.parent.iterdir())


def test_a_model_onnxruntime_refuses_is_exit_1_and_not_written(llama, tmp_path, run_cli,
                                                               monkeypatch):
    """A bug that writes an invalid node (a ``Constant`` without a value, as a function's
    attribute reference its call does not set leaves one) is not published as "not
    verified": onnxruntime refuses to load it, the export fails, nothing is written."""
    import onnx_ir as ir

    from rewrite.exporting import module

    real = module.rename_values

    def broken(model, input_names, output_names):
        real(model, input_names, output_names)
        first = next(iter(model.graph))
        empty = ir.node("Constant", inputs=[], attributes={}, name="no_value")
        model.graph.insert_before(first, empty)

    monkeypatch.setattr(module, "rename_values", broken)
    out = tmp_path / "model.onnx"
    r = run_cli("export", llama, "-o", out, "--trace", "whole")
    assert r.code == 1, r
    assert "onnxruntime refuses the exported model as invalid" in r.err, r.err
    assert not out.exists() and not out.with_name("model.onnx.data").exists()


ORT_1_20_REFUSAL = (
    "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Failed to load model with error: "
    "/onnxruntime_src/onnxruntime/core/graph/model_load_utils.h:46 void onnxruntime::"
    "model_load_utils::ValidateOpsetForDomain(const std::unordered_map<std::__cxx11::"
    "basic_string<char>, int>&, const onnxruntime::logging::Logger&, bool, const std::string&, "
    "int) ONNX Runtime only *guarantees* support for models stamped with official released "
    "onnx opset versions. Opset 23 is under development and support for this is limited. The "
    "operator schemas and or other functionality may change before next ONNX release and in "
    "this case ONNX Runtime will not guarantee backward compatibility. Current official "
    "support for domain ai.onnx is till opset 21.")
"""What onnxruntime 1.20.0 raises on an opset-23 model (its message, verbatim)."""


def test_an_onnxruntime_older_than_the_opset_is_named_not_taken_for_a_bug(
        llama, tmp_path, run_cli, monkeypatch):
    """onnxruntime before 1.23 reads opsets up to 21 or 22: the export says which release
    checks and runs its opset-23 model (verify.MIN_ONNXRUNTIME), instead of calling it
    invalid."""
    import onnx
    import onnxruntime

    class Refusal(Exception):
        pass

    def refuses(*args, **kwargs):
        raise Refusal(ORT_1_20_REFUSAL)

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuses)
    monkeypatch.setattr(onnxruntime, "__version__", "1.20.0")
    out = tmp_path / "model.onnx"
    r = run_cli("export", llama, "-o", out)
    assert r.code == 0, r.err
    opset = {o.domain: o.version for o in onnx.load(str(out)).opset_import}[""]
    assert opset == 23
    assert (f"not verified against eager: onnxruntime 1.20.0 reads ai.onnx opsets up to 21, "
            f"this model is opset {opset} (pip install 'onnxruntime>=1.31' to check and run "
            "it)") in r.out + r.err


def test_onnxruntime_failing_to_run_the_model_is_named_and_nothing_is_written(
        llama, tmp_path, run_cli, monkeypatch):
    """A kernel raising while the check runs the file (onnxruntime 1.24's ``Attention`` on
    Doge's mask did) names onnxruntime and its version, exit 3, nothing written."""
    import onnxruntime

    class RuntimeException(Exception):
        pass

    def raises(self, *args, **kwargs):
        raise RuntimeException("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status "
                               "code returned while running Attention node.")

    monkeypatch.setattr(onnxruntime.InferenceSession, "run", raises)
    out = tmp_path / "model.onnx"
    r = run_cli("export", llama, "-o", out)
    assert r.code == 3, r.err
    assert (f"onnxruntime {onnxruntime.__version__} failed running the exported model "
            "(prefill): RuntimeException: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION") in r.err
    assert "internal error" not in r.err
    assert not out.exists() and not out.with_name("model.onnx.data").exists()
