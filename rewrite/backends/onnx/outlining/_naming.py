"""Names: functions (suffixes for distinct bodies), function inputs, call-node metadata."""

from __future__ import annotations

import functools
import itertools
from typing import Iterable, Iterator

import onnx_ir as ir

from rewrite.errors import GroupingError
from rewrite.frontends.onnx.graph import NAMESPACE
from rewrite.grouping import Group

RULE_KEY = "pkg.rewrite.rule"
GROUP_KEY = "pkg.rewrite.group"
RESERVED_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training")


class FunctionNames:
    """Hands out ``Name``, ``Name_1``, ``Name_2``... per domain, never reusing a taken one;
    with ``functions=True`` never a standard ONNX operator's name either (see
    :func:`is_onnx_operator`)."""

    def __init__(self, taken: Iterable[tuple[str, str]] = (), *, functions: bool = False) -> None:
        self._taken = set(taken)
        self._next: dict[tuple[str, str], int] = {}
        self._functions = functions

    def new(self, domain: str, base: str) -> str:
        start = self._next.get((domain, base), 0)
        for n, name in numbered(base, start):
            if (domain, name) not in self._taken \
                    and not (self._functions and is_onnx_operator(name)):
                break
        self._next[(domain, base)] = n
        self._taken.add((domain, name))
        return name


def numbered(base: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """``(n, name)`` for ``n`` from ``start``: ``base``, ``base_1``, ``base_2``..."""
    for n in itertools.count(start):
        yield n, base if n == 0 else f"{base}_{n}"


def function_name(base: str, k: int) -> str:
    """The ``k``-th name of functions named from ``base``: ``base``, ``base_1``... skipping
    standard ONNX operators' names (``Sub`` -> ``Sub_1``, ``Sub_2``...)."""
    names = (name for _, name in numbered(base) if not is_onnx_operator(name))
    return next(itertools.islice(names, k, None))


@functools.lru_cache(maxsize=None)
def is_onnx_operator(name: str) -> bool:
    """Whether ``name`` is a standard ONNX operator's. A function is never named so:
    onnxruntime takes such a function for the operator, whatever its domain (1.32 crashes
    creating a session for a one-input function named ``Sub``, ``Add``, ``Mul`` or ``Div``,
    even with its graph optimizations off)."""
    import onnx.defs

    return onnx.defs.has(name)


def check_identity(group: Group) -> None:
    """Raise :class:`GroupingError` for a function name/domain ONNX cannot use."""
    if group.domain in RESERVED_DOMAINS:
        raise GroupingError(
            f"group {group.id}: function domain {group.domain!r} is reserved for standard ONNX "
            "operators; give the rule a domain such as \"pkg.mymodels\"",
            rule=group.origin,
        )
    if not group.function_name or not group.function_name.strip():
        raise GroupingError(f"group {group.id}: empty function name", rule=group.origin)


def input_names(values: list[ir.Value], group: Group, taken: set[str]) -> list[str]:
    """Names of a function's inputs: the outer names, with the group's module path removed
    from weight names (``h.0.attn.c_attn.weight`` -> ``c_attn.weight`` in ``h.0.attn``)."""
    prefix = group.call.path + "." if group.call is not None and group.call.path else None
    names = []
    used = set(taken)
    for k, value in enumerate(values):
        name = value.name or f"input_{k}"
        if prefix and name.startswith(prefix) and len(name) > len(prefix):
            short = name[len(prefix):]
            if short not in used:
                name = short
        while name in used:
            name = f"{name}_{k}"
        used.add(name)
        names.append(name)
    return names


def namespace(chain: list[Group], root_class: str | None) -> str:
    """``: Root/h.0: pkg.Block/h.0.attn: pkg.Attention``, like torch's node ``namespace``."""
    parts = [f": {root_class}" if root_class else ":"]
    for group in chain:
        if group.call is not None:
            parts.append(f"{group.call.key}: {group.call.cls}")
        else:
            parts.append(f"{group.key}: {group.kind}")
    return "/".join(parts)


def call_metadata(chain: list[Group], root_class: str | None) -> dict[str, str]:
    """Metadata of the call node of ``chain[-1]`` (``chain`` runs from the top group down)."""
    group = chain[-1]
    props = {NAMESPACE: namespace(chain, root_class), GROUP_KEY: group.id}
    if group.origin:
        props[RULE_KEY] = group.origin
    return props


def drop_node_names(functions: Iterable[ir.Function]) -> None:
    """Unname every node of ``functions``, in their subgraphs too
    (``OnnxOptions.body_node_names=False``)."""
    for function in functions:
        for node in ir.traversal.RecursiveGraphIterator(function):
            node.name = None
