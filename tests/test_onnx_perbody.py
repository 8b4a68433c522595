"""Per-body lowering (issue 12): each distinct repeated body decomposed and translated once.

Both paths on GPT-2, Llama, BERT and custom models: the per-body path is taken (asserted),
its output passes the full checker, equals eager in onnxruntime, and has the functions, ops,
domains and module paths of the flat path (programs with in-place ops too, in their functional
form); the fallback is taken, with one warning naming the reason, for a program the per-body
path does not handle, and either path can be forced.
"""

from __future__ import annotations

import ast
import copy

import onnx_ir as ir
import pytest
import torch

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from rewrite._private.torch_graphs import functional_forms, is_in_place
from rewrite.backends.onnx.lowering import DecomposedProgram, in_place
from rewrite.errors import InputError
from tools import models
from tests.pt2_roundtrip import SOURCES, as_source
from tests.onnx_fixtures import (
    BERT_RULES,
    GPT2_RULES,
    LLAMA_RULES,
    MODULARIZE,
    assert_matches_eager,
    checked_proto,
    top_calls,
)

SCOPES = "pkg.torch.onnx.name_scopes"


def _paths(node: ir.Node) -> list[str] | None:
    """A node's module paths (name_scopes without its last item, the FX node name)."""
    scopes = node.metadata_props.get(SCOPES)
    return ast.literal_eval(scopes)[:-1] if scopes else None


def _shape(model: ir.Model) -> dict:
    """Per function (and the main graph): ops, domains, module paths, metadata keys."""
    out = {}
    for fid, function in model.functions.items():
        out[fid] = [(n.domain, n.op_type, _paths(n), sorted(n.metadata_props))
                    for n in function]
    out["main"] = [(n.domain, n.op_type, _paths(n), sorted(n.metadata_props))
                   for n in model.graph]
    return out


def lower_per_body(program, tree):
    """The per-body lowering of ``program`` grouped as ``tree``, every call but the first of
    each body standing in."""
    return DecomposedProgram(program, tree).translate()


def _both(rules, program):
    result = rewrite.apply(rules, program)
    fast = lower(result, OnnxOptions(lowering="per-body"))
    flat = lower(result, OnnxOptions(lowering="flat"))
    assert fast.path == "per-body"
    assert flat.path == "flat"
    assert not any("per-body" in d.message for d in fast.warnings)
    return fast, flat


def _same_result(fast, flat, *, main_calls_only: bool = False) -> None:
    """Same functions, ops, domains; same module paths and metadata keys wherever the flat
    path has them (a constant the flat export shared between blocks as an initializer comes
    without metadata; per body it is a Constant node of the body, with its module's).
    ``main_calls_only``: of the main graph, only the function calls (with dynamic shapes, its
    size arithmetic comes in another order: torch's re-trace reads every input's sizes
    first, make_fx where they are used)."""
    fast_shape, flat_shape = _shape(fast.model), _shape(flat.model)
    assert fast_shape.keys() == flat_shape.keys()
    if main_calls_only:
        for shape in (fast_shape, flat_shape):
            shape["main"] = [n for n in shape["main"] if n[0] != ""]
    for key, flat_nodes in flat_shape.items():
        fast_nodes = fast_shape[key]
        assert [n[:2] for n in fast_nodes] == [n[:2] for n in flat_nodes], key
        for a, b in zip(fast_nodes, flat_nodes):
            if b[2] is not None:
                assert a[2:] == b[2:], (key, a, b)
    assert {g.id: (g.function_name, g.domain) for g in fast.tree.groups()} == \
        {g.id: (g.function_name, g.domain) for g in flat.tree.groups()}


@pytest.mark.parametrize("name", ["gpt2", *(pytest.param(n, marks=pytest.mark.slow)
                                             for n in ("llama", "bert"))])
def test_transformers_per_body_equals_flat_and_eager(name, request):
    triple = request.getfixturevalue(f"{name}_model")
    program = request.getfixturevalue(f"{name}_program")
    rules = {"gpt2": GPT2_RULES, "llama": LLAMA_RULES, "bert": BERT_RULES}[name]
    fast, flat = _both(rules, program)
    _same_result(fast, flat)
    for lowering in (fast, flat):
        checked_proto(lowering.model)
        assert_matches_eager(lowering.model, triple)


def test_gpt2_blocks_are_decomposed_once(gpt2_program):
    result = rewrite.apply(GPT2_RULES, gpt2_program)
    lowered = lower_per_body(gpt2_program, result.tree)
    assert (lowered.bodies, lowered.calls) == (1, 2)  # one GPT2Block body for both blocks


