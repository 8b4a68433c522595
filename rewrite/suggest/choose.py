"""What a starter rules file groups, read from a model's module calls.

* **Blocks**: classes whose calls repeat (``repeats >= 2``) and that are worth a function:
  calls that hold other module calls, or a leaf with weights and at least
  :data:`MIN_LEAF_SIZE` operations (an RMSNorm; not a Linear, not an activation, which the
  ONNX optimizer may fuse into one op); never ``torch.nn`` containers (``Sequential``...).
  Outermost first (by the depth of their shallowest call), then in order of appearance; a
  block class nested in another says which.
* **Top-level modules with weights**: the embedding, head and final norm. Calls that are no
  block, hold no block, read weights (a parameter or buffer below their path) and sit at
  the top level, or beside the blocks (their parent holds blocks and is inside none).
* **Dropout**: ``flat``, so that broader group rules added later leave it inline.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from attrs import frozen

from rewrite.grouping import GroupTree
from rewrite.ir import Graph, ModuleCall

MIN_LEAF_SIZE = 6
"""Operations a repeated module without submodules needs to be suggested as a block."""

CONTAINERS = "torch.nn.modules.container."


@frozen
class CallInfo:
    """One module call, as the suggestion sees it."""

    call: ModuleCall
    parent: ModuleCall | None
    size: int
    leaf: bool
    """It holds no other module call."""


@frozen
class Plan:
    """The chosen calls: block classes (outermost first), single modules, dropout classes."""

    blocks: tuple[str, ...]
    """Qualified class names."""
    inside: dict
    """Block class -> the block class its calls sit in (the nearest), for nested ones."""
    singles: tuple[ModuleCall, ...]
    dropout: tuple[str, ...]
    calls: Counter
    """Qualified class -> its number of calls in the model."""


def call_infos(tree: GroupTree) -> dict[ModuleCall, CallInfo]:
    """Every module call with its parent call, size and whether it is a leaf."""
    graph = tree.graph
    parent: dict[ModuleCall, ModuleCall | None] = {}
    for stack in _stacks(graph):
        for k, call in enumerate(stack):
            parent.setdefault(call, stack[k - 1] if k else None)
    has_child = {p for p in parent.values() if p is not None}
    measures = tree.call_measures
    calls = tree.segments.calls
    out = {}
    for i, call in enumerate(calls):
        if call in parent:
            size = measures.of(i).size if measures is not None else 0
            out[call] = CallInfo(call, parent[call], size, call not in has_child)
    return out


def _stacks(graph: Graph) -> Iterable[tuple[ModuleCall, ...]]:
    seen = set()
    for node in graph.nodes:
        stack = node.stack
        if stack and stack not in seen:
            seen.add(stack)
            yield stack


PATHS = "path:"
"""How :func:`class_key` starts for a call without a class."""


def class_key(call: ModuleCall) -> str:
    """What counts as a call's class here: its class, or for a call read from ONNX node names
    (no class) ``path:`` and its path with every index a ``*`` (``path:model.layers.*``), so
    that repeated siblings count as one block."""
    if call.cls:
        return call.cls
    return PATHS + call.siblings


def plan(infos: dict[ModuleCall, CallInfo], weighted: set[ModuleCall]) -> Plan:
    """Choose the block classes, single modules and dropout classes of a model."""
    calls = Counter(class_key(info.call) for info in infos.values())
    worth = {class_key(i.call) for i in infos.values()
             if not i.leaf or (i.size >= MIN_LEAF_SIZE and i.call in weighted)}
    candidates = {cls for cls in worth
                  if calls[cls] >= 2 and not cls.startswith(CONTAINERS)}
    first: dict[str, tuple[int, int]] = {}
    for position, call in enumerate(infos):
        if class_key(call) in candidates:
            key = (_depth(call, infos), position)
            first[class_key(call)] = min(first.get(class_key(call), key), key)
    blocks = tuple(sorted(candidates, key=lambda cls: first[cls]))
    inside: dict[str, str] = {}
    for call in infos:
        if class_key(call) in candidates and class_key(call) not in inside:
            around = _enclosing(call, infos, candidates)
            if around is not None:
                inside[class_key(call)] = class_key(around)
    in_block = {c for c in infos if _enclosing(c, infos, candidates) is not None
                or class_key(c) in candidates}
    holds_block = {a for c in infos if class_key(c) in candidates for a in _ancestors(c, infos)}
    singles = tuple(
        c for c, info in infos.items()
        if c not in in_block and c not in holds_block and c in weighted
        and not class_key(c).startswith(CONTAINERS)
        and (info.parent is None or (info.parent in holds_block and info.parent not in in_block))
    )
    dropout = tuple(dict.fromkeys(class_key(c) for c in infos if c.class_name.endswith("Dropout")))
    return Plan(blocks, inside, singles, dropout, calls)


def _depth(call: ModuleCall, infos: dict[ModuleCall, CallInfo]) -> int:
    return sum(1 for _ in _ancestors(call, infos)) + 1


def _ancestors(call: ModuleCall, infos: dict[ModuleCall, CallInfo]) -> Iterable[ModuleCall]:
    parent = infos[call].parent
    while parent is not None:
        yield parent
        parent = infos[parent].parent if parent in infos else None


def _enclosing(call: ModuleCall, infos: dict[ModuleCall, CallInfo],
               classes: set[str]) -> ModuleCall | None:
    """The nearest call around ``call`` whose class is one of ``classes``."""
    return next((a for a in _ancestors(call, infos) if class_key(a) in classes), None)


def weighted_calls(graph: Graph) -> set[ModuleCall]:
    """The calls whose nodes (those of nested calls included) read a weight: a parameter or
    buffer of an exported program, a ``get_attr`` of a GraphModule, a floating-point tensor
    initializer of an ONNX model."""
    weights = _weight_nodes(graph)
    out: set[ModuleCall] = set()
    for node in graph.nodes:
        if node.stack and not node.is_io and any(i in weights for i in node.inputs):
            out.update(node.stack)
    return out


def _weight_nodes(graph: Graph) -> set[int]:
    signature = getattr(graph.source, "graph_signature", None)
    named = set()
    if signature is not None:  # an ExportedProgram: parameters and buffers are placeholders
        named = {*signature.inputs_to_parameters, *signature.inputs_to_buffers}
    out = set()
    for node in graph.nodes:
        if node.op == "get_attr" and _is_weight(node.source):
            out.add(node.index)
        elif node.op == "placeholder" and node.name in named:
            out.add(node.index)
    return out


def _is_weight(source: Any) -> bool:
    """An FX ``get_attr`` node, or an ONNX initializer holding a float tensor (not a folded
    shape or index constant)."""
    dtype, shape = getattr(source, "dtype", None), getattr(source, "shape", None)
    if dtype is None or shape is None:  # not an onnx_ir.Value
        return True
    return bool(getattr(dtype, "is_floating_point", lambda: False)()) and len(shape) >= 1
