"""The FX frontend on real exports, loaded .pt2 files and symbolic traces, in both stack forms."""

from __future__ import annotations

import copy

import pytest
import torch

import rewrite
from rewrite.frontends import from_exported_program, from_graph_module, load_graph
from rewrite.frontends.calls import split_runs
from rewrite.grouping import group_graph
from rewrite.ir import LazyNodes, ModuleCall
from tools import models
from tests.ir_builder import call

GPT2 = "transformers.models.gpt2.modeling_gpt2."


def keys(graph) -> list[str]:
    return [c.key for c in graph.calls]


def stack_keys(node) -> list[str] | None:
    return None if node.stack is None else [c.key for c in node.stack]


def by_name(graph):
    return {n.name: n for n in graph.nodes}


# --- exported programs -----------------------------------------------------------------------


def test_gpt2_export(gpt2_program):
    graph = from_exported_program(gpt2_program)
    assert graph.root_class == GPT2 + "GPT2Model"  # the root entry, dropped from stacks
    assert {"wte", "wpe", "drop", "h.0", "h.0.attn", "h.0.mlp", "h.1.mlp.c_fc", "ln_f"} <= set(
        keys(graph))
    block = next(c for c in graph.calls if c.key == "h.1")
    assert (block.cls, block.index, block.class_name, block.package) == (
        GPT2 + "GPT2Block", 0, "GPT2Block", "transformers")
    fx_nodes = list(gpt2_program.graph.nodes)
    assert len(graph.nodes) == len(fx_nodes)
    for node, fx_node in zip(graph.nodes, fx_nodes):
        assert node.source is fx_node and node.name == fx_node.name
        assert [graph.nodes[i].source for i in node.inputs] == fx_node.all_input_nodes
        if fx_node.op in ("placeholder", "output"):
            assert node.is_io and node.stack == ()
        else:
            assert node.stack is not None and not node.is_io  # export gives every node one
    nodes = by_name(graph)
    assert stack_keys(nodes["addmm"]) == ["h.0", "h.0.attn", "h.0.attn.c_attn"]
    assert stack_keys(nodes["embedding_1"]) == ["wpe"]


def test_loaded_pt2_reads_the_same_calls(gpt2_program, gpt2_pt2):
    in_memory = from_exported_program(gpt2_program)
    loaded = load_graph(gpt2_pt2)  # classes are strings in a .pt2
    assert loaded.calls == in_memory.calls
    assert loaded.root_class == in_memory.root_class
    assert [stack_keys(n) for n in loaded.nodes] == [stack_keys(n) for n in in_memory.nodes]


def test_shared_module_calls_are_distinct(shared_program):
    graph = from_exported_program(shared_program)
    assert keys(graph) == ["shared", "shared.lin", "shared@1", "shared.lin@1", "layers.0",
                           "layers.0.lin", "layers.1", "layers.1.lin", "layers.2",
                           "layers.2.lin", "heads", "heads.proj"]
    nodes = by_name(graph)
    assert stack_keys(nodes["linear_1"]) == ["shared@1", "shared.lin@1"]
    assert stack_keys(nodes["relu_1"]) == ["shared@1"]
    assert stack_keys(nodes["mul"]) == []  # the root entry alone: top level
    tree = group_graph(rewrite.parse_rules("group path shared"), graph)
    assert [(g.id, g.call.index, g.size) for g in tree.groups()] == [
        ("shared", 0, 2), ("shared@1", 1, 2)]


def test_columns_agree_with_the_nodes(shared_program):
    graph = from_exported_program(shared_program)
    check_columns(graph)
    columns = graph.columns
    for node in graph.nodes:
        stack_calls = columns.stack_calls[columns.stack_id[node.index]]
        assert stack_calls is None or tuple(graph.calls[k] for k in stack_calls) == node.stack
    users = graph.users()
    for node in graph.nodes:
        assert [graph.nodes[u].source for u in users[node.index]] == list(node.source.users)


def check_columns(graph) -> None:
    """The columns, the stack tree and the call columns say what the records say."""
    from tests.ir_builder import call_columns_of

    columns, nodes = graph.columns, graph.nodes.materialize()
    for node in nodes:
        i = node.index
        assert columns.stacks[columns.stack_id[i]] == node.stack
        assert columns.targets[columns.target_id[i]] == node.target
        assert dict(columns.tag_sets[columns.tags_id[i]]) == dict(node.tags)
        assert bool(columns.is_io[i]) == node.is_io
        assert tuple(columns.input_index[columns.input_start[i]:columns.input_start[i + 1]]
                     ) == node.inputs
    for k, ids in enumerate(columns.stack_calls):
        assert columns.stack_depth[k] == (-1 if ids is None else len(ids))
        assert columns.stack_last[k] == (ids[-1] if ids else -1)
        parent = columns.stack_parent[k]
        assert parent == -1 or columns.stack_calls[parent] == ids[:-1]
        if ids is not None:
            assert tuple(graph.calls[c] for c in ids) == columns.stacks[k]
    expected = call_columns_of(graph.calls)
    got = columns.call_columns
    assert got.paths == expected.paths and got.classes == expected.classes
    assert got.class_id.tolist() == expected.class_id.tolist()
    assert got.index.tolist() == expected.index.tolist()


