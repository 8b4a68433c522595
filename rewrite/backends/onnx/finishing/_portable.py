"""Source paths of the nodes' stack traces (``pkg.torch.onnx.stack_trace``) written relative
to the import root they lie under (``transformers/models/llama/modeling_llama.py``, not the
virtual environment's absolute path), so that a model exported from the same code is the
same file wherever that code is installed or checked out."""

from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator

import onnx_ir as ir

from rewrite._shared.onnx_ir_nodes import model_nodes

STACK_TRACE = "pkg.torch.onnx.stack_trace"


def import_roots(paths: Iterable[str] | None = None) -> tuple[str, ...]:
    """The folders of ``paths`` (default ``sys.path``; ``''`` is the working folder), each
    ending in a separator, longest first: a file is made relative to the deepest root
    holding it (site-packages inside a checkout)."""
    roots = {os.path.join(os.path.abspath(p or os.curdir), "")
             for p in (sys.path if paths is None else paths)}
    return tuple(sorted((r for r in roots if os.path.isdir(r)), key=len, reverse=True))


def portable(trace: str, roots: tuple[str, ...]) -> str:
    """``trace`` with each ``File "ROOT..."`` written ``File "..."`` (the deepest root)."""
    for root in roots:  # longest first: a deeper root's files are gone before a shallower's
        trace = trace.replace(f'File "{root}', 'File "')
    return trace


def stack_traces(model: ir.Model) -> Iterator[tuple[ir.Node, str]]:
    """Each node of ``model`` (main graph, subgraphs and functions) with a stack trace, and
    the trace. One that is not UTF-8 text (onnx_ir reads it as bytes) is left out: writing
    the output says what is wrong with it."""
    for node in model_nodes(model):
        trace = node.metadata_props.get(STACK_TRACE)
        if isinstance(trace, str):
            yield node, trace


def make_portable(model: ir.Model, roots: tuple[str, ...] | None = None) -> bool:
    """Every node's stack trace in ``model`` (:func:`stack_traces`) made portable; whether
    one changed."""
    roots = import_roots() if roots is None else roots
    changed = False
    seen: dict[str, str] = {}
    for node, trace in stack_traces(model):
        if trace not in seen:
            seen[trace] = portable(trace, roots)
        if seen[trace] != trace:
            node.metadata_props[STACK_TRACE] = seen[trace]
            changed = True
    return changed
