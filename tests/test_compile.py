"""Compiled rules: what each selector selects, precedence, templates and include."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rewrite
from rewrite.compile import Facts
from rewrite.grouping import group_graph
from rewrite.grouping.measures import CallMeasures
from rewrite.grouping.stacks import StackTable
from rewrite.grouping.subjects import CallSubjects
from tests.ir_builder import GraphBuilder, call

GPT2 = "transformers.models.gpt2.modeling_gpt2."
EMB = call("wte", "torch.nn.modules.sparse.Embedding")
H0, H1, H12 = (call(f"h.{i}", GPT2 + "GPT2Block") for i in (0, 1, 12))
H0A, H1A = call("h.0.attn", GPT2 + "GPT2Attention"), call("h.1.attn", GPT2 + "GPT2Attention")
H0M, H1M = call("h.0.mlp", GPT2 + "GPT2MLP"), call("h.1.mlp", GPT2 + "GPT2MLP")
DROP = call("h.0.attn.drop", "torch.nn.modules.dropout.Dropout")
SH0, SH1 = call("shared", "my.pkg.Shared", 0), call("shared", "my.pkg.Shared", 1)
ALL = {"wte", "h.0", "h.0.attn", "h.0.attn.drop", "h.0.mlp", "h.1", "h.1.attn", "h.1.mlp",
       "h.12", "shared", "shared@1"}


def model_graph():
    """Calls like a small GPT-2 plus a shared module called twice, with tags and targets."""
    b = GraphBuilder()
    x = b.input()
    rows = [
        ((EMB,), "aten.embedding.default", None),
        ((H0,), "aten.layer_norm.default", {"stage": "a"}),
        ((H0, H0A), "aten.mm.default", {"stage": "a"}),
        ((H0, H0A, DROP), "aten.dropout.default", {"stage": "a"}),
        ((H0, H0M), "aten.gelu.default", {"stage": "a"}),
        ((H1,), "aten.add.Tensor", {"stage": "b"}),
        ((H1, H1A), "aten.mm.default", {"stage": "b"}),
        ((H1, H1M), "aten.gelu.default", {"stage": "b", "extra": "y"}),
        ((H12,), "aten.add.Tensor", None),
        ((SH0,), "aten.relu.default", None),
        ((), "aten.add.Tensor", None),
        ((SH1,), "aten.relu.default", None),
    ]
    for k, (stack, target, tags) in enumerate(rows):
        x = b.op(f"n{k}", target, [x], stack, tags)
    b.output([x])
    return b.graph()


GRAPH = model_graph()


def grouped(text: str, graph=GRAPH) -> set[str]:
    tree = group_graph(rewrite.parse_rules(text), graph)
    return {g.call.key for g in tree.groups()}


@pytest.mark.parametrize("selector, expected", [
    ("path h.*", {"h.0", "h.1", "h.12"}),
    ("path h.**", {"h.0", "h.0.attn", "h.0.attn.drop", "h.0.mlp", "h.1", "h.1.attn", "h.1.mlp",
                   "h.12"}),
    ("path **", ALL),
    ("path **.attn", {"h.0.attn", "h.1.attn"}),
    ("path h.[0-3].attn", {"h.0.attn", "h.1.attn"}),
    ("path h.[0-3]", {"h.0", "h.1"}),
    ("path h.[1,12]", {"h.1", "h.12"}),
    ("path h.?", {"h.0", "h.1"}),
    ("path shared", {"shared", "shared@1"}),
    ("path shared@1", {"shared@1"}),
    ("path shared@0", {"shared"}),
    ("path shared@*", {"shared", "shared@1"}),
    ('path "h.0.mlp"', {"h.0.mlp"}),
    ("class *GPT2Block", {"h.0", "h.1", "h.12"}),
    ("class Embedding", {"wte"}),
    ("class GPT2*", {"h.0", "h.0.attn", "h.0.mlp", "h.1", "h.1.attn", "h.1.mlp", "h.12"}),
    ("class transformers.**.GPT2MLP", {"h.0.mlp", "h.1.mlp"}),
    ("class torch.nn.*", set()),  # one * stays inside one dotted segment
    ("class torch.nn.**", {"wte", "h.0.attn.drop"}),
    ("op aten.mm", {"h.0", "h.0.attn", "h.1", "h.1.attn"}),  # any node inside, at any depth
    ("op aten.dropout.*", {"h.0", "h.0.attn", "h.0.attn.drop"}),
    ("op aten.relu.default", {"shared", "shared@1"}),
    ('stage == "a"', {"h.0", "h.0.attn", "h.0.attn.drop", "h.0.mlp"}),  # every node inside
    ('stage == "b"', {"h.1", "h.1.attn", "h.1.mlp"}),
    ("has extra", {"h.1.mlp"}),
    ('stage != "a"', ALL - {"h.0", "h.0.attn", "h.0.attn.drop", "h.0.mlp"}),
    ("class *GPT2Block and not path h.12", {"h.0", "h.1"}),
    ("class *MLP or class *Embedding", {"h.0.mlp", "h.1.mlp", "wte"}),
    ("not (path h.** or path shared)", {"wte"}),
    ("any", ALL),
])
def test_selectors_on_module_calls(selector, expected):
    assert grouped(f"group {selector}") == expected


def test_tag_rules_select_nodes_and_feed_group_rules():
    text = 'tag op aten.mm.* or op aten.dropout.* with kind = "heavy"\n' \
           'tag path h.1 with stage = "late"\n' \
           'group kind == "heavy"\n'
    tree = group_graph(rewrite.parse_rules(text), GRAPH)
    tags = {GRAPH.nodes[i].name: dict(t) for i, t in enumerate(tree.tags)}
    assert tags["n2"] == {"stage": "a", "kind": "heavy"}  # op selects the node itself
    assert tags["n6"] == {"stage": "late", "kind": "heavy"}  # path: a call around the node
    assert tags["n7"] == {"stage": "late", "extra": "y"}
    assert tags["n8"] == {}
    assert tags["x"] == {} and tags["output"] == {}  # graph inputs/outputs are never tagged
    assert {g.call.key for g in tree.groups()} == {"h.0.attn", "h.0.attn.drop", "h.1.attn"}


# --- the per-call masks agree with the one-subject reference predicates ------------------------

ATOMS = ["path h.*", "path **.attn", "path h.[0-1]", "path shared@1", "path **",
         "class *GPT2Block", "class torch.**", "class *MLP", "op aten.mm", "op aten.relu.*",
         'stage == "a"', 'stage != "b"', "has extra", "any", "size >= 2", "size < 4",
         "depth == 2", "depth > 1", "repeats >= 2", "repeats == 1", "call 1", "call != 0"]


@st.composite
def selectors(draw, depth=0):
    if depth > 2 or draw(st.booleans()):
        return draw(st.sampled_from(ATOMS))
    kind = draw(st.sampled_from(["and", "or", "not"]))
    if kind == "not":
        return f"not ({draw(selectors(depth + 1))})"
    parts = draw(st.lists(selectors(depth + 1), min_size=2, max_size=3))
    return f" {kind} ".join(f"({p})" for p in parts)


def reference_facts(graph):
    """Per call, the facts of the reference semantics (selectors table in selectors.py)."""
    out = {}
    for c in graph.calls:
        inside = [n for n in graph.nodes if n.stack and c in n.stack]
        common = dict(inside[0].tags)
        for n in inside[1:]:
            common = {k: v for k, v in common.items() if n.tags.get(k) == v}
        measures = {"size": sum(not n.is_io for n in inside),
                    "depth": inside[0].stack.index(c) + 1,
                    "repeats": sum(d.cls == c.cls for d in graph.calls), "call": c.index}
        out[c] = Facts((c.path,), (c.cls,), {n.target for n in inside}, common,
                       (f"{c.path}@{c.index}",), (measures,))
    return out


FACTS = reference_facts(GRAPH)


@settings(max_examples=150, deadline=None)
@given(selectors())
def test_masks_agree_with_reference_predicates(selector):
    (rule,) = rewrite.parse_rules(f"group {selector}").rules
    columns = GRAPH.columns
    table = StackTable(columns, GRAPH.calls)
    sid = columns.stack_id.astype(np.int64)
    subjects = CallSubjects(table, sid, ~columns.is_io, columns.target_id, columns.targets,
                            columns.tags_id, columns.tag_sets,
                            CallMeasures(table, sid, ~columns.is_io))
    mask = rule.mask(subjects)
    expected = np.array([rule.predicate(FACTS[c]) for c in table.calls])
    assert mask.tolist() == expected.tolist()


# --- precedence ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, attention_grouped", [
    ("group any\nflat class *GPT2Attention", False),           # the later rule wins
    ("flat class *GPT2Attention\ngroup any", True),
    ("flat class *GPT2Attention priority 1\ngroup any", False),  # then priority wins
    ("group any priority -1\nflat class *GPT2Attention priority -2", True),
    ("group class *GPT2Attention\nflat path h.1.attn", False),  # per call: h.0.attn stays
])
def test_precedence_priority_then_later_rule(text, attention_grouped):
    keys = grouped(text)
    assert ("h.1.attn" in keys) is attention_grouped
    if text.startswith("group class"):
        assert "h.0.attn" in keys


def test_flat_does_not_flatten_what_is_inside():
    tree = group_graph(rewrite.parse_rules("group any\nflat path h.0"), GRAPH)
    top = [g.key for g in tree.root.children]
    assert "h.0" not in top and "h.0.attn" in top and "h.0.mlp" in top


def test_tag_rule_precedence():
    text = ('tag any with stage = "x" priority 1\n'
            'tag path h.0 with stage = "y"\n'
            'tag path h.0 with stage = "z"\n')
    tree = group_graph(rewrite.parse_rules(text), GRAPH)
    stages = {GRAPH.nodes[i].name: t.get("stage") for i, t in enumerate(tree.tags)}
    assert stages["n1"] == "x"  # priority 1 runs last and wins
    text = 'tag path h.0 with stage = "y"\ntag path h.0 with stage = "z"\n'
    tree = group_graph(rewrite.parse_rules(text), GRAPH)
    assert tree.tags[2]["stage"] == "z"  # equal priority: the later rule wins


def test_rules_matching_nothing_warn_with_their_location():
    text = "group class *GPT2Block\ngroup class *Nothing\ntag path nowhere with a = \"b\"\n"
    tree = group_graph(rewrite.parse_rules(text, "w.rules"), GRAPH)
    assert [(w.severity, w.span.location, w.message) for w in tree.warnings] == [
        ("warning", "w.rules:2:1", "group rule matches nothing in this model"),
        ("warning", "w.rules:3:1", "tag rule matches nothing in this model"),
    ]


# --- templates -------------------------------------------------------------------------------


def test_name_and_domain_templates():
    text = ('group path shared as "{class}_{index}" domain "x.{package}"\n'
            'group path h.0.mlp as "{name}|{path}|{module}|{qualname}"\n'
            "group path wte\n")
    tree = group_graph(rewrite.parse_rules(text), GRAPH)
    found = {g.id: (g.function_name, g.domain) for g in tree.groups()}
    assert found["shared"] == ("Shared_0", "x.my")
    assert found["shared@1"] == ("Shared_1", "x.my")
    assert found["h.0.mlp"] == (
        f"h_0_mlp|h.0.mlp|{GPT2[:-1]}|{GPT2}GPT2MLP", "pkg.transformers")
    assert found["wte"] == ("Embedding", "pkg.torch")  # the defaults


# --- include ---------------------------------------------------------------------------------


def test_include_relative_to_the_including_file(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "base.rules").write_text("flat class *GPT2Attention\n")
    (tmp_path / "main.rules").write_text('group any\ninclude "lib/base.rules"\n')
    (tmp_path / "before.rules").write_text('include "lib/base.rules"\ngroup any\n')
    monkeypatch.chdir(tmp_path)
    rules = rewrite.load_rules("main.rules")
    assert [r.origin for r in rules.rules] == ["main.rules:1", "lib/base.rules:1"]
    assert "h.0.attn" not in {g.call.key for g in group_graph(rules, GRAPH).groups()}
    # an include is spliced in where it stands: rules after it win
    rules = rewrite.load_rules("before.rules")
    assert "h.0.attn" in {g.call.key for g in group_graph(rules, GRAPH).groups()}


def test_include_from_the_shipped_library(tmp_path):
    (tmp_path / "mine.rules").write_text('include "modularize.rules"\nflat path wte\n')
    rules = rewrite.load_rules(tmp_path / "mine.rules")
    assert rules.rules[0].origin.endswith("modularize.rules:3")
    assert grouped("group any") - {"wte"} == {
        g.call.key for g in group_graph(rules, GRAPH).groups()}


def test_include_cycle_is_reported_at_the_include(tmp_path, monkeypatch):
    (tmp_path / "a.rules").write_text('group any\ninclude "b.rules"\n')
    (tmp_path / "b.rules").write_text('# b\ninclude "a.rules"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(rewrite.RuleError) as info:
        rewrite.load_rules("a.rules")
    (d,) = info.value.diagnostics
    assert (d.span.location, d.message) == ("b.rules:2:1", "include cycle through 'a.rules'")


def test_missing_include_and_errors_inside_included_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.rules").write_text('group any\n  include "nope.rules"\n')
    with pytest.raises(rewrite.RuleError) as info:
        rewrite.load_rules("m.rules")
    (d,) = info.value.diagnostics
    assert d.span.location == "m.rules:2:3"
    assert d.message == "cannot include 'nope.rules': no such rules file"
    (tmp_path / "bad.rules").write_text("group any\ngroup pth x\n")
    (tmp_path / "top.rules").write_text('include "bad.rules"\n')
    with pytest.raises(rewrite.RuleError) as info:
        rewrite.load_rules("top.rules")
    assert info.value.diagnostics[0].span.location == "bad.rules:2:7"


def test_load_rules_by_library_name():
    assert rewrite.load_rules("gpt2").files[0].endswith("gpt2.rules")
    with pytest.raises(rewrite.RuleError, match="no such rules file"):
        rewrite.load_rules("no-such-library-file")


# --- matching many texts at once --------------------------------------------------------------

PATH_PARTS = ["h", "0", "10", "attn", "mlp", "rope", "x"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(PATH_PARTS), min_size=1, max_size=4).map(".".join),
                max_size=12)
       | st.lists(st.sampled_from(["rope", "h", "h.0"]), max_size=60),  # many equal paths
       st.sampled_from(["h", "h.*", "h.**", "**.attn", "*", "h.[0-9].**", "?", "**.x",
                        "h.[1,10].*", "rope", "h.0.attn", "*.*", "h.?.*"]))
def test_matching_a_column_of_paths_agrees_with_one_at_a_time(paths, pattern):
    from rewrite.compile.patterns import Glob, TextColumn

    glob = Glob(pattern)
    expected = [glob(p) for p in paths]
    assert glob.mask(TextColumn(paths)).tolist() == expected
    assert glob.mask(TextColumn(tuple(paths))).tolist() == expected
    distinct = {p: i for i, p in enumerate(dict.fromkeys(paths))}  # as frontends give them
    ids = np.array([distinct[p] for p in paths], dtype=np.int64)
    assert glob.mask(TextColumn(paths, ids, distinct)).tolist() == expected


@pytest.mark.parametrize(("kind", "pattern", "texts", "want"), [
    ("class", "GPT2Block", ["transformers.GPT2Block", "x.GPT2BlockX"], [True, False]),
    ("class", "*Block", ["a.b.GPT2Block", "a.b.Other", "a.b.GPT2Block"], [True, False, True]),
    ("class", "transformers.**.Block", ["transformers.m.Block", "other.m.Block"], [True, False]),
    ("op", "aten.mm", ["aten.mm.default", "aten.mm", "aten.mmx.default"], [True, True, False]),
    ("path", "h.*", ["h.0", "h.0.attn"], [True, False]),
])
def test_column_masks_agree_with_one_text_at_a_time(kind, pattern, texts, want):
    # a class or op pattern matches a part of the text (the class name, the target without
    # its overload); masking a whole column must mean the same as asking one text at a time
    from rewrite.compile.patterns import ClassGlob, Glob, OpGlob, TextColumn

    glob = {"class": ClassGlob, "op": OpGlob, "path": Glob}[kind](pattern)
    assert [glob(t) for t in texts] == want
    assert glob.mask(TextColumn(texts)).tolist() == want
    assert glob.test_all(texts) == want
