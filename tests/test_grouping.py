"""Grouping: the group tree a user gets from rules and a model, and its errors."""

from __future__ import annotations

import copy
import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rewrite
from rewrite.compile import Facts
from rewrite.frontends import from_exported_program, from_graph_module
from rewrite.grouping import group_graph
from tests.ir_builder import GraphBuilder, call

GPT2 = "transformers.models.gpt2.modeling_gpt2."


def shape(group):
    """(id, function, children) of a group, recursively."""
    return (group.id, group.function_name, [shape(c) for c in group.children])


def check_tree_invariants(tree):
    """Every node is in exactly one group (or the top level), owner says which, sizes add up."""
    seen = {}
    for group in tree.root.walk():
        assert list(group.nodes) == sorted(group.nodes)
        for i in group.nodes:
            assert i not in seen
            seen[i] = group.id
        assert group.size == len(group.all_nodes())
    assert seen == dict(enumerate(tree.owner))


# --- real models -----------------------------------------------------------------------------


def test_gpt2_rules_on_gpt2(gpt2_program):
    tree = group_graph(rewrite.load_rules("gpt2"), from_exported_program(gpt2_program))
    block = lambda i: (f"h.{i}", "GPT2Block", [(f"h.{i}/h.{i}.attn", "GPT2Attention", []),
                                               (f"h.{i}/h.{i}.mlp", "GPT2MLP", [])])
    assert [shape(g) for g in tree.root.children] == [
        ("wte", "Embedding_wte", []), ("wpe", "Embedding_wpe", []), block(0), block(1),
        ("ln_f", "FinalLayerNorm", [])]
    h0 = tree.find("h.0")
    assert (h0.kind, h0.call.cls, h0.domain, h0.origin) == (
        "module", GPT2 + "GPT2Block", "pkg.transformers", f"{h0.rule.span.source.name}:7")
    assert h0.origin.endswith("gpt2.rules:7")
    assert tree.find("ln_f").domain == "pkg.torch"
    assert not any("drop" in g.id for g in tree.groups())  # dropout stays flat
    assert tree.warnings == ()
    check_tree_invariants(tree)


def test_modularize_nests_every_call(shared_program):
    graph = from_exported_program(shared_program)
    tree = group_graph(rewrite.load_rules("modularize"), graph)
    assert [shape(g) for g in tree.root.children] == [
        ("shared", "Sub", [("shared/shared.lin", "Linear", [])]),
        ("shared@1", "Sub", [("shared@1/shared.lin@1", "Linear", [])]),
        *[(f"layers.{i}", "Sub", [(f"layers.{i}/layers.{i}.lin", "Linear", [])])
          for i in range(3)],
        ("heads", "SplitHeads", [("heads/heads.proj", "Linear", [])]),
    ]
    assert tree.find("shared@1").call.index == 1
    names = [graph.nodes[i].name for i in tree.find("heads").nodes]
    assert names == ["chunk", "getitem", "getitem_1", "tanh", "sigmoid"]
    top = {graph.nodes[i].name for i in tree.root.nodes}
    assert {"x", "b_scale", "mul", "add", "sum_1", "output"} <= top
    check_tree_invariants(tree)


# --- placement of nodes without a stack --------------------------------------------------------


def test_placement_goes_with_users():
    a, ax, ay, b = call("a"), call("a.x"), call("a.y"), call("b")
    g = GraphBuilder()
    x = g.input()
    c1 = g.op("c1", stack=None)                      # used in a.x and a.y -> a
    c2 = g.op("c2", inputs=[c1], stack=None)         # used by c1's users only -> a.x
    n1 = g.op("n1", inputs=[x, c1, c2], stack=(a, ax))
    n2 = g.op("n2", inputs=[n1, c1], stack=(a, ay))
    c3 = g.op("c3", stack=None)                      # used in a and b -> top level
    n3 = g.op("n3", inputs=[n2, c3], stack=(b,))
    g.op("dead", inputs=[n1], stack=None)            # no user: with its producer -> a.x
    c4 = g.op("c4", inputs=[n3], stack=None)         # read by the output -> top level
    g.output([c4, c3])
    graph = g.graph()
    tree = group_graph(rewrite.load_rules("modularize"), graph)
    owner = {n.name: tree.owner[n.index] for n in graph.nodes}
    assert owner == {"x": "", "c1": "a", "c2": "a/a.x", "n1": "a/a.x", "n2": "a/a.y",
                     "c3": "", "n3": "b", "dead": "a/a.x", "c4": "", "output": ""}
    check_tree_invariants(tree)


