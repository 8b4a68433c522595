"""Broken model files: a fast subset of ``python -m tools.fuzz_models`` (2,000+ cases), plus
the cases earlier runs found, as regression tests.

Every case ends in exit 0 with an output that passes the full ONNX checker and computes what
the input computes, or in exit 1/2 with a short message, no traceback and no file left."""

from __future__ import annotations

import random

import pytest

from tools.fuzz_models import build_bases, fuzz, run_cli
from tools.model_mutations import mutate_onnx, mutate_pt2


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-models")
    return {b.name: b for b in build_bases(folder, ("gpt2", "shared", "shared.pt2",
                                                   "staged.pt2"))}


@pytest.mark.slow  # a fuzzer (python -m tools.fuzz_models runs 2,000 cases)
def test_mutated_models_end_in_a_valid_output_or_a_clear_refusal(bases):
    outcomes = fuzz(list(bases.values()), 48, seed=16, pt2_share=0.1)
    assert [o.finding for o in outcomes if o.finding] == []
    codes = {o.code for o in outcomes}
    assert {0, 2} <= codes  # the subset reaches both outputs and refusals
    done = [o for o in outcomes if o.code == 0]
    uncompared = [o.mutation for o in done if not o.compared]
    assert len(uncompared) <= 0.1 * len(done), uncompared  # the rest only passed the checker


@pytest.mark.slow
def test_split_by_tags_cases_reach_the_split(bases):
    """The stage-tagged model's ``split_by_tags`` cases are split (exit 0, compared with
    eager), not refused for want of a tag."""
    outcomes = fuzz([bases["staged.pt2"]], 6, seed=3, pt2_share=1.0)
    assert [o.finding for o in outcomes if o.finding] == []
    split = [o for o in outcomes if o.rules == "split_by_tags"]
    assert any(o.code == 0 and o.compared for o in split), outcomes


def _first_case(base, mutate, wanted: str, tmp_path):
    """The input file of the first seed whose mutation is ``wanted``."""
    model = tmp_path / f"input{base.path.suffix}"
    for seed in range(500):
        if mutate(base.path.read_bytes() if base.path.suffix == ".onnx" else base.path,
                  random.Random(seed), model).startswith(wanted):
            return model
    raise AssertionError(f"no seed makes {wanted}")


@pytest.mark.parametrize("where, before, after, reason", [
    ("a metadata key", b".InputSpec.kind", b".Inp\xf5tSpec.kind",
     "'<' not supported between instances of 'str' and 'bytes'"),
    ("a name_scopes value", b"['', 'h.0", b"['', '\xf5.0",
     "'utf-8' codec can't decode byte 0xf5 in position 6: invalid start byte"),
    ("the graph signature", b"target='", b"t\xf5rget='",
     "'utf-8' codec can't decode byte 0xf5 in position 35: invalid start byte"),
    ("a stack trace", b'File "transformers/', b'File "\xf5ransformers/',
     "'utf-8' codec can't decode byte 0xf5 in position 6: invalid start byte"),
])
def test_text_that_is_not_utf8_in_an_onnx_file_is_an_input_error(bases, tmp_path, where,
                                                                 before, after, reason):
    """Found by fuzzing: flipped bits in metadata; the checker passes them, onnx_ir reads the
    text as bytes: the frontend's parsing (a name_scopes value), reading the weights' names
    from the graph signature, writing the output (a metadata key) and making a node's stack
    trace portable (CI's checkout path put the fuzzer's flip there) failed with exit 3."""
    data = bases["shared" if where == "a metadata key" else "gpt2"].path.read_bytes()
    assert before in data
    path = tmp_path / "bad_text.onnx"
    path.write_bytes(data.replace(before, after, 1))
    out = tmp_path / "out.onnx"
    code, err = run_cli(["-q", "apply", "modularize", str(path), "-o", str(out)])
    assert code == 2, err
    assert err.strip() == (f"{path}: the input model is invalid: it holds text that is not UTF-8 "
                           f"(a corrupt file?), which ONNX cannot write back ({reason})")
    assert not out.exists()


def test_an_invalid_onnx_input_is_refused_naming_it(bases, tmp_path):
    model = _first_case(bases["gpt2"], mutate_onnx, "dangling_input", tmp_path)
    code, err = run_cli(["-q", "apply", "gpt2", str(model), "-o", str(tmp_path / "out.onnx")])
    assert code == 2
    assert err.startswith(f"{model}: the input model is invalid: Nodes in a graph must be "
                          "topologically sorted, however input 'fuzz_missing' of node: name: ")
    assert len(err.strip().splitlines()) == 1


def test_a_malformed_nn_module_stack_is_one_short_line(bases, tmp_path):
    """Found by fuzzing: torch's message embedded the whole serialized node (kilobytes)."""
    for seed in range(40):
        model = tmp_path / "input.pt2"
        mutate_pt2(bases["shared.pt2"].path, random.Random(seed), model)
        code, err = run_cli(["-q", "explain", "modularize", str(model)])
        # torch 2.10+ says "expected metadata_split to return 3 parts", 2.9 a bare assert
        if code == 2 and "cannot read it (a node of" in err:
            break
    else:
        raise AssertionError("no seed breaks nn_module_stack for torch.export.load")
    assert err.startswith(f"{model}: torch.export.load cannot read it (a node of torch.ops.aten.")
    assert len(err) < 300 and len(err.strip().splitlines()) == 1


def test_an_existing_function_with_the_wanted_name_is_kept_apart(bases, tmp_path):
    """A model that already has (and calls) a function pkg.transformers::GPT2Block: it is kept
    as it is, rewrite's block functions take other names; the output computes the same."""
    import onnx
    from onnx import helper

    from tools.fuzz_models import _check_output

    base = bases["gpt2"]
    model = onnx.load(str(base.path))
    version = next(o.version for o in model.opset_import if o.domain == "")
    model.functions.append(helper.make_function(
        "pkg.transformers", "GPT2Block", ["x"], ["y"], [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_opsetid("", version)]))
    model.opset_import.append(helper.make_opsetid("pkg.transformers", 1))
    node = model.graph.node[5]
    value = node.output[0]
    node.output[0] = value + "_before"
    model.graph.node.insert(6, helper.make_node("GPT2Block", [value + "_before"], [value],
                                                domain="pkg.transformers", name="their_call"))
    path, out = tmp_path / "with_function.onnx", tmp_path / "out.onnx"
    onnx.save(model, str(path))
    code, err = run_cli(["-q", "apply", "gpt2", str(path), "-o", str(out)])
    assert (code, err) == (0, "")
    assert _check_output(base, path, out) is None  # valid, equal in onnxruntime
    functions = {(f.domain, f.name): f for f in onnx.load(str(out)).functions}
    assert [n.op_type for n in functions["pkg.transformers", "GPT2Block"].node] == ["Identity"]
    assert ("pkg.transformers", "GPT2Block_1") in functions


def test_an_outlined_model_fed_back_is_left_as_it_is_and_says_why(bases, tmp_path):
    """rewrite's own output as input: its call nodes carry no module metadata and rewrite does
    not look inside functions; the warning says so, and the output is the same model."""
    from tools.fuzz_models import _check_output

    base = bases["gpt2_outlined"]
    out = tmp_path / "again.onnx"
    code, err = run_cli(["apply", "gpt2", str(base.path), "-o", str(out)])
    assert code == 0, err
    assert err.startswith(f"warning: {base.path}: no module structure: ")
    assert ("the model already has 5 local functions (an outlined model?): rewrite does not look "
            "inside functions; give it the flat export instead") in err.splitlines()[0]
    assert _check_output(base, base.path, out) is None
