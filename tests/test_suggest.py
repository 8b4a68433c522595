"""``rewrite suggest``: starter rules that pass ``check`` and, applied, give one ONNX
function per distinct block body, with as many calls as the model has blocks."""

from __future__ import annotations

import re

import onnx_ir as ir
import pytest
import torch

import rewrite
from tests.onnx_fixtures import assert_matches_eager, checked_proto, runs

BLOCK_LINE = re.compile(r"^group class (\S+)\s+# (\d+) calls?, (\d+) distinct bod(?:y|ies)")

FAMILIES = {  # fixture of the program, fixture of the (model, args, kwargs), block classes
    "gpt2": ("gpt2_program", "gpt2_model", ["GPT2Block", "GPT2Attention", "GPT2MLP"]),
    "llama": ("llama_program", "llama_model",
              ["LlamaDecoderLayer", "LlamaRMSNorm", "LlamaAttention", "LlamaMLP"]),
    "bert": ("bert_program", "bert_model",
             ["BertLayer", "BertAttention", "BertIntermediate", "BertOutput",
              "BertSelfAttention", "BertSelfOutput"]),
    # functions are optimized after outlining: an eval BatchNorm is not folded into the
    # convolution's weights (function inputs), so blocks alike but for their weights share one
    "resnet": ("resnet_program", "resnet_model", ["BasicBlock"], {}),
    "two_kinds": ("two_kinds_program", "two_kinds_model", ["Mixer", "Gated"]),
}


def reference_counts(model: torch.nn.Module, cls: str) -> tuple[int, int]:
    """(calls, distinct bodies) of the blocks of class ``cls``, from the module tree alone
    (each block is called once): two blocks have one body when their submodules have the same
    classes and settings (scalar attributes: ``eps``, ``stride``, a residual scale) and their
    weights the same shapes."""
    def signature(block: torch.nn.Module) -> tuple:
        parts = []
        for name, module in block.named_modules():
            settings = sorted((k, v) for k, v in vars(module).items()
                              if isinstance(v, (bool, int, float, str, tuple))
                              and k not in ("training", "layer_idx")  # which layer: no setting
                              and not k.startswith("_"))
            parts.append((name, type(module).__qualname__, tuple(settings)))
        tensors = [*block.named_parameters(), *block.named_buffers()]
        parts.extend((name, tuple(t.shape), t.dtype) for name, t in tensors)
        return tuple(parts)

    blocks = [m for m in model.modules() if type(m).__name__ == cls]
    return len(blocks), len({signature(b) for b in blocks})


def block_lines(text: str) -> dict[str, tuple[int, int]]:
    """Block class -> (calls, distinct bodies), as the suggestion's comments say."""
    out = {}
    for line in text.splitlines():
        found = BLOCK_LINE.match(line)
        if found:
            out[found[1]] = (int(found[2]), int(found[3]))
    return out


def functions_of(model: ir.Model, cls: str) -> dict[str, int]:
    """Functions named after ``cls`` (``Cls``, ``Cls_1``...) -> their runs per model run."""
    return {name: n for name, n in runs(model).items() if re.fullmatch(rf"{cls}(_\d+)?", name)}


def suggest_and_apply(run_cli, tmp_path, model_path, **options):
    """Suggest rules for a model file, check them, apply them with ``rewrite apply`` (or,
    with ``options``, with the library and those ONNX options): (rules text, ONNX model)."""
    rules = tmp_path / "suggested.rules"
    r = run_cli("suggest", model_path, "-o", rules)
    assert r.code == 0, r
    assert r.out == ""
    text = rules.read_text()
    check = run_cli("check", rules)
    assert check.code == 0, check
    if options:
        result = rewrite.apply(rules, model_path)
        assert result.warnings == ()
        return text, result.to_onnx(**options)
    out = tmp_path / "out.onnx"
    applied = run_cli("apply", rules, model_path, "-o", out)
    assert applied.code == 0, applied
    assert "matches nothing" not in applied.err
    return text, ir.load(out)


@pytest.mark.parametrize("family", FAMILIES)
def test_suggested_rules_give_one_function_per_distinct_body(family, request, run_cli,
                                                             tmp_path):
    program_fixture, model_fixture, classes, *options = FAMILIES[family]
    program, triple = request.getfixturevalue(program_fixture), request.getfixturevalue(
        model_fixture)
    path = tmp_path / f"{family}.pt2"
    torch.export.save(program, str(path))
    text, model = suggest_and_apply(run_cli, tmp_path, path, **(options or [{}])[0])
    blocks = block_lines(text)
    assert list(blocks) == classes  # outermost first, then the ones inside
    assert blocks == {cls: reference_counts(triple[0], cls) for cls in classes}
    for cls, (calls, bodies) in blocks.items():
        made = functions_of(model, cls)
        assert len(made) == bodies, (cls, made)
        assert sum(made.values()) == calls, (cls, made)
    checked_proto(model)
    assert_matches_eager(model, triple)


