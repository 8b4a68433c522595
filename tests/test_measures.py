"""Selection by what a module call is: ``size``, ``depth``, ``repeats`` and ``call``
comparisons, their diagnostics, and what ``explain`` shows of them."""

from __future__ import annotations

import json

import pytest

import rewrite
from rewrite.frontends import from_exported_program
from rewrite.grouping import group_graph


def groups_of(text: str, program) -> list[str]:
    tree = group_graph(rewrite.parse_rules(text, "t.rules"), from_exported_program(program))
    return [g.key for g in tree.groups()]


def every_call(program) -> list[rewrite.grouping.Group]:
    """Every module call of the program, as the groups of modularize.rules."""
    graph = from_exported_program(program)
    return list(group_graph(rewrite.load_rules("modularize"), graph).groups())


def keys(groups) -> list[str]:
    return [g.key for g in groups]


def torch_sizes(program) -> dict[str, int]:
    """Per module call key (``path``, ``path@N``), the operations inside it, nested calls
    included, counted from torch's own ``nn_module_stack`` metadata (not by rewrite)."""
    sizes: dict[str, int] = {}
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        for key in node.meta.get("nn_module_stack", {}):
            call = key.removeprefix("L__self__")
            if call:
                sizes[call] = sizes.get(call, 0) + 1
    return sizes


# --- what the values are ----------------------------------------------------------------------


def test_gpt2_blocks_by_size_depth_and_repeats(gpt2_program, gpt2_model):
    n_layer = gpt2_model[0].config.n_layer
    calls = every_call(gpt2_program)
    # size: every operation inside the call, nested calls included (= the modularize group)
    sizes = torch_sizes(gpt2_program)
    assert [g.size for g in calls] == [sizes[g.key] for g in calls]
    assert sorted(k for k, size in sizes.items() if size >= 30) == [
        f"h.{i}" for i in range(n_layer)]
    assert groups_of("group size >= 30", gpt2_program) == [f"h.{i}" for i in range(n_layer)]
    assert groups_of("group size < 30 and class *GPT2Attention", gpt2_program) == [
        f"h.{i}.attn" for i in range(n_layer)]
    # depth: 1 for the top-level calls, 2 inside them
    assert groups_of("group depth == 1", gpt2_program) == [
        g.key for g in calls if "/" not in g.id]
    assert groups_of("group depth >= 3", gpt2_program) == [  # inside attn / mlp, under a block
        g.key for g in calls if g.id.count("/") >= 2]
    # repeats: calls of the same class in the model
    assert groups_of("group repeats == 2 and depth == 1 and not class *Embedding",
                     gpt2_program) == [f"h.{i}" for i in range(n_layer)]
    layer_norms = [g for g in calls if g.call.class_name == "LayerNorm"]
    assert len(layer_norms) == 2 * n_layer + 1
    n = len(layer_norms)
    assert groups_of(f"group repeats == {n} and class LayerNorm", gpt2_program) == keys(
        layer_norms)
    assert groups_of(f"group repeats != {n} and class LayerNorm", gpt2_program) == []


def test_llama_layers_are_the_big_repeated_top_level_calls(llama_program, llama_model):
    layers = llama_model[0].config.num_hidden_layers
    text = "group repeats >= 2 and depth <= 1 and size >= 20"
    assert groups_of(text, llama_program) == [f"layers.{i}" for i in range(layers)]
    # each layer's size: the operations torch's metadata puts inside it
    sizes = torch_sizes(llama_program)
    tree = rewrite.apply(rewrite.parse_rules(text), llama_program).tree
    assert {g.key: tree.measures(g).size for g in tree.groups()} == {
        f"layers.{i}": sizes[f"layers.{i}"] for i in range(layers)}


def test_call_index_of_a_shared_module(shared_program):
    assert groups_of("group call 1", shared_program) == ["shared@1", "shared.lin@1"]
    assert groups_of("group path shared and call >= 1", shared_program) == ["shared@1"]
    assert groups_of("group path shared and call != 1", shared_program) == ["shared"]
    # `call 0` is `call == 0`: the first call of every module
    assert groups_of("group call 0 and depth == 1", shared_program) == [
        "shared", "layers.0", "layers.1", "layers.2", "heads"]
    # a shared module called twice counts twice in `repeats` (Sub: shared x2 + 3 layers)
    assert groups_of("group repeats == 5", shared_program) == [
        "shared", "shared@1", "layers.0", "layers.1", "layers.2"]


def test_combined_with_other_selectors_and_precedence(gpt2_program):
    text = "group depth <= 2 and size >= 10\nflat class *GPT2MLP\n"
    assert groups_of(text, gpt2_program) == ["h.0", "h.0.attn", "h.1", "h.1.attn"]
    text = "flat size < 20 priority 1\ngroup class *GPT2** or class *LayerNorm\n"
    assert groups_of(text, gpt2_program) == ["h.0", "h.0.attn", "h.1", "h.1.attn"]
    # not binds tighter than and, and than or
    assert groups_of("group not depth == 1 and size > 20 or path ln_f", gpt2_program) == [
        "h.0.attn", "h.1.attn", "ln_f"]


