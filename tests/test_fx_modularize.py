"""FX backend, modularize: lowered GraphModules compute what the eager models compute.

Every lowered module is compared with eager PyTorch (and with ``ExportedProgram.module()``,
whose calling convention it copies) on random-weight transformers models and hand-written
ones; the state it holds must be the model's state under the same names.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils import _pytree as pytree

import rewrite
from rewrite.backends.fx import LoweredModule
from tools import models
from tests.pt2_roundtrip import SOURCES, as_source

MODULARIZE = "rules/modularize.rules"


def assert_same_outputs(actual, expected) -> None:
    got, _ = pytree.tree_flatten(actual)
    want, _ = pytree.tree_flatten(expected)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def lowered(rules, program) -> torch.fx.GraphModule:
    return rewrite.apply(rules, program).to_fx()


def group_modules(root: torch.nn.Module) -> dict[str, LoweredModule]:
    """Lowered submodules by the id of the group they stand for."""
    return {
        m.meta["rewrite"]["group"]: m
        for m in root.modules()
        if isinstance(m, LoweredModule) and m is not root
    }


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_transformers_models_match_eager(name, request):
    model, args, kwargs = request.getfixturevalue(f"{name}_model")
    program = request.getfixturevalue(f"{name}_program")
    gm = lowered(MODULARIZE, program)
    assert isinstance(gm, torch.fx.GraphModule)
    assert_same_outputs(gm(*args, **kwargs), model(*args, **kwargs))
    assert_same_outputs(gm(*args, **kwargs), program.module()(*args, **kwargs))
    # parameters and buffers under the model's own names, as ExportedProgram.module() holds them
    assert set(gm.state_dict()) == set(model.state_dict())
    for key, value in model.state_dict().items():
        assert torch.equal(gm.state_dict()[key], value)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_one_submodule_per_group_with_the_module_class(name, request):
    program = request.getfixturevalue(f"{name}_program")
    result = rewrite.apply(MODULARIZE, program)
    gm = result.to_fx()
    groups = {g.id: g for g in result.tree.groups()}
    made = group_modules(gm)
    assert set(made) == set(groups)
    for group_id, module in made.items():
        assert type(module).__name__ == groups[group_id].call.class_name
    assert type(gm).__name__ == result.tree.graph.root_class.rsplit(".", 1)[-1]


def test_gpt2_blocks_nest_like_the_model(gpt2_program, gpt2_model):
    gm = lowered(MODULARIZE, gpt2_program)
    block = gm.get_submodule("h.0")
    assert type(block).__name__ == "GPT2Block"
    assert type(block.attn).__name__ == "GPT2Attention"
    assert type(block.attn.c_attn).__name__ == "Conv1D"
    assert type(block.mlp).__name__ == "GPT2MLP"
    assert block.attn.c_attn.weight is gm.get_parameter("h.0.attn.c_attn.weight")
    text = gm.print_readable(print_output=False)
    for expected in ("class GPT2Model", "class h_0(torch.nn.Module)", "class attn(", "class mlp("):
        assert expected in text


def test_any_rule_file_makes_only_its_groups(gpt2_program, gpt2_model):
    model, args, kwargs = gpt2_model
    result = rewrite.apply("rules/gpt2.rules", gpt2_program)
    gm = result.to_fx()
    assert_same_outputs(gm(*args, **kwargs), model(*args, **kwargs))
    assert set(group_modules(gm)) == {g.id for g in result.tree.groups()}
    classes = {type(m).__name__ for m in group_modules(gm).values()}
    assert classes == {"GPT2Block", "GPT2Attention", "GPT2MLP", "Embedding", "LayerNorm"}
    # flat modules (Conv1D, Dropout, ln_1) are inlined: their parameters stay reachable by name
    block = gm.get_submodule("h.1")
    assert not isinstance(block.ln_1, torch.fx.GraphModule)
    assert block.ln_1.weight is gm.get_parameter("h.1.ln_1.weight")


def test_only_some_modules_grouped_deep_paths_go_through_containers(gpt2_program, gpt2_model):
    model, args, kwargs = gpt2_model
    rules = rewrite.parse_rules("group class *GPT2MLP\n")
    gm = lowered(rules, gpt2_program)
    assert_same_outputs(gm(*args, **kwargs), model(*args, **kwargs))
    assert type(gm.get_submodule("h.0.mlp")).__name__ == "GPT2MLP"
    assert not isinstance(gm.get_submodule("h.0"), torch.fx.GraphModule)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert targets == ["h.0.mlp", "h.1.mlp"]
    assert "class h_0_mlp(torch.nn.Module)" in gm.print_readable(print_output=False)


def test_shared_module_multi_output_and_buffer(shared_model, shared_program):
    model, args, kwargs = shared_model
    gm = lowered(MODULARIZE, shared_program)
    assert_same_outputs(gm(*args, **kwargs), model(*args, **kwargs))
    assert set(dict(gm.named_buffers())) == {"scale"}
    assert set(dict(gm.named_parameters())) == set(dict(model.named_parameters()))
    # two calls of `shared` are two submodules; the weights live once, in the first
    assert isinstance(gm.shared, LoweredModule) and isinstance(gm.shared_call1, LoweredModule)
    assert "shared_call1.lin.weight" not in gm.state_dict()
    # the two-output call is unpacked with getitem
    heads = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "heads")
    assert sorted(u.args[1] for u in heads.users) == [0, 1]
    assert all(u.target.__name__ == "getitem" for u in heads.users)


def test_symbolic_trace_graph_module(shared_model):
    model, args, kwargs = shared_model
    traced = torch.fx.symbolic_trace(model)
    gm = lowered(MODULARIZE, traced)
    assert_same_outputs(gm(*args), model(*args))
    assert type(gm).__name__ == "SharedAndList"
    # leaf modules are the model's own modules, called as in the traced graph
    assert gm.get_submodule("layers.0.lin") is model.layers[0].lin
    assert type(gm.get_submodule("layers.0")).__name__ == "Sub"
    assert set(dict(gm.named_parameters())) == set(dict(model.named_parameters()))


def test_buffer_and_input_mutations_are_written_back():
    model, args, _ = models.stateful()
    program = models.export((copy.deepcopy(model), tuple(a.clone() for a in args), {}))
    program = program.run_decompositions({})  # functional form: mutations become outputs
    kinds = {s.kind.name for s in program.graph_signature.output_specs}
    assert {"BUFFER_MUTATION", "USER_INPUT_MUTATION"} <= kinds
    gm = lowered(MODULARIZE, program)
    eager_args = tuple(a.clone() for a in args)
    fx_args = tuple(a.clone() for a in args)
    for _ in range(2):  # the running total makes the second call differ from the first
        assert_same_outputs(gm(*fx_args), model(*eager_args))
        torch.testing.assert_close(fx_args[1], eager_args[1])
        torch.testing.assert_close(gm.acc.total, model.acc.total)
    # the non-persistent buffer is held, but not in state_dict
    assert "offset" in dict(gm.named_buffers()) and "offset" not in gm.state_dict()


def test_in_place_training_ir_keeps_order():
    model, args, _ = models.stateful()
    program = models.export((copy.deepcopy(model), tuple(a.clone() for a in args), {}))
    gm = lowered(MODULARIZE, program)
    eager_args = tuple(a.clone() for a in args)
    fx_args = tuple(a.clone() for a in args)
    for _ in range(2):
        assert_same_outputs(gm(*fx_args), model(*eager_args))
        torch.testing.assert_close(gm.acc.total, model.acc.total)


def test_saved_and_loaded_program(gpt2_pt2, gpt2_model):
    model, args, kwargs = gpt2_model
    gm = lowered(MODULARIZE, gpt2_pt2)
    assert_same_outputs(gm(*args, **kwargs), model(*args, **kwargs))
    assert type(gm.get_submodule("h.1")).__name__ == "GPT2Block"


def test_identical_blocks_compile_once_and_code_stays_exact(gpt2_program, gpt2_model):
    model, args, kwargs = gpt2_model
    gm = lowered(MODULARIZE, gpt2_program)
    lowered_modules = [m for m in gm.modules() if isinstance(m, LoweredModule)]
    forwards = {type(m).forward for m in lowered_modules}
    assert len(forwards) < len(lowered_modules)  # h.0 and h.1 share compiled bodies
    for module in lowered_modules:
        assert module.code == module.graph.python_code(root_module="self").src
    # each module keeps its own class: recompiling one edited graph leaves the twin alone
    first, second = gm.get_submodule("h.0.mlp.act"), gm.get_submodule("h.1.mlp.act")
    assert type(first).forward is type(second).forward
    for node in first.graph.nodes:
        if node.op == "output":
            node.args = (node.args[0].args[0],)  # return the input of the last op instead
    first.recompile()
    x = torch.randn(1, 8, 128)
    assert not torch.allclose(first(x), second(x))


def test_call_nodes_carry_meta(gpt2_program):
    gm = lowered(MODULARIZE, gpt2_program)
    call = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == "h.0")
    assert [v[0] for v in call.meta["nn_module_stack"].values()] == [""]
    assert call.meta["stack_trace"].rstrip().endswith("hidden_states = block(")
    assert tuple(call.meta["val"].shape) == (1, 8, 32)
    inner = next(n for n in gm.get_submodule("h.0").graph.nodes if n.target == "attn")
    assert [v[0] for v in inner.meta["nn_module_stack"].values()] == ["", "h.0"]
    assert "self.attn(" in inner.meta["stack_trace"].splitlines()[-1]


def test_onnx_models_are_refused_with_a_clear_error():
    from types import SimpleNamespace

    from rewrite.backends.fx import to_fx

    result = SimpleNamespace(tree=SimpleNamespace(graph=SimpleNamespace(kind="onnx", source=None)))
    with pytest.raises(rewrite.InputError, match="FX output needs a PyTorch model"):
        to_fx(result)


class WithConstants(torch.nn.Module):
    """A plain tensor attribute and a tensor made in forward: lifted constants."""

    def __init__(self):
        super().__init__()
        self.inner = models.Sub()
        self.inner.table = torch.arange(4.0)

    def forward(self, x):
        return self.inner(x) * self.inner.table + torch.tensor([1.0, 2.0, 3.0, 4.0])


def test_lifted_constants_are_attributes_outside_the_state_dict():
    torch.manual_seed(0)
    model, x = models.perturb(WithConstants().eval()), torch.randn(2, 4)
    program = torch.export.export(model, (x,))
    kinds = {s.kind.name for s in program.graph_signature.input_specs}
    assert "CONSTANT_TENSOR" in kinds
    gm = lowered(MODULARIZE, program)
    assert_same_outputs(gm(x), model(x))
    assert torch.equal(gm.inner.table, model.inner.table)
    assert set(gm.state_dict()) == set(model.state_dict())


def test_dynamic_batch(shared_model):
    model, args, _ = shared_model
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(model, args, dynamic_shapes=({0: batch},))
    gm = lowered(MODULARIZE, program)
    x = torch.randn(7, 4)
    assert_same_outputs(gm(x), model(x))


@pytest.mark.parametrize("source", SOURCES)
def test_tied_weights_stay_tied(source, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                        use_cache=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = models.perturb(GPT2LMHeadModel(config).eval())
    ids, kwargs = torch.randint(0, 100, (1, 8)), {"return_dict": False, "use_cache": False}
    program = torch.export.export(model, (ids,), kwargs=kwargs)
    gm = lowered(MODULARIZE, as_source(program, source, tmp_path))
    assert_same_outputs(gm(ids, **kwargs), model(ids, **kwargs))
    assert set(gm.state_dict()) == set(program.module().state_dict())
    assert gm.get_parameter("lm_head.weight") is gm.get_parameter("transformer.wte.weight")
