"""Why distinct: a class lowered to more than one function says, per variant, the first
difference that kept it apart: in the terminal (``explain --onnx``), in ``--json`` and in the
HTML report (``test_html_report.py``). The models are built here, random weights."""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir
import pytest
import torch
from torch import nn

RULES = "group class *Block\ngroup class *MLP\ngroup class *Linear\n"


class MLP(nn.Module):
    def __init__(self, act: nn.Module, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.act = act

    def forward(self, x):
        return self.act(self.lin(x))


class Block(nn.Module):
    def __init__(self, act: nn.Module, width: int = 8):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = MLP(act, width)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class OneOp(nn.Module):
    """Four blocks; the third's MLP has a Tanh where the others have a ReLU."""

    def __init__(self):
        super().__init__()
        acts = [nn.ReLU(), nn.ReLU(), nn.Tanh(), nn.ReLU()]
        self.blocks = nn.ModuleList(Block(a) for a in acts)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class TwoShapes(nn.Module):
    """Three equal blocks; the second reads the first two positions only."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(nn.ReLU()) for _ in range(3))

    def forward(self, x):
        a = self.blocks[0](x)
        b = self.blocks[1](x[:, :2])
        c = self.blocks[2](x)
        return a.sum() + b.sum() + c.sum()


SHAPE = (2, 5, 8)


def save(model: nn.Module, path: Path) -> Path:
    torch.manual_seed(0)
    program = torch.export.export(model.eval(), (torch.randn(*SHAPE),))
    torch.export.save(program, str(path))
    return path


@pytest.fixture(scope="session")
def variants(tmp_path_factory) -> dict[str, Path]:
    """The rules, and the two models with variants, as files."""
    folder = tmp_path_factory.mktemp("variants")
    torch.manual_seed(0)
    rules = folder / "blocks.rules"
    rules.write_text(RULES)
    return {"rules": rules, "one_op": save(OneOp(), folder / "one_op.pt2"),
            "two_shapes": save(TwoShapes(), folder / "two_shapes.pt2")}


def explain(run_cli, *args) -> dict:
    r = run_cli("explain", *args, "--json", "--onnx")
    assert r.code == 0, r
    return json.loads(r.out)


def applied(run_cli, rules, model: Path, folder: Path) -> tuple[ir.Model, dict[str, int]]:
    """What ``rewrite apply`` writes, and its functions' call sites (main graph and bodies,
    counted in the file)."""
    out = folder / (model.stem + ".onnx")
    assert run_cli("apply", rules, model, "-o", out).code == 0
    onnx_model = ir.load(str(out))
    calls = {name: 0 for _, name, _ in onnx_model.functions}
    for graph in [onnx_model.graph, *(f.graph for f in onnx_model.functions.values())]:
        for node in graph:
            if (node.domain, node.op_type, node.overload) in onnx_model.functions:
                calls[node.op_type] += 1
    return onnx_model, calls


def test_one_op_apart_in_json(run_cli, variants, tmp_path):
    data = explain(run_cli, variants["rules"], variants["one_op"])
    _, made = applied(run_cli, variants["rules"], variants["one_op"], tmp_path)
    assert made == {"Linear": 2, "MLP": 1, "MLP_1": 1, "Block": 3, "Block_1": 1}  # sites
    found = {v["function"].split("::")[1]: v for v in data["onnx"]["variants"]}
    assert set(found) == {"MLP_1", "Block_1"}
    mlp = found["MLP_1"]
    assert (mlp["first"].endswith("::MLP"), mlp["kind"]) == (True, "op")
    assert (mlp["first_side"]["value"], mlp["other_side"]["value"]) == ("Relu", "Tanh")
    assert "relu" in mlp["first_side"]["node"].lower()  # the nodes, by name, both sides
    assert "tanh" in mlp["other_side"]["node"].lower()
    block = found["Block_1"]  # its own body is the same: it calls another MLP
    assert block["kind"] == "subtree"
    assert (block["first_side"]["function"], block["other_side"]["function"]) == (
        mlp["first"], mlp["function"])
    assert block["reason"].startswith("Block_1 vs Block: a different group subtree: calls ")
    # the variant is the group with the Tanh: blocks.2
    groups = {g["id"]: g for g in _walk(data["groups"])}
    assert groups["blocks.2"]["onnx_function"] == block["function"]
    assert groups["blocks.2/blocks.2.mlp"]["onnx_function"] == mlp["function"]
    classes = {c["name"]: len(c["functions"]) for c in data["onnx"]["totals"]["classes"]}
    assert classes == {"Block": 2, "MLP": 2, "Linear": 1}


def test_input_shape_apart_in_json(run_cli, variants):
    data = explain(run_cli, variants["rules"], variants["two_shapes"])
    found = {v["function"].split("::")[1]: v for v in data["onnx"]["variants"]}
    assert set(found) == {"Block_1", "MLP_1", "Linear_1"}
    short = f"float[{SHAPE[0]},2,{SHAPE[2]}]"
    full = "float[" + ",".join(map(str, SHAPE)) + "]"
    for variant in found.values():
        assert variant["kind"] == "shape", variant
        assert (variant["first_side"]["value"], variant["other_side"]["value"]) == (full, short)
        assert variant["first_side"]["node"] and variant["other_side"]["node"]
    groups = {g["id"]: g for g in _walk(data["groups"])}
    assert groups["blocks.1"]["onnx_function"] == found["Block_1"]["function"]
    assert groups["blocks.0"]["onnx_function"] == groups["blocks.2"]["onnx_function"] \
        == found["Block_1"]["first"]


def test_no_variants_no_section(run_cli, gpt2_pt2):
    data = explain(run_cli, "gpt2", gpt2_pt2)
    assert data["onnx"]["variants"] == []
    assert all(len(c["functions"]) == 1 for c in data["onnx"]["totals"]["classes"])
    r = run_cli("explain", "gpt2", gpt2_pt2, "--onnx")
    assert r.code == 0 and "why distinct" not in r.out


def test_terminal_lists_reasons_under_each_class(run_cli, variants):
    r = run_cli("explain", variants["rules"], variants["one_op"], "--onnx")
    assert r.code == 0, r
    lines = r.out.splitlines()
    start = lines.index("why distinct (2 classes lowered to more than one function):")
    section = lines[start + 1:]
    domain = f"pkg.{__name__.split('.')[0]}"  # the module's package (rules' default)
    mlp = section.index(f"{domain}::MLP: 2 functions (MLP x3, MLP_1 x1)")
    reason = section[mlp + 1]
    assert reason.startswith("  MLP_1 vs MLP: op: Tanh at ") and " vs Relu at " in reason
    block = section.index(f"{domain}::Block: 2 functions (Block x3, Block_1 x1)")
    assert section[block + 1] == (
        f"  Block_1 vs Block: a different group subtree: calls {domain}::MLP_1 at "
        f"blocks.2/blocks.2.mlp vs calls {domain}::MLP at blocks.0/blocks.0.mlp")


def test_terminal_shape_reason(run_cli, variants):
    r = run_cli("explain", variants["rules"], variants["two_shapes"], "--onnx")
    assert r.code == 0, r
    full = "float[" + ",".join(map(str, SHAPE)) + "]"
    block = [line for line in r.out.splitlines() if line.startswith("  Block_1 vs Block: ")]
    assert len(block) == 1
    assert block[0].startswith("  Block_1 vs Block: shape of ")
    assert f": float[{SHAPE[0]},2,{SHAPE[2]}] at " in block[0] and f" vs {full} at " in block[0]


def _walk(groups: list[dict]):
    for group in groups:
        yield group
        yield from _walk(group["children"])


def test_extra_node_after_merging_and_renumbering():
    """Under ``--constants embed``, optimized, blocks ``a`` and ``b`` (a Linear times 1, plus
    0) are the Linear alone and share one function; ``c`` (times -1) keeps a Mul: its
    function, made third, is renumbered ``NoOp_1``, and the reason names the Mul only it has.
    (Under the default policy the three share one function: the scalars are lifted before
    optimizing, test_onnx_optimize.)"""
    from tools import models

    model, args, _ = models.two_noops()
    (variant,) = _variants(model, args, "group class *NoOp\n", constants="embed")
    assert variant.function[1] == "NoOp_1" and variant.first[1] == "NoOp"
    assert variant.difference.kind == "node" and variant.difference.first.node is None
    assert variant.difference.other.value == "Mul"


def _variants(model: nn.Module, args: tuple, rules: str, **options):
    """The backend's why-distinct records for ``model`` grouped by ``rules``."""
    import rewrite
    from rewrite.backends.onnx import OnnxOptions, lower

    result = rewrite.apply(rewrite.parse_rules(rules), torch.export.export(model.eval(), args))
    return lower(result, OnnxOptions(**options)).outlined.variants


