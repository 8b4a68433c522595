"""The ``.pt2`` path: group torch.onnx's model with the same rules as the FX program.

Each ONNX node names the FX node it came from (last item of ``pkg.torch.onnx.name_scopes``)
in the *decomposed* program the exporter translated. That node's ``nn_module_stack`` gives
exact module calls, ``@N`` included, and its tags; its ``from_node`` provenance leads back to
the node of the program the user grouped, whose op target ``op`` rules saw. Grouping this IR
with the same :class:`RuleSet` gives the same groups (ids, function names) as the FX tree,
except groups the optimizer folded away entirely, which are reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from rewrite.backends.onnx.lowering._provenance import nearest, node_facts
from rewrite.compile import RuleSet
from rewrite.errors import Diagnostic
from rewrite.frontends.fx.graph import from_exported_program
from rewrite.frontends.onnx.graph import (
    Expansion,
    NodeFacts,
    Resolver,
    from_onnx_model,
    read_scopes,
)
from rewrite.grouping import GroupTree, group_graph
from rewrite.ir import Graph

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch


def fx_resolver(decomposed: Graph, original: Graph) -> Resolver:
    """Facts of ONNX nodes from the FX nodes they were translated from."""
    by_name = {node.name: node for node in decomposed.nodes}
    target_of = {node.name: node.target for node in original.nodes}
    names = {name: name for name in target_of}

    def resolve(onnx_node: "ir.Node") -> NodeFacts:
        scopes = read_scopes(onnx_node)
        fx = by_name.get(scopes[0][-1]) if scopes is not None else None
        if fx is None or fx.is_io:
            return node_facts(None, onnx_node)
        name = nearest(fx.source, names)
        return node_facts(fx, onnx_node, target_of[name] if name is not None else fx.target)

    return resolve


def regroup(rules: RuleSet, tree: GroupTree, model: "ir.Model",
            decomposed: "torch.export.ExportedProgram") -> tuple[GroupTree, list[Diagnostic]]:
    """Group the ONNX ``model`` like ``tree``; warnings for groups that differ."""
    resolver = fx_resolver(from_exported_program(decomposed), tree.graph)
    return regroup_with(rules, tree, model, resolver)


def regroup_with(rules: RuleSet, tree: GroupTree, model: "ir.Model", resolver: Resolver,
                 stand_ins: Mapping["ir.Node", Expansion] | None = None,
                 ) -> tuple[GroupTree, list[Diagnostic]]:
    """:func:`regroup` with the facts of each ONNX node from ``resolver`` (nodes standing for
    several read as their ``stand_ins``)."""
    graph = from_onnx_model(model, resolve=resolver, root_class=tree.graph.root_class,
                            stand_ins=stand_ins)
    onnx_tree = group_graph(rules, graph)
    return onnx_tree, compare_trees(tree, onnx_tree)


def compare_trees(fx_tree: GroupTree, onnx_tree: GroupTree) -> list[Diagnostic]:
    """Warnings for groups of ``fx_tree`` missing from ``onnx_tree`` and vice versa."""
    fx_groups = {g.id: g for g in fx_tree.groups()}
    onnx_groups = {g.id: g for g in onnx_tree.groups()}
    warnings = []
    gone = [g for gid, g in fx_groups.items() if gid not in onnx_groups]
    if gone:
        shown = ", ".join(f"{g.id} ({g.function_name})" for g in gone[:6])
        more = f", ... ({len(gone)} in all)" if len(gone) > 6 else ""
        warnings.append(Diagnostic(
            "warning",
            f"{len(gone)} group(s) have no ONNX nodes, so no function: torch.onnx's optimizer "
            f"removed or folded all their nodes (identities such as Dropout in eval, "
            f"computations on constants): {shown}{more}",
        ))
    for gid, group in onnx_groups.items():
        known = fx_groups.get(gid)
        if known is None or known.function_name != group.function_name:
            warnings.append(Diagnostic(
                "warning",
                f"group {gid} ({group.function_name}, {group.origin}) differs from the group "
                "tree of the FX program (decomposition changed what the rules matched)",
            ))
    return warnings
