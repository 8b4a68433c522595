"""Metadata for the nodes the backend creates (submodule calls and their ``getitem``\\ s).

A call node belongs to the caller, so its ``nn_module_stack`` is the member nodes' stack cut
just before the called module's entry, and its ``stack_trace`` keeps the frames up to the
caller's line (``hidden_states = block(...)``). ``val`` is the output's value, a tuple for
several outputs. A split component is called from the root: root stack, first frame.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Iterable

import torch

from rewrite.grouping import Group
from rewrite.ir import ModuleCall

_FRAME = re.compile(r"\n(?=\s*File \")")


def _path_and_index(key: str, value: Any) -> tuple[str, int]:
    head, number = ModuleCall.split_key(key)
    index = int(number) if number is not None else 0
    if isinstance(value, tuple) and len(value) == 2:
        return str(value[0]), index
    return head, index  # legacy {path: class}


@lru_cache(maxsize=1024)
def _frames(trace: str | None, keep: int) -> str | None:
    """The first ``keep`` frames of a stack trace (analogous blocks share their traces)."""
    if not trace or keep <= 0:
        return None
    frames = _FRAME.split(trace)
    return "\n".join(frames[:keep])


def _cut(raw: dict, group: Group) -> tuple[dict, int] | None:
    """The stack entries before ``group``'s call, and how many frames lead to the call."""
    items = list(raw.items())
    if not items:
        return None
    rooted = _path_and_index(*items[0])[0] == ""
    if group.kind != "module" or group.call is None:
        return (dict(items[:1]) if rooted else {}), 1
    call = group.call
    fallback = None
    for k, (key, value) in enumerate(items):
        path, index = _path_and_index(key, value)
        if path == call.path:
            if index == call.index:
                return dict(items[:k]), (k if rooted else k + 1)
            if fallback is None:
                fallback = dict(items[:k]), (k if rooted else k + 1)
    return fallback


def call_meta(group: Group, members: Iterable[torch.fx.Node],
              outputs: tuple[torch.fx.Node, ...]) -> dict:
    """Meta of the ``call_module`` node for ``group``."""
    meta: dict[str, Any] = {}
    for node in members:
        raw = node.meta.get("nn_module_stack")
        cut = _cut(raw, group) if raw else None
        if cut is not None:
            stack, keep = cut
            meta["nn_module_stack"] = stack
            trace = _frames(node.meta.get("stack_trace"), keep)
            if trace:
                meta["stack_trace"] = trace
            break
    if len(outputs) == 1:
        if "val" in outputs[0].meta:
            meta["val"] = outputs[0].meta["val"]
    elif outputs:
        meta["val"] = tuple(o.meta.get("val") for o in outputs)
    return meta


def getitem_meta(call: dict, output: torch.fx.Node) -> dict:
    """Meta of the ``getitem`` node that unpacks ``output`` from a call with ``call`` meta."""
    meta = {k: v for k, v in call.items() if k in ("nn_module_stack", "stack_trace")}
    if "val" in output.meta:
        meta["val"] = output.meta["val"]
    return meta


def input_meta(value: torch.fx.Node) -> dict:
    """Meta of a placeholder / get_attr standing for ``value`` (its value, for annotations)."""
    return {k: value.meta[k] for k in ("val", "tensor_meta") if k in value.meta}
