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
from typing import Any, Callable, Sequence

import torch

from rewrite._private.errors import Unavailable
from rewrite._private.torch_programs import fake_like

_HOP = getattr(getattr(torch.ops, "higher_order", None), "invoke_subgraph", None)
_SIZES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_TRACKED = (torch.Tensor, *_SIZES)
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
    try:
        from torch.fx.experimental.proxy_tensor import track_tensor
    except ImportError:  # pragma: no cover - not in the checked versions
        track_tensor = None
    return {"cache": get_invoke_subgraph_cache, "proxy_mode": get_proxy_mode,
            "track": track_tensor_tree, "track_one": track_tensor,
            "create_node": TracerBase.create_node}


def record_call(create: Callable[..., torch.fx.Node], tracer: Any, path: str,
                identifier: str, operands: Sequence[torch.fx.Node], outputs: tuple,
                metas: Sequence[Any]) -> list[Any]:
    """The nodes ``tracer`` makes for an ``invoke_subgraph`` call of the subgraph at
    ``path`` (made by ``create``: a get_attr of the subgraph, the call) on ``operands``,
    ``outputs`` tracked as its results; returns their tensor metadata. ``metas``: that
    metadata where known (another call's of the subgraph: sizes, strides, memory format,
    ~1-4 ms of symbolic reasoning each), else computed as ``track_tensor_tree`` does."""
    api = recording_apis()
    assert api is not None
    getter = create(tracer, "get_attr", path, (), {})
    node = create(tracer, "call_function", _HOP, (getter, identifier, *operands), {})
    track_one = api["track_one"]
    if track_one is None or len(metas) != len(outputs) or any(m is None for m in metas):
        api["track"](outputs, tracer.proxy(node), constant=None, tracer=tracer)
        made = {item.args[1]: item.meta.get("tensor_meta") for item in node.users}
        return [made.get(k) for k in range(len(outputs))]
    call = tracer.proxy(node)  # what track_tensor_tree does for a tuple of tensors
    call.node.meta["val"] = outputs
    for k, (output, meta) in enumerate(zip(outputs, metas)):
        item = call[k]
        track_one(output, item, constant=None, tracer=tracer)
        item.node.meta["val"], item.node.meta["tensor_meta"] = output, meta
    return list(metas)


def _sizes_key(identifier: str, values: tuple) -> tuple:
    """A call's identifier and its outputs' dtypes and sizes (symbolic ones by expression):
    calls of one key have outputs of one tensor metadata."""
    return (identifier, *((v.dtype, *(_expr(s) for s in (*v.shape, *v.stride())))
                          for v in values))


def _expr(size: Any) -> Any:
    node = getattr(size, "node", None)
    return node.expr if node is not None else size


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
        if identifier in seen and recordable(node):
            repeated.add(node)
        seen.add(identifier)
    deferred = {n for n in gm.graph.nodes if n.op == "placeholder" and n.users
                and all(user in repeated for user in n.users)}
    return repeated, deferred


def recordable(call: torch.fx.Node) -> bool:
    """Whether an ``invoke_subgraph`` call can be recorded once its subgraph is traced: its
    value is known (a tuple of tensors) and its operands are nodes."""
    val = call.meta.get("val")
    return isinstance(val, tuple) and all(isinstance(v, torch.Tensor) for v in val) \
        and all(isinstance(a, torch.fx.Node) for a in call.args[2:])


def _read_apart(node: torch.fx.Node) -> bool:
    """Whether a node is read in a module call that does not hold its first reader's: a size
    computed once and read by several layers, made where the first layer reads it, would be
    that layer's (the others read it from inside it: not one body)."""
    stacks = [list(stack) for user in node.users
              if (stack := user.meta.get("nn_module_stack")) and _EMPTY_STACK not in stack]
    return any(stack[:len(stacks[0])] != stacks[0] for stack in stacks[1:])


_EMPTY_STACK = "_empty_nn_module_stack_from_metadata_hook"
"""The stack torch gives a node a pass made (it says nothing of where the node is)."""


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
        self._metas: dict[tuple, list] = {}
        """The outputs' tensor metadata of the calls recorded, by :func:`_sizes_key`."""

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
        out = super().run_node(n)
        if isinstance(out, _SIZES) and n.op == "call_function" and _read_apart(n):
            self._size_here(n, out)
        return out

    def _size_here(self, n: torch.fx.Node, size: Any) -> None:
        """The node of symbolic size ``size`` made now, with ``n``'s metadata (make_fx would
        make it where it is first read, with that reader's module stack)."""
        api = recording_apis()
        mode = api["proxy_mode"]() if api is not None else None
        if mode is not None:
            with self._set_current_node(n):
                mode.tracer.unwrap_proxy(size)

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
        key = _sizes_key(identifier, out)
        metas = self._metas.get(key, [None] * len(out))
        with self._set_current_node(n):
            # the nodes the tracer makes, without the call's ``eager_input_vals`` (a detached
            # copy of every operand's value, for Inductor's stride checks)
            self._metas[key] = record_call(api["create_node"], tracer, path, identifier,
                                           operands, out, metas)
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