def test_default_takes_the_per_body_path(gpt2_program):
    lowering = lower(rewrite.apply(GPT2_RULES, gpt2_program))
    assert lowering.path == "per-body"
    assert lowering.warnings == ()


@pytest.mark.parametrize("make", [models.shared_and_list, models.chain, models.two_block_kinds,
                                  models.settings, models.two_shapes])
def test_custom_models_per_body_equals_flat_and_eager(make):
    triple = make()
    program = models.export(triple)
    fast, flat = _both(MODULARIZE, program)
    _same_result(fast, flat)
    for lowering in (fast, flat):
        checked_proto(lowering.model)
        assert_matches_eager(lowering.model, triple)


@pytest.mark.parametrize("source", SOURCES)
def test_mutations_are_lowered_per_body_in_functional_form(source, tmp_path):
    """In-place ops (a buffer updated inside a submodule, a mutated user input) are lowered
    per body in torch's functional form of the program: the model of the flat path, equal to
    eager; the same for the program read back from its ``.pt2``."""
    triple = models.stateful()
    program = as_source(models.export(triple), source, tmp_path)
    fast, flat = _both(MODULARIZE, program)
    _same_result(fast, flat)
    for lowering in (fast, flat):
        checked_proto(lowering.model)
        # a fresh model and inputs each time: eager updates its buffer and input in place (in
        # memory the initializers are the model's buffers, and would follow it)
        assert_matches_eager(lowering.model, copy.deepcopy(triple))


@pytest.mark.slow
def test_blocks_that_scan_are_lowered_per_body():
    """Blocks holding a ``torch.scan`` (a recurrent layer's; each block's step a subgraph of
    its own in the program) that write their final state into a clone of the state they are
    given: one body for the three (their steps the same graph), decomposed and translated
    once, the first call inlined and the others standing in for it (its ``Scan`` too); the
    copies lowered as they are, the program not functionalized; the model of the flat path,
    equal to eager."""
    triple = models.recurrents()
    program = models.export(triple)
    steps = {n.target for n in program.graph.nodes if n.op == "get_attr"}
    assert len(steps) == 3, steps
    assert any(is_in_place(n) for n in program.graph.nodes) and not in_place(program)
    result = rewrite.apply(MODULARIZE, program)
    lowered = lower_per_body(program, result.tree)
    assert (lowered.bodies, lowered.calls, lowered.inlined) == (1, 3, 1)
    fast, flat = _both(MODULARIZE, program)
    _same_result(fast, flat)
    assert fast.inlined == 1
    for lowering in (fast, flat):
        assert top_calls(lowering.model) == {"Recurrent": 3}, top_calls(lowering.model)
        assert any(n.op_type == "Scan" for f in lowering.model.functions.values() for n in f)
        checked_proto(lowering.model)
        assert_matches_eager(lowering.model, triple)


def test_a_node_a_pass_made_is_traced_past_its_own_graphs_names():
    """A node that a pass over the decomposed graph made (torch.onnx's type promotion: a Cast
    before a mul) names that graph's node first, whose name a node of the grouped program in
    another module may have: the node is traced to the program's node its own came from
    (Inkling's and Bamba's first layers were once cut in two by such a Cast)."""
    from torch.fx.traceback import NodeSource

    from rewrite.backends.onnx.lowering._provenance import nearest

    def graph_of(*names: str) -> dict[str, torch.fx.Node]:
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        return {name: graph.create_node("call_function", torch.ops.aten.mul.Tensor, (x, x),
                                        name=name) for name in names}

    program = graph_of("mul_1", "mul_7")  # mul_1 in one module, mul_7 in another
    decomposed = graph_of("mul_1", "cast")
    decomposed["mul_1"].meta["from_node"] = [NodeSource(program["mul_7"], "trace")]
    decomposed["cast"].meta["from_node"] = [NodeSource(decomposed["mul_1"], "promotion")]
    names = {"mul_1": "first module's", "mul_7": "second module's"}
    assert nearest(decomposed["cast"], names) == "second module's"
    assert nearest(decomposed["mul_1"], names) == "second module's"


def _returned(x, y):
    kept = x.clone()
    return kept.copy_(y) * 2  # the written tensor read through the copy's result only


def _read_before(x, y):
    kept = x.clone()
    before = kept[0] * 2  # ... and through a view before the copy
    return kept.copy_(y) + before