def test_stack_tree_and_call_columns(shared_program, gpt2_program):
    check_columns(from_exported_program(shared_program))
    check_columns(from_exported_program(gpt2_program))
    check_columns(from_graph_module(legacy(torch.fx.symbolic_trace(models.SharedApart()))))


def test_synthetic_graph_with_odd_metadata():
    """Stackless nodes, the empty-stack marker, unhashable and private tags, node.tag, empty
    dicts: read node by node as the columns say (runs of equal neighbours are read once)."""
    from tools.synthetic import synthetic_graph

    from rewrite.frontends.fx.graph import EMPTY_STACK_KEY, from_fx_graph

    fx_graph = synthetic_graph(600)
    for i, node in enumerate(fx_graph.nodes):
        if i % 7 == 0:
            node.meta["custom"] = {"_torch": 1, "k": i % 3}
        if i % 11 == 0:
            node.meta["custom"] = {"a": [i % 2]}  # unhashable
        if i % 13 == 0:
            node.meta.pop("nn_module_stack", None)
        if i % 17 == 0 and "nn_module_stack" in node.meta:
            node.meta["nn_module_stack"] = dict(node.meta["nn_module_stack"],
                                                **{EMPTY_STACK_KEY: ("", None)})
        if i % 19 == 0:
            node.tag = f"t{i % 2}"
        if i % 23 == 0:
            node.meta["nn_module_stack"] = {}
    graph = from_fx_graph(fx_graph)
    check_columns(graph)
    nodes = by_name(graph)
    for i, fx_node in enumerate(fx_graph.nodes):
        node = nodes[fx_node.name]
        custom = fx_node.meta.get("custom") or {}
        tags = {k: str(v) for k, v in custom.items() if not k.startswith("_")}
        if getattr(fx_node, "tag", None) is not None:
            tags.setdefault("tag", fx_node.tag)
        assert dict(node.tags) == tags
        if node.is_io:
            assert node.stack == ()
        elif not fx_node.meta.get("nn_module_stack"):
            assert node.stack is None
        else:
            paths = [path for key, (path, _) in fx_node.meta["nn_module_stack"].items()
                     if path and key != EMPTY_STACK_KEY]
            assert [c.path for c in node.stack] == paths


def test_empty_graph_and_foreign_inputs():
    from rewrite.frontends.fx.graph import from_fx_graph

    graph = from_fx_graph(torch.fx.Graph())
    assert len(graph.nodes) == 0 and graph.columns.size == 0 and graph.calls == ()
    other = torch.fx.Graph()
    foreign = other.placeholder("y")
    fx_graph = torch.fx.Graph()
    x = fx_graph.placeholder("x")
    fx_graph.output((x,))
    out = next(n for n in fx_graph.nodes if n.op == "output")
    out._input_nodes[foreign] = None  # what a broken pass could leave
    with pytest.raises(rewrite.InputError, match="^the graph is malformed: node y is an input "
                       "of one of its nodes but not a node of the graph$"):
        from_fx_graph(fx_graph)


def test_paths_as_dynamo_wrote_them_read_as_torch_writes_them(gpt2_program):
    """torch 2.9's strict export leaves a path unnormalized when a decorated ``forward`` gets
    ``self`` as an argument (``L['args'][0].h[slice(None, 2, None)]._modules['0']``): the
    calls and groups are those of the normalized program; other paths stay as they are."""
    program = copy.deepcopy(gpt2_program)
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {key: (_dynamo_form(path), cls) if path else (path, cls)
                                            for key, (path, cls) in stack.items()}
    assert any("L['args'][0]" in path for node in program.graph.nodes
               for path, _ in node.meta.get("nn_module_stack", {}).values())
    assert keys(from_exported_program(program)) == keys(from_exported_program(gpt2_program))
    rules = rewrite.parse_rules("group class *GPT2Block\ngroup class *GPT2Attention")
    assert ([g.id for g in rewrite.apply(rules, program).tree.groups()]
            == [g.id for g in rewrite.apply(rules, gpt2_program).tree.groups()])


def _dynamo_form(path: str) -> str:
    """``h.0.attn`` as ``L['args'][0].h[slice(None, 2, None)]._modules['0'].attn``."""
    parts = path.split(".")
    text = "L['args'][0]"
    for i, part in enumerate(parts):
        if part.isdigit() and i > 0 and parts[i - 1] == "h":
            text += f"[slice(None, 2, None)]._modules['{part}']"
        else:
            text += f".{part}"
    return text


def test_unlifted_module_reads_like_the_program(shared_program):
    graph = from_graph_module(shared_program.module())
    assert keys(graph) == keys(from_exported_program(shared_program))


# --- nodes without a stack -------------------------------------------------------------------


