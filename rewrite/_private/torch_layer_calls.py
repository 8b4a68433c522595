"""A layer's calls in a ``torch.export`` trace: the first traced once as an
``invoke_subgraph`` call, the others recorded as calls of that subgraph, not traced (private
make_fx internals: the proxy mode's tracer, ``track_tensor_tree``, the invoke_subgraph cache,
symbolic sizes' expressions, hints and replacements; checked against the torch versions of
:data:`rewrite._private.CHECKED_WITH`).

torch.export traces every layer of a model again (its symbolic-shape reasoning grows with the
depth), and dispatching ``invoke_subgraph`` costs more than that at each call (a schema made
by tracing the body again, an autograd function, a fake run). :class:`LayerCalls` dispatches
one ``invoke_subgraph`` call per identifier (torch traces the body and keeps it); a later call
whose operands have the first call's dtypes and sizes (symbolic sizes of the same hint are
declared equal, as tracing the body would guard them: two symbols of one range by the shape
environment's replacement, ``ShapeEnv._set_replacement``, else ``torch._check``) is recorded as the
node the tracer would make, its outputs fresh fake tensors shaped as the first call's. Outside
a trace the body runs as is. Missing APIs raise :class:`Unavailable` (the caller traces the
whole model).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

from rewrite._private.errors import Unavailable
from rewrite._private.torch_programs import fake_like
from rewrite._private.torch_recording import record_call


@functools.lru_cache(maxsize=1)
def _apis() -> dict[str, Any]:
    """What recording a call needs (:func:`~rewrite._private.torch_recording.recording_apis`)
    and the ``invoke_subgraph`` op itself."""
    from rewrite._private.torch_recording import recording_apis

    apis = recording_apis()
    if apis is None:  # pragma: no cover - not in the checked versions
        raise Unavailable(f"torch {torch.__version__} lacks what recording a call needs")
    from torch._higher_order_ops.invoke_subgraph import invoke_subgraph

    return {**apis, "hop": invoke_subgraph}


def available() -> bool:
    """Whether this torch has what :class:`LayerCalls` uses."""
    try:
        _apis()
    except Unavailable:
        return False
    return True


class _First:
    """A traced call: its identifier, operands, outputs and the path of its subgraph."""

    __slots__ = ("name", "operands", "outputs", "path")

    def __init__(self, name: str, operands: Sequence[torch.Tensor],
                 outputs: Sequence[torch.Tensor], path: str) -> None:
        self.name, self.path = name, path
        self.operands, self.outputs = tuple(operands), tuple(outputs)


class LayerCalls:
    """The layer calls of one ``torch.export`` trace (see the module docstring); a call in
    another trace (torch.export called again: a retry) starts afresh."""

    def __init__(self) -> None:
        self._tracer: Any = None
        """The tracer of the trace the calls so far were made in."""
        self._first: dict[str, list[_First]] = {}
        self._equal: set = set()
        """Pairs of symbolic sizes declared equal."""
        self.traced: list[str] = []
        """The identifiers whose bodies were traced, in order."""
        self.recorded = 0
        """How many calls were recorded without tracing."""

    def call(self, identifier: str, body: Callable[..., tuple], operands: Sequence[Any]
             ) -> tuple:
        """``body(*operands)`` (a tuple of tensors): traced at the first call of
        ``identifier`` in an export, recorded at the later ones (a call with other sizes
        is traced again, as ``identifier.N``)."""
        api = _apis()
        mode = api["proxy_mode"]()
        if mode is None:
            return tuple(body(*operands))
        if mode.tracer is not self._tracer:  # another trace: its bodies are not on this root
            self.__init__()
            self._tracer = mode.tracer
        firsts = self._first.setdefault(identifier, [])
        for first in firsts:
            if _same_sizes(first.operands, operands, self._equal):
                self.recorded += 1
                return self._record(mode.tracer, first, operands)
        name = f"{identifier}.{len(firsts)}" if firsts else identifier
        outputs = tuple(api["hop"](body, name, *operands))
        graph = api["cache"]().get_proxy_dispatch_entry(name)
        path = next((path for path, m in mode.tracer.root.named_modules() if m is graph), None)
        if path is None:
            raise Unavailable(f"the traced body of {name} is not on the tracer's root")
        firsts.append(_First(name, operands, outputs, path))
        self.traced.append(name)
        return outputs

    def _record(self, tracer: Any, first: _First, operands: Sequence[Any]) -> tuple:
        """The call node the tracer would make for ``operands``, its outputs shaped as the
        first call's (their tensor metadata the first call's)."""
        outputs = tuple(fake_like(t) for t in first.outputs)
        args = []
        for operand in operands:
            proxy = tracer.unwrap_proxy(operand)
            if not isinstance(proxy, torch.fx.Proxy):
                raise Unavailable(f"an operand of {first.name} is not traced")
            args.append(proxy.node)
        metas = [getattr(tracer.unwrap_proxy(t), "node", None) for t in first.outputs]
        metas = [n.meta.get("tensor_meta") if n is not None else None for n in metas]
        record_call(type(tracer).create_node, tracer, first.path, first.name, args, outputs,
                    metas)
        return outputs


def _same_sizes(first: Sequence[torch.Tensor], now: Sequence[Any], known: set) -> bool:
    """Whether ``now`` has ``first``'s dtypes and sizes; symbolic sizes that differ only by
    their symbol (each input's own, of the same hint) are declared equal (``torch._check``,
    once per pair: ``known``); strides, which follow the sizes, are compared by hint."""
    if len(first) != len(now):
        return False
    pairs = []
    for a, b in zip(first, now):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.dim() != b.dim():
            return False
        if a is b:
            continue
        for k, (x, y) in enumerate(zip((*a.shape, *a.stride()), (*b.shape, *b.stride()))):
            if isinstance(x, int) or isinstance(y, int):
                if not (isinstance(x, int) and isinstance(y, int) and x == y):
                    return False
            elif x.node.expr != y.node.expr:
                if x.node.hint is None or x.node.hint != y.node.hint:
                    return False
                if k < a.dim() and (x.node.expr, y.node.expr) not in known:
                    pairs.append((x, y))
    for x, y in pairs:
        _declare_equal(x, y)
        known.add((x.node.expr, y.node.expr))
    return True


def _declare_equal(x: Any, y: Any) -> None:
    """``y`` is ``x`` from now on in their shape environment: two symbols of one range are
    one (the environment's replacement, as ``torch._check(y == x)`` makes after ~4 ms of
    reasoning: 4 per recorded layer call); anything else is checked with ``torch._check``."""
    import sympy

    env = x.node.shape_env
    a, b = y.node.expr, x.node.expr
    ranges = getattr(env, "var_to_range", {})
    if isinstance(a, sympy.Symbol) and isinstance(b, sympy.Symbol) and env is y.node.shape_env \
            and a in ranges and ranges.get(a) == ranges.get(b) \
            and hasattr(env, "_set_replacement"):
        env._set_replacement(a, b, "rewrite: a recorded layer call")
        return
    torch._check(y == x)