def test_a_node_between_two_nodes_of_a_call_goes_into_it():
    """A residual add without a stack, read in its block and by the next one: with its users
    it would land at the top level, and data would leave block 0 and come back."""
    b0, b1, inner = call("b.0"), call("b.1"), call("b.0.attn", "m.Attention")
    g = GraphBuilder()
    x = g.input()
    n0 = g.op("n0", inputs=[x], stack=(b0, inner))
    res = g.op("res", inputs=[x, n0], stack=None)     # users in b.0 and b.1
    n1 = g.op("n1", inputs=[res], stack=(b0,))
    n2 = g.op("n2", inputs=[res, n1], stack=(b1,))
    out = g.op("out", inputs=[n2, res], stack=None)    # read by the output: top level
    g.output([out, res])
    graph = g.graph()
    tree = group_graph(rewrite.parse_rules("group class *Block\ngroup class *Attention"), graph)
    owner = {n.name: tree.owner[n.index] for n in graph.nodes}
    assert owner == {"x": "", "n0": "b.0/b.0.attn", "res": "b.0", "n1": "b.0", "n2": "b.1",
                     "out": "", "output": ""}
    check_tree_invariants(tree)


def test_top_level_nodes_enclosed_by_one_call_go_into_it():
    """Nodes recorded at the top level whose producers and users all lie inside one call (a
    region a strict export recorded at the root) are placed like nodes without a stack; top
    level nodes fed by graph inputs only, or read by the output, stay."""
    a, inner, b = call("a"), call("a.inner", "m.Inner"), call("b")
    g = GraphBuilder()
    x = g.input()
    top = g.op("top", inputs=[x], stack=())               # graph input -> a: stays
    a1 = g.op("a1", inputs=[top], stack=(a,))
    t1 = g.op("t1", inputs=[a1, x], stack=())              # between a1 and a's users
    t2 = g.op("t2", inputs=[t1], stack=())
    a2 = g.op("a2", inputs=[t1], stack=(a, inner))
    a3 = g.op("a3", inputs=[a2, t2], stack=(a,))
    t3 = g.op("t3", inputs=[a3], stack=())                 # read by b and the output: stays
    b1 = g.op("b1", inputs=[t3], stack=(b,))
    g.output([b1, t3])
    graph = g.graph()
    tree = group_graph(rewrite.parse_rules("group any"), graph)
    owner = {n.name: tree.owner[n.index] for n in graph.nodes}
    assert owner == {"x": "", "top": "", "a1": "a", "t1": "a", "t2": "a", "a2": "a/a.inner",
                     "a3": "a", "t3": "", "b1": "b", "output": ""}
    check_tree_invariants(tree)


# --- groups that cannot be outlined ------------------------------------------------------------


def test_a_group_whose_data_leaves_and_comes_back_is_an_error():
    a, b, other = call("a"), call("b"), call("other")
    g = GraphBuilder()
    x = g.input()
    a1 = g.op("a1", inputs=[x], stack=(a,))
    t = g.op("t", inputs=[a1], stack=(other,))       # another call, between a's nodes
    a2 = g.op("a2", inputs=[a1, t], stack=(a,))
    b1 = g.op("b1", inputs=[a2], stack=(b,))
    g.output([b1])
    graph = g.graph()
    with pytest.raises(rewrite.GroupingError) as info:
        group_graph(rewrite.parse_rules("group path b\ngroup path a", "x.rules"), graph)
    error = info.value
    assert error.rule == "x.rules:2"
    assert set(error.nodes) == {"a1", "t", "a2"}
    assert str(error).startswith("x.rules:2: error: group a cannot be outlined: data leaves it")
    assert "nodes involved:" in str(error)
    # without a's group there is nothing to outline wrongly
    assert [g.id for g in group_graph(rewrite.parse_rules("group path b"), graph).groups()] == [
        "b"]


