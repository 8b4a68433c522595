"""Repeated ``invoke_subgraph`` calls recorded in a ``make_fx`` trace without dispatching them
(private make_fx internals: the proxy mode's tracer, its node factory, ``track_tensor_tree``;
the invoke_subgraph cache; checked against the torch versions of
:data:`rewrite._private.CHECKED_WITH`).

make_fx dispatches every call of a subgraph: a fake-tensor run of the call and a cache key
over all its operands (~1 ms each), and traces each weight it reads. A call whose subgraph
an earlier call traced gives nothing new: :class:`Trace` records it as the nodes the tracer
would make (a ``get_attr`` of the traced subgraph, the call, its outputs' ``getitem``), with
the call's known value, and makes the placeholders only such calls read directly. When that
is not possible at run time, the trace raises :class:`Unavailable` (the caller falls back).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from rewrite._private.errors import Unavailable
from rewrite._private.torch_programs import fake_like

_HOP = getattr(getattr(torch.ops, "higher_order", None), "invoke_subgraph", None)
_TRACKED = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)
"""Operand values whose proxies the tracer tracks."""


@functools.lru_cache(maxsize=1)
def recording_apis() -> dict[str, Any] | None:
    """What :class:`Trace` needs to record a repeated call itself; None without it."""
    try:
        from torch._higher_order_ops.invoke_subgraph import get_invoke_subgraph_cache
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, track_tensor_tree
        from torch.fx.proxy import TracerBase
    except ImportError:  # pragma: no cover - not in the checked versions
        return None
    if _HOP is None:  # pragma: no cover - not in the checked versions
        return None
    return {"cache": get_invoke_subgraph_cache, "proxy_mode": get_proxy_mode,
            "track": track_tensor_tree, "create_node": TracerBase.create_node}


def repeated_calls(gm: torch.fx.GraphModule
                   ) -> tuple[set[torch.fx.Node], set[torch.fx.Node]]:
    """The ``invoke_subgraph`` calls of ``gm`` whose subgraph an earlier call traces (their
    values known: a tuple of tensors), and the placeholders only they read."""
    seen: set[object] = set()
    repeated: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not _HOP:
            continue
        identifier = node.args[1]
        val = node.meta.get("val")
        if identifier in seen and isinstance(val, tuple) \
                and all(isinstance(v, torch.Tensor) for v in val) \
                and all(isinstance(a, torch.fx.Node) for a in node.args[2:]):
            repeated.add(node)
        seen.add(identifier)
    deferred = {n for n in gm.graph.nodes if n.op == "placeholder" and n.users
                and all(user in repeated for user in n.users)}
    return repeated, deferred


class _Deferred:
    """The value of a placeholder only repeated calls read (not traced)."""

    __slots__ = ("node",)

    def __init__(self, node: torch.fx.Node) -> None:
        self.node = node


class Trace(torch.fx.Interpreter):
    """Runs a program under ``make_fx``; a repeated ``invoke_subgraph`` call (its subgraph
    traced at an earlier call, :func:`repeated_calls`) is recorded as the call node the
    tracer would make, with the call's known value, instead of dispatching it (a fake-tensor
    run of the call, a cache key over all its operands: ~1 ms each); the placeholders only
    such calls read are made directly (:attr:`made`), not traced."""

    def __init__(self, gm: torch.fx.GraphModule, repeated: set[torch.fx.Node],
                 deferred: set[torch.fx.Node]) -> None:
        super().__init__(gm)
        self.repeated = repeated
        self.deferred = deferred
        self.made: dict[torch.fx.Node, torch.fx.Node] = {}
        """Each deferred placeholder -> the placeholder made for it in the traced graph."""
        self._tracked: set[int] = set()
        self._paths: dict[int, str] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n in self.deferred:
            return _Deferred(n)
        if n in self.repeated:
            out = self._call_again(n)
            if out is not None:
                return out
            if any(isinstance(self.env.get(a), _Deferred) for a in n.all_input_nodes):
                # its weights were not traced: the trace cannot dispatch it either
                raise Unavailable(f"cannot record the repeated call {n.name}")
        return super().run_node(n)

    def _call_again(self, n: torch.fx.Node) -> Any:
        api = recording_apis()
        mode = api["proxy_mode"]()
        cache = api["cache"]()
        identifier = n.args[1]
        body = cache.get_proxy_dispatch_entry(identifier) if cache is not None else None
        if mode is None or body is None:
            return None
        # a value another call's outputs were tracked as (the inlined copies of a traced
        # layer share their values) gets a value of its own
        out = tuple(fake_like(v) if id(v) in self._tracked else v for v in n.meta["val"])
        tracer = mode.tracer
        operands = []
        for arg in n.args[2:]:
            value = self.env[arg]
            if isinstance(value, _Deferred):
                operands.append(self._placeholder(tracer, value.node))
                continue
            # a tensor, or a symbolic size (a dynamic shape's): the proxy tracking it
            proxy = tracer.unwrap_proxy(value) if isinstance(value, _TRACKED) else None
            if not isinstance(proxy, torch.fx.Proxy):
                return None
            operands.append(proxy.node)
        path = self._paths.get(id(body))
        if path is None:
            path = next((name for name, m in tracer.root.named_modules() if m is body), None)
            if path is None:
                return None
            self._paths[id(body)] = path
        create = api["create_node"]
        with self._set_current_node(n):
            # the nodes the tracer makes (a get_attr of the subgraph, the call), without the
            # call's ``eager_input_vals`` (a detached copy of every operand's value, for
            # Inductor's stride checks)
            getter = create(tracer, "get_attr", path, (), {})
            node = create(tracer, "call_function", _HOP, (getter, identifier, *operands), {})
            api["track"](out, tracer.proxy(node), constant=None, tracer=tracer)
        self._tracked.update(id(v) for v in out)
        return out

    def _placeholder(self, tracer: Any, original: torch.fx.Node) -> torch.fx.Node:
        made = self.made.get(original)
        if made is None:
            # the program's value (make_fx's would be a detached copy: not worth ~30 us each,
            # the translation reads shapes and types) and tensor metadata
            made = tracer.graph.placeholder(original.name)
            made.meta.update({k: original.meta[k] for k in ("val", "tensor_meta")
                              if k in original.meta})
            self.made[original] = made
        return made


def placeholders_in_order(graph: torch.fx.Graph, placeholders: list[torch.fx.Node],
                           traced: list[torch.fx.Node],
                           made: dict[torch.fx.Node, torch.fx.Node]) -> None:
    """``graph``'s placeholders (``traced``'s, in order, then those :class:`Trace` made)
    moved to the start, in the order of the program's ``placeholders``."""
    if not made:
        return
    mine = set(made.values())
    fresh = iter(n for n in graph.nodes if n.op == "placeholder" and n not in mine)
    by_original = {original: next(fresh) for original in traced}
    by_original.update(made)
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for original in placeholders:
        first.prepend(by_original[original])
