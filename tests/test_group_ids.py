"""Group ids: integer ids in the tree's table for code, one unambiguous display id per group."""

from __future__ import annotations

import rewrite
from rewrite.grouping import group_graph
from tests.ir_builder import GraphBuilder, call


def _split_graph():
    """Component ``enc`` holds call ``x``; component ``enc/x`` holds call ``a``."""
    g = GraphBuilder()
    x = g.input()
    x = g.op("n0", inputs=[x], stack=(call("x"),), tags={"stage": "enc"})
    x = g.op("n1", inputs=[x], stack=(call("a"),), tags={"stage": "enc/x"})
    g.output([x])
    return g.graph()


def test_a_tag_value_with_a_slash_makes_no_ambiguous_id():
    tree = group_graph(rewrite.parse_rules("split by stage\ngroup path x or path a"),
                       _split_graph())
    ids = [g.id for g in tree.groups()]
    assert ids == ["enc", "enc/x", "enc\\/x", "enc\\/x/a"]
    assert [g.key for g in tree.groups()] == ["enc", "x", "enc/x", "a"]
    assert tree.find("enc\\/x").tag_value == "enc/x"
    assert tree.owner[1:3] == ("enc/x", "enc\\/x/a")


def test_records_are_indexed_by_table_id():
    tree = group_graph(rewrite.parse_rules("split by stage\ngroup path x or path a"),
                       _split_graph())
    table = tree.table
    for group in tree.root.walk():
        assert tree.records[group.index] is group
        assert tree.ids[group.index] == group.id
        for child in group.children:
            assert table.parent[child.index] == group.index
    assert [tree.records[k].id for k in tree.group_of.tolist()[1:3]] == ["enc/x", "enc\\/x/a"]