def test_a_mislabelled_export_is_reported(shared_program):
    gm = copy.deepcopy(shared_program.graph_module)
    fx = {n.name: n for n in gm.graph.nodes}
    # layers.0's linear labelled as layers.1's (a pass that moved metadata would do this):
    # layers.1 -> relu_2 (layers.0) -> layers.1 is a cycle
    fx["linear_2"].meta["nn_module_stack"] = dict(fx["linear_3"].meta["nn_module_stack"])
    graph = from_graph_module(gm)
    with pytest.raises(rewrite.GroupingError) as info:
        group_graph(rewrite.parse_rules("group path layers.*", "l.rules"), graph)
    assert info.value.rule == "l.rules:1"
    assert "group layers.1" in str(info.value)
    assert {"linear_2", "relu_2", "linear_3"} <= set(info.value.nodes)
    # layers.1.lin now holds both linears, with relu_2 in between: not outlinable either
    with pytest.raises(rewrite.GroupingError, match="group layers.1.lin cannot be outlined"):
        group_graph(rewrite.parse_rules("group class *Linear"), graph)
    tree = group_graph(rewrite.parse_rules("group path shared or path heads"), graph)
    assert [g.id for g in tree.groups()] == ["shared", "shared@1", "heads"]


# --- split ---------------------------------------------------------------------------------------


def test_split_by_annotated_stage(staged_program):
    graph = from_exported_program(staged_program)
    rules = rewrite.parse_rules("split by stage\ngroup path mid or path dec")
    tree = group_graph(rules, graph)
    assert [shape(g) for g in tree.root.children] == [
        ("encode", "encode", []), ("decode", "decode", [("decode/mid", "Sub", []),
                                                       ("decode/dec", "Sub", [])])]
    encode = tree.find("encode")
    assert (encode.kind, encode.tag_value, encode.domain) == ("component", "encode",
                                                              "pkg.rewrite")
    assert {graph.nodes[i].name for i in encode.all_nodes()} == {"linear", "relu", "add"}
    check_tree_invariants(tree)


def test_split_order_errors(staged_program):
    graph = from_exported_program(staged_program)
    with pytest.raises(rewrite.GroupingError, match="contradicts the data flow") as info:
        group_graph(rewrite.parse_rules('split by stage order "decode", "encode"', "s.rules"),
                    graph)
    assert info.value.rule == "s.rules:1"
    with pytest.raises(rewrite.GroupingError, match="'encode', which the split order does not"):
        group_graph(rewrite.parse_rules('split by stage order "decode"'), graph)
    with pytest.raises(rewrite.GroupingError, match="no node has the tag 'phase'"):
        group_graph(rewrite.parse_rules("split by phase"), graph)


def test_split_a_region_that_comes_back():
    g = GraphBuilder()
    x = g.input()
    for k, stage in enumerate("aaba"):
        x = g.op(f"n{k}", inputs=[x], tags={"stage": stage})
    g.output([x])
    graph = g.graph()
    tree = group_graph(rewrite.parse_rules("split by stage"), graph)
    assert [(c.id, c.tag_value, c.size) for c in tree.root.children] == [
        ("a", "a", 2), ("b", "b", 1), ("a_1", "a", 1)]
    with pytest.raises(rewrite.GroupingError, match="contradicts the data flow"):
        group_graph(rewrite.parse_rules('split by stage order "a", "b"'), graph)


# --- the engine against a plain reference implementation -------------------------------------