def test_constant_value_apart_when_embedded():
    """Under ``--constants embed`` a scalar keeps blocks apart: the constant's values."""
    from tools import models

    model, args, _ = models.two_factors()  # Scaled blocks: factors 2, 3, 2
    (variant,) = _variants(model, args, "group class *Scaled\n", constants="embed")
    diff = variant.difference
    assert (variant.function[1], variant.first[1], diff.kind) == ("Scaled_1", "Scaled",
                                                                  "constant")
    assert (diff.first.value, diff.other.value) == ("2.0 (float)", "3.0 (float)")
    assert diff.first.node and diff.other.node
    assert _variants(model, args, "group class *Scaled\n") == ()  # lifted by default


class _Silu(nn.Module):
    def forward(self, x):
        return nn.functional.silu(x) * 2


class _TwoDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _Silu(), _Silu()

    def forward(self, x):
        return self.a(x).sum() + self.b(x.double()).sum()


def test_input_dtype_apart():
    (variant,) = _variants(_TwoDtypes(), (torch.randn(2, 3),), "group class *_Silu\n")
    diff = variant.difference
    assert (diff.kind, diff.first.value, diff.other.value) == ("dtype", "float[2,3]",
                                                               "double[2,3]")
    assert diff.first.node == "x"


def test_attribute_apart_when_embedded():
    """NormBlocks that differ in LayerNorm's eps: the attribute, its values, the nodes."""
    from tools import models

    model, args, _ = models.settings()  # (eps, scale): (1e-5, .5), (1e-6, .5), ...
    found = {v.function[1]: v.difference
             for v in _variants(model, args, "group class *NormBlock\n", constants="embed")}
    assert set(found) == {"NormBlock_1", "NormBlock_2", "NormBlock_3"}
    eps = found["NormBlock_1"]
    assert (eps.kind, eps.what, eps.first.value, eps.other.value) == (
        "attribute", "epsilon", repr(1e-05), repr(1e-06))
    assert "layer_norm" in eps.first.node and "layer_norm" in eps.other.node
    scale = found["NormBlock_2"]
    assert (scale.kind, scale.first.value, scale.other.value) == ("constant", "0.5 (float)",
                                                                  "0.25 (float)")
