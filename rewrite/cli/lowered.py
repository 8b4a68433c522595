"""What the ONNX lowering made, as plain data (``explain --onnx --json``, ``explain --html``).

* ``functions``: per function its domain, name, call sites, runs per model run, nodes, the
  attributes it declares (scalars lifted by merging) with the value each call passes, and the
  functions it calls and is called by;
* ``totals``: ONNX nodes if every call were inlined ("flat") against the nodes in function
  bodies and in the main graph; per class (group identity: domain and base name) the
  distinct bodies it was lowered to;
* ``variants``: per class with more than one function, each function beside the first and the
  first difference that kept it apart (``backends/onnx/distinct.py``), with its reason line.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from rewrite.backends.onnx.distinct import Side, Variant
from rewrite.backends.onnx.summary import call_sites, label, summarize, top_calls

if TYPE_CHECKING:
    from rewrite.backends.onnx import Lowering


def lowering_to_dict(lowering: "Lowering") -> dict:
    """The three parts above, JSON-ready."""
    model = lowering.model
    summaries = summarize(model)
    sites = call_sites(model)
    top = top_calls(model)
    records = lowering.tree.records
    classes: dict[tuple[str, str], dict] = {}
    for k, fid in lowering.outlined.by_group.items():
        group = records[k]
        if fid is None or group is None:
            continue
        entry = classes.setdefault((group.domain, group.function_name), {
            "domain": group.domain, "name": group.function_name, "classes": [],
            "functions": [], "calls": 0})
        cls = group.call.class_name if group.call is not None else group.kind
        if cls not in entry["classes"]:
            entry["classes"].append(cls)
        if label(fid) not in entry["functions"]:
            entry["functions"].append(label(fid))
        entry["calls"] += 1
    callers: dict[str, list[str]] = defaultdict(list)
    for fid, summary in summaries.items():
        for callee in summary.calls:
            callers[label(callee)].append(summary.label)
    functions = []
    for fid, summary in summaries.items():
        functions.append({
            "function": summary.label, "domain": fid[0], "name": fid[1], "overload": fid[2],
            "calls": len(sites[fid]), "runs": summary.instances, "nodes": summary.nodes,
            "attributes": [
                {"name": name, "values": [
                    {"call": site.node, "caller": label(site.caller) if site.caller else None,
                     "value": _plain(site.attributes.get(name))} for site in sites[fid]]}
                for name in summary.attributes],
            "callees": [{"function": label(c), "calls": n} for c, n in summary.calls.items()],
            "callers": callers.get(summary.label, []), "main_graph_calls": top.get(fid, 0),
        })
    inside = sum(s.nodes for s in summaries.values())
    flat = len(model.graph) - sum(top.values()) + sum(
        (s.nodes - sum(s.calls.values())) * s.instances for s in summaries.values())
    return {
        "functions": functions,
        "totals": {"flat_nodes": flat, "function_nodes": inside,
                   "main_graph_nodes": len(model.graph), "functions": len(summaries),
                   "call_sites": sum(len(v) for v in sites.values()),
                   "classes": list(classes.values())},
        "variants": [_variant(v) for v in lowering.outlined.variants],
    }


def _variant(variant: Variant) -> dict:
    diff = variant.difference
    return {"class": f"{variant.identity[0]}::{variant.identity[1]}",
            "function": label(variant.function), "first": label(variant.first),
            "kind": diff.kind, "about": diff.about(), "what": diff.what,
            "first_side": _side(diff.first), "other_side": _side(diff.other),
            "reason": variant.reason()}


def _side(side: Side) -> dict:
    return {"node": side.node, "value": side.value,
            "function": label(side.function) if side.function else None}


def _plain(value: Any) -> Any:
    """A JSON-ready form of an attribute value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return repr(value)


__all__ = ["lowering_to_dict"]
