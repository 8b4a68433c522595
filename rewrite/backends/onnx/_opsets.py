"""Opset imports for functions and the model: every domain used gets one; the IR version
that lets functions carry their values' types."""

from __future__ import annotations

from typing import Iterable, Mapping

import onnx_ir as ir

from rewrite._shared.onnx_ir_nodes import inner_nodes

FUNCTION_DOMAIN_VERSION = 1
FUNCTION_VALUE_INFO_IR = 10
"""The first IR version whose functions hold ``value_info``."""


def used_domains(nodes: Iterable[ir.Node]) -> set[str]:
    """Domains of ``nodes`` and of the nodes in their subgraphs."""
    found: set[str] = set()
    for node in nodes:
        found.add(node.domain)
        if node.attributes:
            found.update(inner.domain for inner in inner_nodes(node))
    return found


def fix_opsets(model: ir.Model, functions: Iterable[ir.Function],
               known: Mapping[str, int] | None = None) -> None:
    """Give each new function the imports its body needs and the model every domain used.

    A domain the model does not import gets its version in ``known`` (the export's imports,
    before an optimizer dropped those the main graph no longer uses), or 1. Domains are added
    in sorted order, so the output does not depend on set iteration order
    (``PYTHONHASHSEED``)."""
    model_opsets = model.opset_imports
    for domain in sorted(used_domains(model.graph) | {
            d for f in model.functions.values() for d in used_domains(f)}):
        if known and domain in known:
            model_opsets.setdefault(domain, known[domain])
    function_domains = {f.domain for f in model.functions.values()}
    for domain in sorted(function_domains):
        model_opsets.setdefault(domain, FUNCTION_DOMAIN_VERSION)
    for domain in sorted(used_domains(model.graph)):
        model_opsets.setdefault(domain, FUNCTION_DOMAIN_VERSION)
    for function in functions:
        for domain in sorted(used_domains(function)):
            version = model_opsets.get(domain)
            if version is None:
                version = FUNCTION_DOMAIN_VERSION
                model_opsets[domain] = version
            function.opset_imports.setdefault(domain, version)
    if functions and model.ir_version < FUNCTION_VALUE_INFO_IR:
        # the types of values made by ops onnx has no schema for (onnxruntime's, in files of
        # the TorchScript exporter or onnxruntime's optimizer, IR 8) are known only from
        # value_info: before IR 10 a function cannot hold it, and its body fails the checker
        model.ir_version = FUNCTION_VALUE_INFO_IR