def _view_read_after(x, y):
    kept = x.clone()
    row = kept[0]
    kept.copy_(y)
    return row * 2  # ... read through a view made before the copy


def _input_written(x, y):
    x.copy_(y)
    return x * 2  # an input written


class _Writes(torch.nn.Module):
    def __init__(self, body) -> None:
        super().__init__()
        self.body = body
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return self.body(self.lin(x), y) if self.body is not _input_written \
            else self.body(x, self.lin(y))


@pytest.mark.parametrize("body, as_is", [(_returned, True), (_read_before, True),
                                         (_view_read_after, False), (_input_written, False)])
def test_a_copy_is_lowered_as_it_is_only_when_nothing_reads_what_it_overwrote(body, as_is):
    """A ``copy_`` into a tensor made inside the program, read afterwards only through the
    copy's result (torch.export reads it so), is lowered in its functional form as it is;
    read afterwards through a view made before, or an input written: the program is
    functionalized. Each equal to eager, per body."""
    torch.manual_seed(0)
    triple = (models.perturb(_Writes(body).eval()), (torch.randn(2, 4), torch.randn(2, 4)), {})
    program = models.export(triple)
    copies = [n for n in program.graph.nodes if is_in_place(n)]
    assert len(copies) == 1
    assert (copies[0] in functional_forms(program.graph)) == as_is
    assert in_place(program) != as_is
    lowering = lower(rewrite.apply(MODULARIZE, program), OnnxOptions(lowering="per-body"))
    checked_proto(lowering.model)
    assert_matches_eager(lowering.model, copy.deepcopy(triple))


@pytest.mark.parametrize("name", ["chain", pytest.param("llama", marks=pytest.mark.slow)])
def test_dynamic_shapes_are_lowered_per_body(name):
    """Symbolic sizes (a dynamic batch; and sequence for the Llama, whose blocks read sizes
    from outside): per body, the model of the flat path, its inputs' sizes symbolic, equal
    to eager at other sizes than the export's."""
    model, args, _ = getattr(models, name)()
    if name == "llama":  # a batch of 1 would specialize
        args = (torch.randint(0, 100, (2, 8)),)
    triple = (model, args, {})
    batch, sequence = torch.export.Dim("batch", min=2, max=64), torch.export.Dim("sequence")
    dims = {0: batch, 1: sequence} if name == "llama" else {0: batch}
    program = torch.export.export(model, args, dynamic_shapes=(dims,))
    fast, flat = _both(MODULARIZE if name == "chain" else LLAMA_RULES, program)
    _same_result(fast, flat, main_calls_only=True)
    other = (torch.randint(0, 100, (3, 5)) if name == "llama" else torch.randn(5, 4),)
    for lowering in (fast, flat):
        checked_proto(lowering.model)
        assert not lowering.model.graph.inputs[0].shape.is_static()
        assert_matches_eager(lowering.model, triple, other)


class _Mixer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = 2 * x.shape[0] * x.shape[1]  # a size of the tokens: its node is made once
        flat = self.proj(x).reshape(rows, 2)
        return x + torch.relu(flat).reshape(x.shape)


class _Mixers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_Mixer(), _Mixer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_size_computed_in_the_first_block_is_read_alike_by_every_block():
    """torch.export computes ``2 * batch * sequence`` once, in the first block, and the
    second reads that node: the size is computed before the blocks (one body, each block
    one call of it; per body too), not left in the first block for the others to read."""
    torch.manual_seed(0)
    model = _Mixers().eval()
    args = (torch.randn(2, 3, 4),)
    dims = {0: torch.export.Dim("batch", min=2, max=64), 1: torch.export.Dim("sequence")}
    program = torch.export.export(model, args, dynamic_shapes=(dims,))
    fast, flat = _both(rewrite.parse_rules("group class *_Mixer", "mixers.rules"), program)
    for lowering in (fast, flat):
        checked_proto(lowering.model)
        assert top_calls(lowering.model) == {"_Mixer": 2}, top_calls(lowering.model)
        assert_matches_eager(lowering.model, (model, args, {}), (torch.randn(3, 5, 4),))


def test_a_repeated_call_that_cannot_be_recorded_falls_back(gpt2_model, gpt2_program,
                                                            monkeypatch):
    """The decomposition records repeated calls without dispatching them, their weights not
    traced; when one cannot be recorded, the flat path is taken with one warning naming it."""
    from rewrite._private import torch_exporter as torch_private

    monkeypatch.setattr(torch_private.Trace, "_call_again", lambda self, node: None)
    lowering = lower(rewrite.apply(GPT2_RULES, gpt2_program))
    assert lowering.path == "flat"
    reasons = [d.message for d in lowering.warnings if "per-body" in d.message]
    assert len(reasons) == 1 and "cannot record the repeated call" in reasons[0]
    checked_proto(lowering.model)
    assert_matches_eager(lowering.model, gpt2_model)


