"""``python -m bench.genai`` measures what it says: the same feeding code runs rewrite's model
and the builder's, their logits compare with eager's, and the profile splits a model by part.

The benchmark runs on a 187M and a 1.24B checkpoint; here its pieces run on tiny ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench import genai


def test_parts_name_both_models_layers():
    nodes = {"/model/layers.0/attn/GroupQueryAttention": 2.0,
             "/model/layers.0/mlp/up_proj/MatMul": 3.0,
             "/model/layers.1/post_attention_layernorm/SkipLayerNorm": 0.5,
             "_inlfunc_LlamaAttention_token_6_node_linear_3": 1.0,
             "_inlfunc_LlamaMLP_node_linear_4": 4.0,
             "_inlfunc_LlamaRMSNorm_token_3_node_mul_1/SimplifiedLayerNormFusion/": 0.25,
             "/lm_head/MatMul": 7.0, "node_linear_56": 8.0}
    assert genai.parts(nodes) == {"norms": 0.75, "attention": 3.0, "MLP": 7.0, "rotary": 0.0,
                                  "rest": 15.0}


def test_same_counts_tokens_up_to_the_first_difference():
    assert genai._same([1, 2, 3, 4], [1, 2, 9, 4]) == "2 of 4"
    assert genai._same([1, 2, 3], [1, 2, 3]) == "3 of 3"
    assert genai._same(None, [1]) == "FAILED"


@pytest.mark.slow  # whole processes: two exports, eager, onnxruntime, onnxruntime-genai
def test_a_tiny_run_feeds_both_models_alike_and_matches_eager(tmp_path):
    found = genai.bench("tiny2", ["fp32"], 1, 4, tmp_path, profiled=True)
    assert not any(r.failed for r in [*found.exports.values(), *found.decoded.values()])
    for name in ("export-fp32", "builder-fp32"):
        run = found.decoded[name].runs[0]
        assert run["mean_abs"] < 1e-4 and run["top1"] == 1.0, (name, run)
        assert run["prefill_ms"] > 0 and run["decode_ms"] > 0
        assert found.og[name]["tokens"] == found.eager, name
        profile = found.profiles[name]
        assert sum(genai.parts(profile["nodes"]).values()) == pytest.approx(
            sum(profile["ops"].values()))
    text = "\n".join(genai.targets_table(found))
    assert "fp32 decode per token" in text and "fp32 prefill" in text
    # bench.accuracy: the same measurement over more prompts, the first bench.genai's
    from bench import accuracy

    models = {name: tmp_path / name for name in ("builder-fp32", "export-fp32")}
    errors = accuracy.errors(genai.checkpoint_folder("tiny2"), models, 2, 4)
    assert errors["export-fp32"][0] == pytest.approx(
        found.decoded["export-fp32"].runs[0]["mean_abs"], rel=1e-6)
    assert all(0 < e < 1e-4 for values in errors.values() for e in values), errors
    assert errors["export-fp32"][0] != errors["export-fp32"][1]  # another prompt


def test_interleaved_pairs_cancel_the_place_in_a_round():
    from bench import interleaved

    # the same model twice: whichever runs second in a round takes 1.4x (rounds alternate)
    second = np.array([[1.0, 1.4] * 8, [1.4, 1.0] * 8])
    assert interleaved.paired(second) == pytest.approx([1.0, 1.0])
    assert np.median(second[1] / second[0]) != pytest.approx(1.0)  # the old per-step ratio
    three = np.array([[1.0, 1.2, 1.5] * 4, [1.5, 1.0, 1.2] * 4, [1.2, 1.5, 1.0] * 4])
    three[1] *= 2
    assert interleaved.paired(three) == pytest.approx([1.0, 2.0, 1.0])


def test_interleaved_refuses_missing_files_and_too_few_steps_in_one_line(tmp_path, capsys):
    from bench import interleaved

    reference = tmp_path / "reference.npz"
    np.savez(reference, prompt=np.array([1, 2]), continuation=np.array([3]))
    for argv, said in [([str(tmp_path / "none.npz"), "4", str(tmp_path)], "not found: "),
                       ([str(reference), "1", str(tmp_path), str(tmp_path)],
                        "steps (1) must be at least the number of folders (2)")]:
        with pytest.raises(SystemExit) as e:
            interleaved.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err


def test_accuracy_report_compares_each_prompt_and_the_means_with_the_first_row():
    from bench import accuracy

    text = accuracy.report({"builder": [0.2, 0.4], "export": [0.1, 0.5]}, "cmd", "# h")
    assert "| 1 | 0.40000 | 0.50000 (1.2500x) |" in text
    assert "| export | 0.30000 | 1.00000x | 0.5000-1.2500 | 1 of 2 |" in text
    assert "| builder | 0.30000 | 1.00000x | 1.0000-1.0000 | 2 of 2 |" in text
    assert "| export's mean error / builder's (issue 39) | 1.00000x | <= 1x | met |" in text
    text = accuracy.report({"builder": [0.2], "export": [0.3]}, "cmd", "# h")
    assert "| export's mean error / builder's (issue 39) | 1.50000x | <= 1x | **MISSED** |" in text


def test_accuracy_refuses_a_row_without_a_model_in_one_line(tmp_path):
    from bench import accuracy

    with pytest.raises(SystemExit) as e:
        accuracy.folders("180m-fp32", [f"mine={tmp_path}"])
    assert str(e.value).startswith(f"{tmp_path}: no model.onnx")
