"""The one stack-tree builder (rewrite.ir.stacks) and the grouping view of its tree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rewrite.frontends.fx.graph import from_exported_program, from_graph_module
from rewrite.grouping.stacks import StackTable
from rewrite.ir.stacks import columns_of
from rewrite.ir.stacks import EMPTY, UNKNOWN, StackTreeBuilder
from tools import models
from tests.ir_builder import GraphBuilder, call, call_columns_of
from tests.test_frontend_fx import legacy

A, B, C = call("a"), call("a.b"), call("a.b.c")
D = call("d", "pkg.mod.Other")


def check_tree(columns, calls) -> None:
    """Fixed ids, a complete tree, and each stack's tuple as the tree spells it."""
    parent, last, depth = columns.stack_parent, columns.stack_last, columns.stack_depth
    assert columns.stacks[EMPTY] == () and depth[EMPTY] == 0
    assert columns.stacks[UNKNOWN] is None and depth[UNKNOWN] == -1
    assert parent[EMPTY] == parent[UNKNOWN] == last[EMPTY] == last[UNKNOWN] == -1
    known = np.flatnonzero(depth > 0)
    assert (parent[known] >= 0).all() and (depth[parent[known]] == depth[known] - 1).all()
    for k in known.tolist():
        assert columns.stacks[k] == columns.stacks[parent[k]] + (calls[last[k]],)
        assert columns.stack_calls[k] == columns.stack_calls[parent[k]] + (last[k],)
    distinct = [columns.stack_calls[k] for k in range(len(parent))]
    assert len(set(distinct)) == len(distinct)
    expected = call_columns_of(calls)
    got = columns.call_columns
    assert got.paths == expected.paths and got.classes == expected.classes
    for name in ("class_id", "index", "path_id"):
        assert getattr(got, name).tolist() == getattr(expected, name).tolist()
    assert dict(got.distinct_paths) == dict(expected.distinct_paths)


def test_builder_adds_parents_first_and_fixes_empty_and_unknown():
    tree = StackTreeBuilder()
    assert tree.ids([None, (A, B, C), (), (A, B, C), (D,)]) == [UNKNOWN, 4, EMPTY, 4, 5]
    assert tree.calls == [A, B, C, D]
    assert tree.parent == [-1, -1, EMPTY, 2, 3, EMPTY]
    assert tree.depth == [0, -1, 1, 2, 3, 1]
    assert tree.stacks[3] == (A, B) and tree.stack_calls[4] == (0, 1, 2)


def test_a_call_under_two_parents_is_two_stacks_and_found_again():
    tree = StackTreeBuilder()
    a, b = tree.call("a", "m.A"), tree.call("b", "m.B")
    under_a = tree.child(tree.child(EMPTY, a), b)
    top_b = tree.child(UNKNOWN, b)  # the unknown stack's children are the empty one's
    assert under_a != top_b and tree.parent[top_b] == EMPTY
    assert tree.child(EMPTY, b) == top_b and tree.child(tree.child(EMPTY, a), b) == under_a
    assert tree.call("a", "m.A") == a and len(tree) == 5


def test_columns_of_keeps_the_graph_call_ids_and_completes_the_tree():
    b = GraphBuilder()
    x = b.input()
    n = b.op("n0", inputs=[x], stack=(A, B, C))  # (A,) and (A, B) hold no node
    m = b.op("n1", inputs=[n], stack=None)
    b.output([b.op("n2", inputs=[m], stack=(D,))])
    graph = b.graph()
    check_tree(graph.columns, graph.calls)
    with pytest.raises(ValueError, match="do not list"):
        columns_of(graph.nodes, graph.calls[:2])


@pytest.mark.parametrize("make", [
    lambda: from_exported_program(models.export(models.shared_and_list())),
    lambda: from_graph_module(torch.fx.symbolic_trace(models.SharedApart())),
    lambda: from_graph_module(legacy(torch.fx.symbolic_trace(models.SharedApart()))),
    lambda: from_graph_module(models.export(models.shared_and_list()).module(),
                              split_calls=True),
])
def test_every_fx_path_builds_a_complete_tree(make):
    graph = make()
    check_tree(graph.columns, graph.calls)


def test_common_prefix_walks_the_tree():
    b = GraphBuilder()
    for k, stack in enumerate([(A, B, C), (A, D), (D,), (A,)]):
        b.op(f"n{k}", stack=stack)
    graph = b.graph()
    columns = graph.columns
    table = StackTable(columns, graph.calls)
    abc, ad, d, a = columns.stack_id.tolist()
    assert table.common_prefix(abc, ad) == a
    assert table.common_prefix(abc, d) == EMPTY
    assert table.common_prefix(a, abc) == a and table.common_prefix(d, d) == d