def test_nodes_without_stack_are_placed_with_their_users(shared_program):
    gm = copy.deepcopy(shared_program.graph_module)
    fx = {n.name: n for n in gm.graph.nodes}
    del fx["chunk"].meta["nn_module_stack"]  # as a graph pass would leave it
    fx["getitem"].meta["nn_module_stack"] = {
        "_empty_nn_module_stack_from_metadata_hook": ("", None)}
    del fx["relu"].meta["nn_module_stack"]  # read by shared@1 only
    graph = from_graph_module(gm)
    nodes = by_name(graph)
    assert nodes["chunk"].stack is None and nodes["getitem"].stack is None
    tree = group_graph(rewrite.load_rules("modularize"), graph)
    owner = {graph.nodes[i].name: tree.owner[i] for i in range(len(graph.nodes))}
    assert owner["chunk"] == owner["getitem"] == "heads"  # all their users are in heads
    assert owner["relu"] == "shared@1/shared.lin@1"  # its only user, wherever that is
    assert owner["x"] == "" and owner["output"] == ""  # graph inputs/outputs: top level


# --- symbolic_trace --------------------------------------------------------------------------


def test_symbolic_trace_graph_module():
    gm = torch.fx.symbolic_trace(models.SharedAndList())
    graph = from_graph_module(gm)
    assert "shared@1" in keys(graph) and "shared.lin@1" in keys(graph)
    nodes = by_name(graph)
    # the tracer records no root entry: root-level calls have no stack and are top level
    assert nodes["mul"].stack == () and nodes["add"].stack == ()
    assert nodes["scale"].stack is None  # get_attr: goes with its users
    assert stack_keys(nodes["shared_lin_1"]) == ["shared@1", "shared.lin@1"]
    tree = group_graph(rewrite.load_rules("modularize"), graph)
    assert {g.id for g in tree.root.children} == {"shared", "shared@1", "layers.0", "layers.1",
                                                  "layers.2", "heads"}


def legacy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite every stack to the older ``{path: cls}`` form, which has no call indices."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {path: cls for path, cls in stack.values()}
    return gm


def test_legacy_stack_form_splits_calls_by_runs():
    graph = from_graph_module(legacy(torch.fx.symbolic_trace(models.SharedApart())))
    # shared, then mid, then shared again: two runs of `shared`, so two calls
    assert keys(graph) == ["shared", "shared.lin", "mid", "mid.lin", "shared@1",
                           "shared.lin@1"]
    tree = group_graph(rewrite.parse_rules("group path shared"), graph)
    assert [g.id for g in tree.groups()] == ["shared", "shared@1"]


def test_legacy_form_cannot_separate_back_to_back_calls():
    graph = from_graph_module(legacy(torch.fx.symbolic_trace(models.SharedAndList())))
    # shared(shared(x)): one run at the caller's level (documented limit); the inner calls
    # are still told apart because the relu of the first call separates them
    assert keys(graph)[:3] == ["shared", "shared.lin", "shared.lin@1"]
    assert "shared@1" not in keys(graph)


def test_split_runs():
    a, b, c = call("a"), call("b"), call("a.c")
    out = split_runs([(a,), (a, c), None, (a, c), (a,), (a, c), (), (a,), (b,), (a,)])
    assert [None if s is None else [x.key for x in s] for s in out] == [
        ["a"], ["a", "a.c"], None, ["a", "a.c"],  # unknown nodes do not break a run
        ["a"], ["a", "a.c@1"],                   # the parent stays, the child restarts
        [], ["a@1"], ["b"], ["a@2"]]
    assert out[0] is out[4][:1] or out[0] == out[4][:1]


# --- tags ------------------------------------------------------------------------------------


def test_tags_from_annotate_and_node_tag(staged_program):
    graph = from_exported_program(staged_program)
    nodes = by_name(graph)
    assert dict(nodes["linear"].tags) == {"stage": "encode"}  # torch's _keys are skipped
    assert dict(nodes["mul"].tags) == {"stage": "decode"}
    assert dict(nodes["x"].tags) == {}
    gm = torch.fx.symbolic_trace(models.Staged())
    for node in gm.graph.nodes:
        if node.op == "call_module":
            node.tag = node.target.split(".")[0]  # as split_by_tags users set it
    tagged = by_name(from_graph_module(gm))
    assert dict(tagged["enc_lin"].tags) == {"tag": "enc"}
    assert dict(tagged["x"].tags) == {}


# --- Graph.nodes -----------------------------------------------------------------------------


def test_lazy_nodes_behave_like_a_tuple(shared_program):
    graph = from_exported_program(shared_program)
    nodes = graph.nodes
    assert isinstance(nodes, LazyNodes)
    first, last = nodes[0], nodes[-1]
    assert first is nodes[0] and last.name == "output" and len(nodes) == last.index + 1
    assert [n.index for n in nodes[2:5]] == [2, 3, 4]
    assert tuple(nodes) == nodes.materialize() and nodes == tuple(nodes)
    assert nodes[0] is first  # records built once
    with pytest.raises(IndexError):
        nodes[len(nodes)]
    assert isinstance(first.stack, tuple) and all(isinstance(c, ModuleCall) for c in
                                                 nodes[20].stack or ())