class _Notes:
    """A :class:`Progress` that keeps the notes it hears."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def step(self, text):
        from rewrite.backends.onnx.progress import SILENT

        return SILENT.step(text)

    def update(self, text):
        pass

    def note(self, text):
        self.notes.append(text)


class _Conditional(torch.nn.Module):
    """Two linear blocks, then ``torch.cond`` (a higher-order op: not lowered per body)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.b(self.a(x))
        return torch.cond(y.sum() > 0, lambda t: t * 2, lambda t: t - 1, (y,))


def test_an_unsupported_program_runs_the_flat_path_with_a_one_line_reason(tmp_path):
    """The per-body strategy does not apply (a higher-order op): the flat one runs, and the
    user hears which path ran and why, in one line; forcing either path is obeyed."""
    from rewrite.backends.onnx import save_onnx

    torch.manual_seed(0)
    triple = (models.perturb(_Conditional().eval()), (torch.randn(2, 4),), {})
    result = rewrite.apply(MODULARIZE, models.export(triple))
    heard = _Notes()
    lowering = save_onnx(result, tmp_path / "out.onnx", progress=heard)
    assert lowering.path == "flat"
    reasons = [note for note in heard.notes if "per-body" in note]
    assert len(reasons) == 1 and "\n" not in reasons[0]
    assert "torch.onnx.export" in reasons[0] and "higher-order op (cond)" in reasons[0]
    assert_matches_eager(ir.load(str(tmp_path / "out.onnx")), triple)
    forced = lower(result, OnnxOptions(lowering="flat"))
    assert forced.path == "flat" and not any("per-body" in d.message for d in forced.warnings)
    with pytest.raises(InputError, match=r"per body.*higher-order op \(cond\)"):
        lower(result, OnnxOptions(lowering="per-body"))


def test_an_error_of_torch_in_the_per_body_decomposition_falls_back(gpt2_model, gpt2_program,
                                                                     monkeypatch):
    """torch's own decomposition raising on the program is a reason, not a bug: the flat path
    runs (torch.onnx.export runs the same decomposition, and says what fails)."""
    from rewrite._private import torch_exporter as torch_private

    def fails(*args):
        raise ValueError("Cannot view a tensor\nwith details")

    monkeypatch.setattr(torch_private, "_decompose", fails)
    lowering = lower(rewrite.apply(GPT2_RULES, gpt2_program))
    assert lowering.path == "flat"
    reasons = [d.message for d in lowering.warnings if "per-body" in d.message]
    assert len(reasons) == 1 and reasons[0].endswith("ValueError: Cannot view a tensor")
    assert_matches_eager(lowering.model, gpt2_model)


def test_a_bug_in_rewrite_code_inside_the_decomposition_surfaces(gpt2_program, monkeypatch):
    """rewrite's own code runs inside torch's decomposition (the recorded calls, the names
    kept): an error raised there is a bug of rewrite's, not torch failing on the program, so
    it surfaces instead of sending the model down the flat path."""
    import functools

    from rewrite._private import torch_exporter as torch_private

    broken = functools.partial(torch_private._keep_names, placeholders=None)  # zip(None, ...)
    monkeypatch.setattr(torch_private, "_keep_names", lambda old, new, _: broken(old, new))
    with pytest.raises(TypeError):
        lower(rewrite.apply(GPT2_RULES, gpt2_program))


@pytest.mark.parametrize("lowering", ["auto", "per-body"])
def test_an_unexpected_error_in_a_per_body_step_surfaces(gpt2_program, monkeypatch, tmp_path,
                                                         lowering):
    """A bug in rewrite's own per-body step is not a reason to fall back: it surfaces (no
    silent flat export), and no file is written."""
    from rewrite.backends.onnx import save_onnx
    from rewrite.backends.onnx.lowering._perbody import DecomposedProgram

    def broken(self, *args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(DecomposedProgram, "translate", broken)
    out = tmp_path / "out.onnx"
    with pytest.raises(KeyError, match="a bug"):
        save_onnx(rewrite.apply(GPT2_RULES, gpt2_program), out, lowering=lowering)
    assert not out.exists()