def test_tag_rules_see_the_calls_around_a_node(gpt2_program):
    text = 'tag depth == 1 and size >= 30 with big = "y"\ngroup has big and depth == 2'
    # the nodes of the blocks are tagged; every call inside a block holds only tagged nodes
    expected = groups_of("group depth == 2 and path h.*.*", gpt2_program)
    assert groups_of(text, gpt2_program) == expected and expected


def test_a_tag_named_like_a_measure_is_still_a_tag(staged_program):
    rules = rewrite.parse_rules('tag any with size = "big"\ngroup size == "big" and depth == 1')
    assert [g.key for g in rewrite.apply(rules, staged_program).tree.groups()] == [
        "enc", "mid", "dec"]


# --- diagnostics ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, location, message, hint", [
    ("group sise >= 3", "1:7", "unknown comparison 'sise'", "did you mean 'size'?"),
    ("group depht <= 2", "1:7", "unknown comparison 'depht'", "did you mean 'depth'?"),
    ("group any or\n  repeat >= 2", "2:3", "unknown comparison 'repeat'",
     "did you mean 'repeats'?"),
    ("group size >= 2.5", "1:15", "size compares with an integer, not '2.5'", None),
    ("group call 1x", "1:12", "call compares with an integer, not '1x'", None),
    ("group size >= big", "1:15", "unexpected 'big', expected an integer", None),
    ('group size >= "3"', "1:15", "expected an integer", None),
    ("group size 3", "1:7", "size needs a comparison with an integer", None),
    ("group path a and depth", "1:18", "depth needs a comparison with an integer", None),
    ("group size >", "1:13", "unexpected end of file, expected an integer", None),
    ('group "size" >= 3', "1:7", 'unknown comparison "size"', "did you mean 'size'?"),
    ("group pth 3", "1:7", "unknown selector 'pth'", "did you mean 'path'?"),
    ("group size = 3", "1:12", "compares with '=='", "did you mean '=='?"),
    ("group size => 3", "1:12", "unknown comparison '=>'", "did you mean '>='?"),
])
def test_diagnostics(text, location, message, hint):
    with pytest.raises(rewrite.RuleError) as e:
        rewrite.parse_rules(text, "t.rules")
    (diagnostic,) = e.value.diagnostics
    assert diagnostic.span.location == f"t.rules:{location}"
    assert message in diagnostic.message
    assert diagnostic.hint == hint
    rendered = str(e.value).splitlines()
    column = int(location.split(":")[1])
    assert rendered[2] == "    " + " " * (column - 1) + "^"


def test_check_accepts_every_form(run_cli, tmp_path):
    rules = tmp_path / "m.rules"
    rules.write_text("group size >= 100 and depth <= 2\nflat repeats < 2 or call >= 1\n"
                     'group call 0 priority 1\ntag size > 3 with big = "1"\n'
                     "group size != 0 and depth < 9 and repeats == 1 and call <= 0\n")
    assert run_cli("check", rules).code == 0
    rules.write_text("group sise >= 100\n")
    r = run_cli("check", rules)
    assert r.code == 1
    assert r.err.startswith(f"{rules}:1:7: error: unknown comparison 'sise'")


# --- explain shows the values -----------------------------------------------------------------


def test_explain_json_and_verbose_text_show_the_values(run_cli, tmp_path, shared_pt2,
                                                       shared_program):
    rules = tmp_path / "s.rules"
    rules.write_text("group path shared or path layers.*\ngroup class *Linear and call 1\n")
    r = run_cli("explain", rules, shared_pt2, "--json")
    assert r.code == 0, r
    groups = {g["id"]: g for g in json.loads(r.out)["groups"]}
    sizes = torch_sizes(shared_program)
    assert groups["shared@1"]["nodes"] == sizes["shared@1"]
    assert groups["shared@1"]["measures"] == {
        "size": sizes["shared@1"], "depth": 1, "repeats": 5, "call": 1}
    (inner,) = groups["shared@1"]["children"]
    assert inner["id"] == "shared@1/shared.lin@1"
    # the Linear classes: 2 calls of shared.lin, 3 layers' lin, heads.proj
    assert inner["measures"] == {"size": sizes["shared.lin@1"], "depth": 2, "repeats": 6,
                                 "call": 1}
    assert groups["layers.2"]["measures"]["call"] == 0

    plain = run_cli("explain", rules, shared_pt2)
    assert "repeats" not in plain.out  # the default table keeps its columns
    verbose = run_cli("explain", rules, shared_pt2, "-v")
    header, *rows = verbose.out.splitlines()[1:]
    assert header.split()[:7] == ["group", "class", "nodes", "size", "depth", "repeats", "call"]
    row = next(r.split() for r in rows if r.startswith("shared@1 "))
    assert row[2:7] == [str(groups["shared@1"]["nodes"]), str(groups["shared@1"]["nodes"]),
                        "1", "5", "1"]
