"""Each ONNX node lands in the function of its module call: an independent per-node reference.

For the GPT-2 and Llama test models, both lowerings: which function should hold each node is
computed here from the module path and class torch.onnx recorded on it
(``pkg.torch.onnx.name_scopes`` / ``class_hierarchy``) and the rules file's groups, written
out by hand below, without rewrite's grouping or membership code. A node belongs to the
deepest grouped module call around it (none: the main graph); every node of a function's
body must belong to one and the same call, of the function's class, nested in its caller's
call. A node moved into its caller, into a sibling or to the top level fails here whatever
the numbers do. Nodes without that metadata (constants the optimizer made) are skipped.
"""

from __future__ import annotations

import ast
from typing import Callable

import onnx_ir as ir
import pytest

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from tests.onnx_fixtures import GPT2_RULES, LLAMA_RULES

Grouped = Callable[[str, str], bool]
"""Whether the module call at this path, of this class, is a group under the rules."""

GROUPED: dict[str, tuple] = {  # the rule files' groups, by hand
    "gpt2": (GPT2_RULES, lambda path, cls: cls.endswith(
        (".GPT2Block", ".GPT2Attention", ".GPT2MLP")) or path in ("wte", "wpe", "ln_f")),
    "llama": (LLAMA_RULES, lambda path, cls: cls.endswith(
        (".LlamaDecoderLayer", ".LlamaAttention", ".LlamaMLP", ".LlamaRMSNorm",
         ".LlamaRotaryEmbedding")) or path.split(".")[-1] == "embed_tokens"),
}


def _scopes(node: ir.Node) -> list[tuple[str, str]] | None:
    """The module calls around ``node`` as torch.onnx recorded them: (path, class), outer
    first (without the last item, the FX node and its target); None without metadata."""
    paths = node.metadata_props.get("pkg.torch.onnx.name_scopes")
    classes = node.metadata_props.get("pkg.torch.onnx.class_hierarchy")
    if paths is None or classes is None:
        return None
    return list(zip(ast.literal_eval(paths)[:-1], ast.literal_eval(classes)[:-1]))


def _call_scopes(node: ir.Node) -> list[tuple[str, str]]:
    """The module calls a call node stands for, from its ``namespace`` (``root: Class/h.0:
    GPT2Block/h.0.attn: GPT2Attention``), outer first, itself last."""
    return [tuple(part.split(": ", 1)) for part in node.metadata_props["namespace"].split("/")]


def _owner(scopes: list[tuple[str, str]], grouped: Grouped) -> tuple[str, str] | None:
    """The deepest grouped call among ``scopes`` (None: the top level)."""
    found = None
    for path, cls in scopes[1:]:  # the first is the root module
        if grouped(path, cls):
            found = (path, cls)
    return found


def _check(graph, owner: tuple[str, str] | None, model: ir.Model, grouped: Grouped,
           seen: dict) -> int:
    """Check the nodes of ``graph`` (the body of ``owner``'s call, or the main graph);
    recurse into the functions it calls; returns how many nodes were checked."""
    checked = 0
    for node in graph:
        fid = (node.domain, node.op_type, node.overload)
        if fid in model.functions:
            calls = _call_scopes(node)
            assert grouped(*calls[-1]), (node.name, calls)
            assert _owner(calls[:-1], grouped) == owner, (node.name, calls, owner)
            body = model.functions[fid]
            if fid not in seen:
                seen[fid] = _body_owner(body, grouped)
                checked += _check(body, seen[fid], model, grouped, seen)
            assert seen[fid][1] == calls[-1][1], (fid, seen[fid], calls[-1])
            continue
        scopes = _scopes(node)
        if scopes is None:
            continue
        assert _owner(scopes, grouped) == owner, (node.name, node.op_type, scopes, owner)
        checked += 1
    return checked


def _body_owner(body: ir.Function, grouped: Grouped) -> tuple[str, str]:
    """The call a function's body was made from: its nodes' own, by their metadata."""
    for node in body:
        scopes = _scopes(node)
        if scopes is not None:
            found = _owner(scopes, grouped)
            assert found is not None, (body.name, node.name, scopes)
            return found
    calls = [_call_scopes(n) for n in body if n.domain.startswith("pkg.")]
    assert calls, body.name
    found = _owner(calls[0][:-1], grouped)
    assert found is not None, (body.name, calls[0])
    return found


@pytest.mark.parametrize("lowering", ["per-body", "flat"])
@pytest.mark.parametrize("name", sorted(GROUPED))
def test_each_node_is_in_the_function_of_its_module_call(name, lowering, request):
    rules, grouped = GROUPED[name]
    program = request.getfixturevalue(f"{name}_program")
    model = lower(rewrite.apply(rules, program), OnnxOptions(lowering=lowering)).model
    seen: dict = {}
    checked = _check(model.graph, None, model, grouped, seen)
    assert len(seen) == len(model.functions)  # every function reached from the main graph
    total = sum(1 for _ in model.graph) + sum(1 for f in model.functions.values() for _ in f)
    assert checked > total // 2, (checked, total)