def reference(rules, graph, predicates=None):
    """Straightforward per-node, per-call grouping with ``predicates`` (one per rule, in
    file order: :data:`PREDICATES`, written by hand from docs/rules.md; default: the
    compiled ones); returns {group id: (function, domain, origin, direct nodes)}, owner,
    tags, warnings, or 'error'."""
    if predicates is None:
        predicates = [rule.predicate for rule in rules.rules]
    predicate = {id(rule): p for rule, p in zip(rules.rules, predicates, strict=True)}
    nodes = graph.nodes
    users = [[] for _ in nodes]
    for n in nodes:
        for i in n.inputs:
            users[i].append(n.index)
    stacks = [() if n.is_io else n.stack for n in nodes]
    for component in root_components(nodes, users):
        # top-level nodes between producers and users inside one call: no stack
        inside, boundary, ok = set(component), [], True
        for i in component:
            for p in nodes[i].inputs:
                if p not in inside and stacks[p]:
                    boundary.append((0, stacks[p]))
            for u in users[i]:
                if u not in inside:
                    ok = ok and not nodes[u].is_io
                    if stacks[u]:
                        boundary.append((1, stacks[u]))
        sides = {side for side, _ in boundary}
        if ok and sides == {0, 1}:
            common = boundary[0][1]
            for _, s in boundary[1:]:
                common = prefix(common, s)
            if common:
                for i in component:
                    stacks[i] = None
    above = {}  # per node without a stack: the stacks of its nearest producers with one
    for n in nodes:
        if stacks[n.index] is None:
            above[n.index] = set()
            for p in n.inputs:
                above[n.index] |= above[p] if p in above else {stacks[p]}
    for i in range(len(nodes) - 1, -1, -1):
        if stacks[i] is None:
            found = None
            for u in users[i]:
                if stacks[u] is None:
                    continue
                s = () if nodes[u].is_io else stacks[u]
                found = s if found is None else prefix(found, s)
            # between a producer and a user of a deeper call: inside the deepest such call
            for a in above[i]:
                for u in users[i]:
                    if stacks[u] is not None and not nodes[u].is_io:
                        shared = prefix(a, stacks[u])
                        if len(shared) > len(found):
                            found = shared
            stacks[i] = found
    for n in nodes:
        if stacks[n.index] is None:
            found = None
            for p in n.inputs:
                found = stacks[p] if found is None else prefix(found, stacks[p])
            stacks[n.index] = found or ()
    hits = {r.order: 0 for r in rules.rules}
    measures = {}  # per call: size, depth, repeats, call (as docs/rules.md defines them)
    for c in graph.calls:
        inside = [n for n in nodes if not n.is_io and c in stacks[n.index]]
        depth = next(s.index(c) + 1 for s in map(stacks.__getitem__, (n.index for n in inside)))
        measures[c] = {"size": len(inside), "depth": depth,
                       "repeats": sum(d.cls == c.cls for d in graph.calls), "call": c.index}
    tags = [dict(n.tags) for n in nodes]
    for rule in sorted(rules.tag_rules, key=lambda r: (r.priority, r.order)):
        for n in nodes:
            if n.is_io:
                continue
            s = stacks[n.index]
            facts = Facts(tuple(c.path for c in s), tuple(c.cls for c in s), (n.target,),
                          tags[n.index], tuple(f"{c.path}@{c.index}" for c in s),
                          tuple(measures[c] for c in s))
            if predicate[id(rule)](facts):
                hits[rule.order] += 1
                tags[n.index].update(rule.assignments)
    chosen = {}
    ranked = sorted(rules.group_rules, key=lambda r: (r.priority, r.order), reverse=True)
    for c in graph.calls:
        inside = [n.index for n in nodes if not n.is_io and c in stacks[n.index]]
        if not inside:
            continue
        common = dict(tags[inside[0]])
        for i in inside[1:]:
            common = {k: v for k, v in common.items() if tags[i].get(k) == v}
        facts = Facts((c.path,), (c.cls,), {nodes[i].target for i in inside}, common,
                      (f"{c.path}@{c.index}",), (measures[c],))
        matched = [r for r in ranked if predicate[id(r)](facts)]
        for r in matched:
            hits[r.order] += 1
        if matched and matched[0].kind == "group":
            chosen[c] = matched[0]
    paths = [tuple(c for c in stacks[i] if c in chosen) for i in range(len(nodes))]
    if has_cycle(graph, paths):
        return "error"
    groups = {}
    for i, p in enumerate(paths):
        for d in range(1, len(p) + 1):
            groups.setdefault(p[:d], [])
        if p:
            groups[p].append(i)
    out = {}
    for p, direct in groups.items():
        c, rule = p[-1], chosen[p[-1]]
        fields = rewrite.compile.templates.call_fields(c)
        out["/".join(x.key for x in p)] = (
            rule.name_template.format_map(fields), rule.domain_template.format_map(fields),
            rule.origin, tuple(direct))
    owner = tuple("/".join(x.key for x in p) for p in paths)
    warnings = [r.origin for r in rules.rules if hits[r.order] == 0]
    return out, owner, [tags[i] for i in range(len(nodes))], warnings


