"""The group tree as plain data, for ``explain --json`` and for tools.

Per group: its call (path, class, index), rule, function, node counts and ``measures``, the
values ``size``, ``depth``, ``repeats`` and ``call`` selectors compare (None for split
components).
"""

from __future__ import annotations

from rewrite.grouping import Group, GroupTree


def group_to_dict(group: Group, tree: GroupTree) -> dict:
    call = group.call
    measures = tree.measures(group)
    return {
        "id": group.id,
        "kind": group.kind,
        "path": call.path if call else None,
        "class": call.cls if call else None,
        "call_index": call.index if call else None,
        "tag_value": group.tag_value,
        "rule": group.origin,
        "function": group.function_name,
        "domain": group.domain,
        "nodes": group.size,
        "own_nodes": len(group.nodes),
        "measures": measures.as_dict() if measures is not None else None,
        "children": [group_to_dict(c, tree) for c in group.children],
    }


def tree_to_dict(tree: GroupTree) -> dict:
    graph = tree.graph
    return {
        "graph": {"kind": graph.kind, "root_class": graph.root_class, "nodes": len(graph.nodes),
                  "module_calls": len(graph.calls),
                  # ONNX: where the calls came from (``metadata``, ``node names``)
                  **({"structure": graph.structure} if graph.structure else {})},
        "groups": [group_to_dict(c, tree) for c in tree.root.children],
        "top_level_nodes": len(tree.root.nodes),
        "flattened": [
            {"id": f.id, "path": f.call.path, "class": f.call.cls, "call_index": f.call.index,
             "rule": f.origin, "into": f.into, "reason": f.reason, "nodes": list(f.nodes)}
            for f in tree.flattened
        ],
        "warnings": [
            {"location": w.span.location if w.span else None, "message": w.message}
            for w in tree.warnings
        ],
    }