def test_block_counts_match_the_model(gpt2_pt2, gpt2_model, run_cli):
    r = run_cli("suggest", gpt2_pt2)
    assert r.code == 0, r
    n_layer = gpt2_model[0].config.n_layer
    assert block_lines(r.out)["GPT2Block"] == (n_layer, 1)
    lines = [line.split("#")[0].strip() for line in r.out.splitlines()]
    # the embeddings and the final norm, by path; dropout flat
    assert 'group path wte as "{class}_{name}"' in lines
    assert 'group path wpe as "{class}_{name}"' in lines
    assert "group path ln_f" in lines
    assert "flat class Dropout" in lines
    assert not any(line.startswith("group path h.") for line in lines)


def test_resnet_stages_are_not_blocks_and_downsampling_blocks_differ(resnet_program):
    from rewrite.suggest import render, suggest

    text = render(suggest(resnet_program, "resnet"))
    # layer1.0, layer1.1 alike; layer2.0 (downsampling) and layer2.1 (wider) each their own
    assert block_lines(text) == {"BasicBlock": (4, 3)}
    assert "Sequential" not in text  # containers are no blocks, nor top-level modules
    assert "group path fc" in text and "group path conv1" in text
    assert "maxpool" not in text and "avgpool" not in text  # no weights


def test_onnx_input(two_kinds_model, run_cli, tmp_path):
    path = tmp_path / "two_kinds.onnx"
    model, args, _ = two_kinds_model
    torch.onnx.export(model, args, dynamo=True, verbose=False).save(str(path))
    text, grouped = suggest_and_apply(run_cli, tmp_path, path)
    assert block_lines(text) == {"Mixer": (2, 1), "Gated": (3, 1)}
    for cls, calls in (("Mixer", 2), ("Gated", 3)):
        assert functions_of(grouped, cls) == {cls: calls}
    checked_proto(grouped)
    assert_matches_eager(grouped, two_kinds_model)


@pytest.mark.slow  # a fresh process
def test_onnx_input_does_not_load_the_lowering_pipeline(two_kinds_model, tmp_path):
    """Suggesting rules for an ``.onnx`` file reads it and keys its bodies; torch.onnx and
    onnxscript (the lowering pipeline's imports) are not loaded."""
    import subprocess
    import sys

    path = tmp_path / "two_kinds.onnx"
    model, args, _ = two_kinds_model
    torch.onnx.export(model, args, dynamo=True, verbose=False).save(str(path))
    code = ("import sys\nfrom rewrite.cli.main import main\n"
            f"code = main(['suggest', {str(path)!r}, '-o', {str(tmp_path / 's.rules')!r}])\n"
            "print(code, 'onnxscript' in sys.modules, 'torch.onnx' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split()[-3:] == ["0", "False", "False"], done.stdout + done.stderr
    assert "group class" in (tmp_path / "s.rules").read_text()


def test_output_file_is_never_replaced_without_force(shared_pt2, run_cli, tmp_path):
    rules = tmp_path / "s.rules"
    rules.write_text("# mine\n")
    r = run_cli("suggest", shared_pt2, "-o", rules)
    assert r.code == 2
    assert r.err.strip() == f"{rules}: exists; use --force to replace it"
    assert rules.read_text() == "# mine\n"
    r = run_cli("suggest", shared_pt2, "-o", rules, "--force")
    assert r.code == 0, r
    assert rules.read_text().startswith("# Starter rules for")
    assert "group class Sub" in rules.read_text()
    # never over the model, even with --force; no partial files left behind
    before = shared_pt2.read_bytes()
    r = run_cli("suggest", shared_pt2, "-o", shared_pt2, "--force")
    assert r.code == 2 and "refusing to overwrite" in r.err
    assert shared_pt2.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.rules"]


def test_unusable_input_exits_2(run_cli, tmp_path):
    r = run_cli("suggest", tmp_path / "missing.pt2")
    assert r.code == 2
    assert "no such file" in r.err and "Traceback" not in r.err
    r = run_cli("suggest", tmp_path / "x.pt2", "-o", tmp_path / "no" / "s.rules")
    assert r.code == 2


class _Flat(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def test_a_model_without_blocks_gets_a_valid_empty_file(run_cli, tmp_path):
    path = tmp_path / "flat.pt2"
    torch.export.save(torch.export.export(_Flat(), (torch.randn(2),)), str(path))
    r = run_cli("suggest", path)
    assert r.code == 0, r
    assert "nothing to group" in r.out
    assert not [line for line in r.out.splitlines() if line and not line.startswith("#")]
    assert "no module structure" in r.err
    rules = tmp_path / "empty.rules"
    rules.write_text(r.out)
    assert run_cli("check", rules).code == 0