def root_components(nodes, users):
    """Connected sets of nodes recorded at the top level (stack ``()``, not graph io)."""
    root = {n.index for n in nodes if not n.is_io and n.stack == ()}
    seen, out = set(), []
    for start in sorted(root):
        if start in seen:
            continue
        seen.add(start)
        component, todo = [], [start]
        while todo:
            i = todo.pop()
            component.append(i)
            for j in (*nodes[i].inputs, *users[i]):
                if j in root and j not in seen:
                    seen.add(j)
                    todo.append(j)
        out.append(component)
    return out


def prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def has_cycle(graph, paths):
    """Is some level's graph of members (child groups and loose nodes) cyclic?"""
    levels = {}
    for n in graph.nodes:
        for u in n.inputs:
            pu, pv = paths[u], paths[n.index]
            d = len(prefix(pu, pv))
            if d == len(pu) == len(pv):
                continue
            a = pu[d] if len(pu) > d else ("node", u)
            b = pv[d] if len(pv) > d else ("node", n.index)
            levels.setdefault(pv[:d], set()).add((a, b))
            # loose nodes of one level link members too
    for p in set(paths):
        for d in range(len(p) + 1):
            levels.setdefault(p[:d], set())
    for n in graph.nodes:
        for u in n.inputs:
            if paths[u] == paths[n.index]:
                levels.setdefault(paths[u], set()).add((("node", u), ("node", n.index)))
    for edges in levels.values():
        adjacency = {}
        for a, b in edges:
            adjacency.setdefault(a, set()).add(b)
        state = {}

        def visit(v):
            state[v] = 1
            for w in adjacency.get(v, ()):
                if state.get(w) == 1 or (w not in state and visit(w)):
                    return True
            state[v] = 2
            return False

        if any(v not in state and visit(v) for v in list(adjacency)):
            return True
    return False


BLOCKS = [call(f"b.{i}", "m.Block") for i in range(3)]
INNER = [call(f"b.{i}.{x}", f"m.{x.upper()}") for i in range(3) for x in "xy"]
SHARED = [call("s", "m.Shared", k) for k in range(2)]
RULES = ["group any", "group class *Block", "group path b.*.x or path s@1",
         'group stage == "a"', "flat path b.1\ngroup any", 'tag op aten.mm with k = "v"\n'
         'group has k', "group op aten.mm", "group not class *X priority 1\nflat any",
         'tag path b.0 with stage = "b"\ngroup stage != "b"', "group size >= 3",
         "group depth == 2 or repeats >= 3", "group call >= 1 or size < 2 and depth == 1",
         'tag call 1 or depth >= 2 with k = "v"\ngroup has k', "group not repeats != 2"]


def _some(values, test) -> bool:
    """A selector on a node holds when some call around it matches (on a call: the call)."""
    return any(test(v) for v in values)


def _path(glob_regex: str):
    return lambda f: _some(f.paths, lambda p: re.fullmatch(glob_regex, p) is not None)


def _class_ends(suffix: str):  # a class glob without a dot matches the class name alone
    return lambda f: _some(f.classes, lambda c: c.rsplit(".", 1)[-1].endswith(suffix))


def _measure(name: str, test):
    return lambda f: _some(f.measures, lambda m: test(m[name]))


def _op_mm(f) -> bool:  # "aten.mm": any overload of the op
    return any(t == "aten.mm" or t.startswith("aten.mm.") for t in f.ops)


