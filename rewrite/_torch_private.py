"""The private torch APIs ``rewrite`` uses, in one place, each with a fallback.

pyproject declares ``torch>=2.9``; these were checked against torch 2.13.0 (the version the
Makefile installs and the tests run with). When a torch release moves or drops one of them,
the fallback keeps ``rewrite`` working, slower or with a plainer result, instead of failing
to import:

* ``torch.fx._lazy_graph_module._LazyGraphModule``: lowered FX modules compile their code
  once per distinct body (:mod:`rewrite.backends.fx.compile`). Fallback: plain
  ``GraphModule`` (compiles each module when built; same modules, slower).
* ``torch.fx.graph._PyTreeCodeGen`` / ``_PyTreeInfo``: the lowered GraphModule takes the
  program's (nested) arguments like ``ExportedProgram.module()``. Fallback: the default
  code generation (flat positional arguments).
* ``Graph._codegen``: the code generation of a GraphModule given to ``rewrite``. Fallback:
  the default one.
* ``torch._ops.OpOverload`` / ``OpOverloadPacket``: an FX node's target printed as
  ``aten.mm.default``. Fallback: recognised by class name.
* ``torch._export.serde.serialize.typing``: while a ``.pt2`` loads, the module's
  ``typing.get_type_hints`` (called once per deserialized object, for one of a few dozen
  schema classes: ~47,000 calls, ~45% of ``torch.export.load``'s CPU time on the 48-block
  GPT-2) is memoized (:func:`memoized_pt2_type_hints`). Same program; fallback: not memoized.

Texts torch prints are parsed in two places, each falling back to the plain message when the
text changes: :mod:`rewrite.frontends.pt2` (``torch.export.load``'s reasons) and
:mod:`rewrite.backends.onnx.torch_failure` (``torch.onnx.export``'s step and causes).
"""

from __future__ import annotations

import contextlib
import typing
from typing import Any, Iterator

import torch

from rewrite._swap import swapped

CHECKED_WITH = ("2.13.0",)
"""torch versions these private APIs were checked against."""

try:
    from torch.fx._lazy_graph_module import _LazyGraphModule as LazyGraphModule
except ImportError:  # pragma: no cover - not in the checked versions
    LazyGraphModule = torch.fx.GraphModule  # type: ignore[misc, assignment]

try:
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
except ImportError:  # pragma: no cover - not in the checked versions
    _PyTreeCodeGen = _PyTreeInfo = None  # type: ignore[assignment, misc]

_OP_TYPES: tuple[type, ...] = tuple(
    t for t in (getattr(getattr(torch, "_ops", None), n, None)
                for n in ("OpOverload", "OpOverloadPacket")) if isinstance(t, type)
)


def real_recompile(module: torch.fx.GraphModule) -> None:
    """Generate and compile the code of a (lazy) GraphModule now."""
    compile_now = getattr(module, "real_recompile", None)
    if compile_now is not None:
        compile_now()
    else:  # pragma: no cover - a plain GraphModule compiles in recompile()
        module.recompile()


def pytree_codegen(names: list[str], in_spec: Any, out_spec: Any) -> torch.fx.graph.CodeGen:
    """Code generation taking and returning the program's nested arguments and outputs."""
    if _PyTreeCodeGen is None:  # pragma: no cover - not in the checked versions
        return torch.fx.graph.CodeGen()
    return _PyTreeCodeGen(_PyTreeInfo(names, in_spec, out_spec))


def codegen_of(graph: torch.fx.Graph) -> torch.fx.graph.CodeGen:
    """The code generation ``graph`` uses."""
    return getattr(graph, "_codegen", None) or torch.fx.graph.CodeGen()


def is_op_overload(target: Any) -> bool:
    """True for ``torch.ops.ns.op.overload`` (and ``torch.ops.ns.op``) targets."""
    if _OP_TYPES:
        return isinstance(target, _OP_TYPES)
    return type(target).__name__ in ("OpOverload", "OpOverloadPacket")  # pragma: no cover


class _TypingWithCachedHints:
    """The ``typing`` module with ``get_type_hints`` memoized for classes."""

    def __init__(self) -> None:
        # attributes, not __getattr__: read ~500,000 times while a program loads
        self.__dict__.update(vars(typing))
        self.get_type_hints = self._get_type_hints
        self._cache: dict[tuple[type, int], dict[str, Any]] = {}

    def _get_type_hints(self, obj: Any, globalns: dict | None = None, *args: Any,
                        **kwargs: Any) -> dict[str, Any]:
        if args or kwargs or not isinstance(obj, type):
            return typing.get_type_hints(obj, globalns, *args, **kwargs)
        key = (obj, id(globalns))
        hints = self._cache.get(key)
        if hints is None:
            hints = self._cache[key] = typing.get_type_hints(obj, globalns)
        return hints


@contextlib.contextmanager
def memoized_pt2_type_hints() -> Iterator[None]:
    """While in this context, ``torch.export.load`` resolves each schema class's type hints
    once (torch's deserializer resolves them again for every object it reads; the classes and
    the namespace are fixed, so the hints are the same each time)."""
    try:
        from torch._export.serde import serialize
    except ImportError:  # pragma: no cover - not in the checked versions
        yield
        return
    with swapped(serialize, "typing", _TypingWithCachedHints(), expected=typing):
        yield