ANY = lambda f: True  # noqa: E731
HAS_K = lambda f: "k" in f.tags  # noqa: E731
PREDICATES = {  # RULES text -> one predicate per rule, by hand from docs/rules.md
    "group any": [ANY],
    "group class *Block": [_class_ends("Block")],
    "group path b.*.x or path s@1": [
        lambda f: _path(r"b\.[^.]*\.x")(f) or _some(f.keys, lambda k: k == "s@1")],
    'group stage == "a"': [lambda f: f.tags.get("stage") == "a"],
    "flat path b.1\ngroup any": [_path(r"b\.1"), ANY],
    'tag op aten.mm with k = "v"\ngroup has k': [_op_mm, HAS_K],
    "group op aten.mm": [_op_mm],
    "group not class *X priority 1\nflat any": [lambda f: not _class_ends("X")(f), ANY],
    'tag path b.0 with stage = "b"\ngroup stage != "b"': [
        _path(r"b\.0"), lambda f: f.tags.get("stage") != "b"],
    "group size >= 3": [_measure("size", lambda v: v >= 3)],
    "group depth == 2 or repeats >= 3": [
        lambda f: _measure("depth", lambda v: v == 2)(f) or (
            _measure("repeats", lambda v: v >= 3)(f))],
    "group call >= 1 or size < 2 and depth == 1": [
        lambda f: _measure("call", lambda v: v >= 1)(f) or (
            _measure("size", lambda v: v < 2)(f) and _measure("depth", lambda v: v == 1)(f))],
    'tag call 1 or depth >= 2 with k = "v"\ngroup has k': [
        lambda f: _measure("call", lambda v: v == 1)(f) or _measure("depth", lambda v: v >= 2)(f),
        HAS_K],
    "group not repeats != 2": [lambda f: not _measure("repeats", lambda v: v != 2)(f)],
}


def test_every_rules_text_has_hand_written_predicates():
    assert set(PREDICATES) == set(RULES)
    for text, predicates in PREDICATES.items():
        assert len(predicates) == len(rewrite.parse_rules(text).rules), text


@st.composite
def graphs(draw):
    """Small graphs: a run of blocks with inner calls, shared calls, stackless nodes, tags,
    and sometimes a node whose stack is wrong (which may make a group non-convex)."""
    g = GraphBuilder()
    made = [g.input()]
    for k in range(draw(st.integers(1, 14))):
        b = min(k // 4, 2)
        options = [(BLOCKS[b],), (BLOCKS[b], INNER[2 * b]), (BLOCKS[b], INNER[2 * b + 1]),
                   (SHARED[min(k // 7, 1)],), (), None]
        stack = draw(st.sampled_from(options))
        inputs = draw(st.lists(st.sampled_from(made), min_size=1, max_size=2))
        tags = draw(st.sampled_from([None, {"stage": "a"}, {"stage": "b"}]))
        target = draw(st.sampled_from(["aten.mm.default", "aten.add.Tensor"]))
        made.append(g.op(f"n{k}", target, inputs, stack, tags))
    g.output([made[-1]])
    return g.graph()


@settings(max_examples=120, deadline=None, derandomize=True,  # the same examples every run:
          suppress_health_check=[HealthCheck.too_slow])  # a skipped cycle check among them
@given(graphs(), st.sampled_from(RULES))
def test_engine_matches_the_reference(graph, text):
    rules = rewrite.parse_rules(text, "r.rules")
    expected = reference(rules, graph, PREDICATES[text])
    if expected == "error":
        with pytest.raises(rewrite.GroupingError):
            group_graph(rules, graph)
        return
    tree = group_graph(rules, graph)
    groups = {g.id: (g.function_name, g.domain, g.origin, g.nodes) for g in tree.groups()}
    out, owner, tags, warnings = expected
    assert groups == out
    assert tree.owner == owner
    assert [dict(t) for t in tree.tags] == tags
    located = [w for w in tree.warnings if w.span is not None]
    assert [f"{w.span.source.name}:{w.span.line}" for w in located] == warnings
    unstructured = [w for w in tree.warnings if w.span is None]
    assert [w.message.split(":")[0] for w in unstructured] == (
        [] if graph.calls else ["no module structure"])
    check_tree_invariants(tree)


def reference_components(graph):
    """Per node, the name of its split component ('' for the top level), by the documented
    policy (split.py), one node at a time."""
    nodes = graph.nodes
    users = [[] for _ in nodes]
    for n in nodes:
        for i in n.inputs:
            users[i].append(n.index)
    value = [None if n.is_io else n.tags.get("stage") for n in nodes]

    def place(comp):
        for i in range(len(nodes) - 1, -1, -1):
            if comp[i] < 0 and not nodes[i].is_io:
                found = [comp[u] for u in users[i] if comp[u] >= 0 and not nodes[u].is_io]
                comp[i] = min(found, default=-1)
        for n in nodes:
            if comp[n.index] < 0 and not n.is_io:
                comp[n.index] = max((comp[p] for p in n.inputs), default=-1)
        return comp

    order = list(dict.fromkeys(v for v in value if v is not None))
    names = order
    comp = place([order.index(v) if v is not None else -1 for v in value])
    if any(comp[p] > comp[n.index] >= 0 for n in nodes for p in n.inputs if comp[p] >= 0):
        names, comp, seen, current = [], [-1] * len(nodes), {}, None
        for i, v in enumerate(value):
            if v is None:
                continue
            if v != current:
                k = seen.get(v, 0)
                seen[v] = k + 1
                names.append(v if k == 0 else f"{v}_{k}")
                current = v
            comp[i] = len(names) - 1
        comp = place(comp)
    return ["" if c < 0 else names[c] for c in comp]


@st.composite
def staged_graphs(draw):
    """Graphs whose stages mostly run a, b, c in order, with untagged nodes feeding several
    stages and sometimes a stage that comes back (runs)."""
    g = GraphBuilder()
    made = [g.input()]
    size = draw(st.integers(2, 16))
    for k in range(size):
        stage = "abc"[3 * k // size]
        tags = draw(st.sampled_from([None, None, {"stage": stage}, {"stage": "a"}]))
        stack = draw(st.sampled_from([(BLOCKS[0],), (BLOCKS[1],), ()]))
        inputs = draw(st.lists(st.sampled_from(made), min_size=1, max_size=3))
        made.append(g.op(f"n{k}", "aten.add.Tensor", inputs, stack, tags))
    g.output(draw(st.lists(st.sampled_from(made[1:]), min_size=1, max_size=2)))
    return g.graph()


SPLIT_SEEN: Counter = Counter()


def test_split_components_match_the_reference():
    """Examples the engine refuses (a module group cut into a cycle) are not compared: at
    most a few percent of them."""
    SPLIT_SEEN.clear()
    split_components_match_the_reference()
    print(f"{SPLIT_SEEN['refused']} of {SPLIT_SEEN['tried']} split examples refused")
    assert SPLIT_SEEN["tried"] >= 200
    assert SPLIT_SEEN["refused"] <= 0.05 * SPLIT_SEEN["tried"], SPLIT_SEEN


def _staged(graph) -> bool:
    return any(n.tags.get("stage") for n in graph.nodes)


@settings(max_examples=200, deadline=None, derandomize=True,  # the refused share is stable
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(graphs(), staged_graphs()).filter(_staged),
       st.sampled_from(["split by stage", "split by stage\ngroup class *Block"]))
def split_components_match_the_reference(graph, text):
    SPLIT_SEEN["tried"] += 1
    try:
        tree = group_graph(rewrite.parse_rules(text, "r.rules"), graph)
    except rewrite.GroupingError as e:
        assert "cannot be outlined" in str(e)  # a module group cut into a cycle
        SPLIT_SEEN["refused"] += 1
        return
    top = [owner.split("/", 1)[0] for owner in tree.owner]
    expected = reference_components(graph)
    assert [t if t in {g.key for g in tree.root.children if g.kind == "component"} else ""
            for t in top] == expected
