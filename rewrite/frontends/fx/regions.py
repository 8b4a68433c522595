"""Higher-order op regions: module stacks a strict export recorded at the root, and
``invoke_subgraph`` calls read as calls of their module.

A higher-order op (``wrap_with_set_grad_enabled`` for a ``torch.no_grad()`` block,
``invoke_subgraph``, ``cond``...) runs a body graph held by a ``get_attr`` submodule. In strict
exports (``torch.export.export(..., strict=True)``) the op node, its body's ``get_attr`` and the
``getitem`` nodes that unpack its results may carry only the root module's stack entry, while
the body's own nodes carry the full stack of the module that ran the region (the rotary
embedding of a Llama). Read as they are, such nodes sit at the top level, between the nodes
of that module: the module cannot be outlined.

:func:`region_stacks` gives such nodes the stack their bodies agree on (the longest common
prefix of the body nodes' stacks, over every branch), when it is deeper than their own.
:func:`readable_program` makes a copy of a program with those stacks written in (for
torch.onnx too) and each ``invoke_subgraph`` call replaced by its body, with the stacks of its
own call.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from rewrite.frontends.fx.nn_module_stack import EMPTY_STACK_KEY
from rewrite.ir import ModuleCall

_STACK = "nn_module_stack"


def region_stacks(graph: torch.fx.Graph) -> dict[torch.fx.Node, dict]:
    """Per node of a region recorded at the root, the stack it should have (see the module
    docstring); empty when there is none."""
    holders = graph.find_nodes(op="get_attr")  # indexed: no pass over the nodes
    if not holders:
        return {}
    owner = graph.owning_module
    bodies = {}
    for holder in holders:
        body = _attr(owner, holder.target)
        if isinstance(body, torch.fx.GraphModule):
            bodies[holder] = body
    if not bodies:
        return {}
    changed: dict[torch.fx.Node, list] = {}
    for op_node in {user: None for holder in bodies for user in holder.users}:
        holders = [a for a in op_node.all_input_nodes if a in bodies]
        stack = _common([_common_stack(bodies[h]) for h in holders])  # all branches agree
        if not _root_only(op_node) or len(stack) <= 1:
            continue
        for node in (*holders, op_node, *op_node.users):
            if node is op_node or node in holders or node.target is operator.getitem:
                if _root_only(node) and node not in changed:
                    changed[node] = stack
    return {node: dict(stack) for node, stack in changed.items()}


def _attr(owner: Any, target: Any) -> Any:
    value = owner
    for part in str(target).split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


_EXPORT_ROOT = "_export_root"
"""The path strict exports give the root module inside higher-order op bodies."""


def _items(node: torch.fx.Node) -> list:
    """The node's stack entries; inside bodies of strict exports, without the extra
    ``_export_root`` entry and path prefix, so they read like the main graph's."""
    stack = node.meta.get(_STACK)
    if not isinstance(stack, dict):
        return []
    items = list(stack.items())
    if not any(isinstance(v, tuple) and v and v[0] == _EXPORT_ROOT for _, v in items):
        return items
    out = []
    for key, value in items:
        path = value[0] if isinstance(value, tuple) and len(value) == 2 else None
        if path == _EXPORT_ROOT:
            continue
        if isinstance(path, str) and path.startswith(_EXPORT_ROOT + "."):
            path = path[len(_EXPORT_ROOT) + 1:]
            key, value = _strip_key(str(key), path), (path, value[1])
        out.append((key, value))
    return out


def _strip_key(key: str, path: str) -> str:
    """``key`` for the call at ``path``: its ``@N`` kept."""
    index = ModuleCall.split_key(key)[1]
    return f"{path}@{index}" if index is not None else path


def _common(stacks: list[list]) -> list:
    """The longest common prefix of stacks (empty for none)."""
    if not stacks:
        return []
    common = stacks[0]
    for items in stacks[1:]:
        size = 0
        for a, b in zip(common, items):
            if a != b:
                break
            size += 1
        common = common[:size]
    return common


def _root_only(node: torch.fx.Node) -> bool:
    """Whether the node's stack is absent, empty or only the root entry (path ``""``)."""
    items = _items(node)
    return all(isinstance(v, tuple) and len(v) == 2 and v[0] == "" for _, v in items)


def _common_stack(body: torch.fx.GraphModule) -> list:
    """The longest common prefix of the stacks of the body's operations (recursing into
    nested bodies through their own operations only)."""
    return _common([items for node in body.graph.nodes
                    if node.op == "call_function" and (items := _items(node))])


def readable_program(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` as rewrite reads and lowers it; ``program`` itself is never changed.

    When it has regions recorded at the root (:func:`region_stacks`) or ``invoke_subgraph``
    calls, a copy in which the regions carry their stacks (so torch.onnx's decomposition,
    which gives an inlined region's nodes the stack of its op, keeps them in their module)
    and each ``invoke_subgraph`` call (``torch.compiler.nested_compile_region``) is replaced
    by the nodes of its body. torch records one body for all calls of a region, its nodes
    carrying the stack of the first call; each inlined copy gets the stack of its own call
    (the ``invoke_subgraph`` node's) followed by the body's calls below the region's module,
    re-rooted at that call: every call of the region is one call of its module, grouped by
    the same rules (one function per distinct body, made by rewrite instead of torch's).
    """
    graph = program.graph_module.graph
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    calls = graph.find_nodes(op="call_function", target=hop) if hop is not None else []
    stacks = region_stacks(graph)
    if not calls and not stacks and not shared_sizes(graph):
        return program
    import copy

    gm = torch.fx.GraphModule(program.graph_module, copy.deepcopy(graph))
    if stacks:  # the copy keeps the order of the nodes
        copies = dict(zip(graph.nodes, gm.graph.nodes))
        for node, stack in stacks.items():
            copies[node].meta[_STACK] = stack
    lifted = _Lifted(gm.graph, _user_inputs(program))
    if calls:
        _inline_calls(gm, hop, lifted)
    sizes_at_top(gm.graph)
    gm.recompile()
    return _with_graph_module(program, gm, lifted)


class _Lifted:
    """The tensor constants a body holds (``torch.tensor(...)`` in a layer's ``forward``:
    torch.export lifts such constants out of the program's own graph, not out of an
    ``invoke_subgraph`` body), lifted as the program's own are: one constant input per
    tensor of each body, shared by every call of that body."""

    def __init__(self, graph: torch.fx.Graph, user_inputs: set[str]) -> None:
        self.graph = graph
        self.placeholders: dict[tuple[int, str], torch.fx.Node] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        inputs = graph.find_nodes(op="placeholder")  # constants before user inputs
        users = [n for n in inputs if n.name in user_inputs]
        self._before = users[0] if users else None
        self._last = inputs[-1] if inputs else None

    def replace(self, body: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> None:
        """Each of ``nodes`` (an inlined call of ``body``) that reads a tensor of ``body``
        reads the constant input lifted from it."""
        for node in nodes:
            held = getattr(body, str(node.target), None) if node.op == "get_attr" else None
            if isinstance(held, torch.Tensor):
                node.replace_all_uses_with(self._input(body, str(node.target), held))
                self.graph.erase_node(node)

    def _input(self, body: torch.fx.GraphModule, name: str, tensor: torch.Tensor
               ) -> torch.fx.Node:
        key = (id(body), name)
        if key not in self.placeholders:
            target = f"lifted_body_tensor_{len(self.tensors)}"
            with (self.graph.inserting_before(self._before) if self._before is not None
                  else self.graph.inserting_after(self._last) if self._last is not None
                  else self.graph.inserting_before(next(iter(self.graph.nodes)))):
                node = self.graph.placeholder(f"c_{target}")
            self._last = node
            node.meta["val"] = _fake(self.graph, tensor)
            self.placeholders[key], self.tensors[target] = node, tensor
        return self.placeholders[key]


def _fake(graph: torch.fx.Graph, tensor: torch.Tensor) -> Any:
    """``tensor`` as the program's placeholders hold theirs: a fake tensor of their fake
    mode (the tensor itself where they hold none)."""
    modes = [value.fake_mode for node in graph.find_nodes(op="placeholder")
             if (value := node.meta.get("val")) is not None and hasattr(value, "fake_mode")]
    return modes[0].from_tensor(tensor, static_shapes=True) if modes else tensor


def _inline_calls(gm: torch.fx.GraphModule, hop: Any, lifted: _Lifted) -> None:
    """Each ``invoke_subgraph`` call of ``gm`` replaced by its body's nodes, with the stacks
    of its own call (see :func:`readable_program`), the tensors the body holds lifted
    (:class:`_Lifted`); a size a node before the call computes is that node's."""
    from rewrite._private.torch_programs import inline_invoke_subgraph_nodes

    sizes: dict[str, torch.fx.Node] = {}
    scanned = None  # the last node whose symbolic size is in ``sizes``
    for node in list(gm.graph.find_nodes(op="call_function", target=hop)):
        body = _attr(gm, node.args[0].target)
        base = _common_stack(body) if isinstance(body, torch.fx.GraphModule) else []
        call = _items(node)
        start = gm.graph.call_function(operator.getitem, ((), 0))  # around the call
        end = gm.graph.call_function(operator.getitem, ((), 1))
        node.prepend(start)
        node.append(end)
        inline_invoke_subgraph_nodes(gm, [node])
        lifted.replace(body, _between(start, end))
        new = _between(start, end)
        for n in new:
            if _STACK in n.meta:
                n.meta[_STACK] = _rerooted(_items(n), base, call)
        first = scanned.next if scanned is not None else next(iter(gm.graph.nodes))
        _known_sizes(_between(first.prev, start), sizes)
        _sizes_from_before(gm.graph, new, sizes)
        scanned = end.prev if end.prev is not start else start.prev
        gm.graph.erase_node(start)
        gm.graph.erase_node(end)


_SIZES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def shared_sizes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The symbolic sizes computed from the graph's inputs alone (``sym_size`` of an input,
    their products...) inside a module call and read outside it, in graph order.

    torch's tracer computes each size once, where it is first needed: a MoE's ``2 * batch``
    inside its first layer's experts, read again by every later layer. Left there, the
    first layer's body holds nodes the others do not (not one repeated body)."""
    pure: dict[torch.fx.Node, list] = {}  # a size of the inputs alone -> its stack
    for node in graph.nodes:
        inputs = node.all_input_nodes
        if node.op == "call_function" and isinstance(node.meta.get("val"), _SIZES) and \
                inputs and all(a.op == "placeholder" or a in pure for a in inputs):
            pure[node] = _items(node)
    read: dict[torch.fx.Node, list | None] = {}  # its users' common stack (None: unknown)
    for node in reversed(pure):
        stacks = [read[u] if u in pure else [] if u.op == "output" else _known(_items(u))
                  for u in node.users]
        known = [s for s in stacks if s is not None]
        read[node] = _common(known) if known else None
    return [n for n, items in pure.items() if (own := _known(items)) is not None
            and (users := read[n]) is not None and users[:len(own)] != own]


def _known(items: list) -> list | None:
    """Stack ``items``, or None where they do not say where the node is (none, or torch's
    mark of a node a pass made)."""
    return items if items and all(k != EMPTY_STACK_KEY for k, _ in items) else None


def sizes_at_top(graph: torch.fx.Graph) -> None:
    """The :func:`shared_sizes` of ``graph`` moved after the graph's inputs and their own,
    with torch's mark of a node a pass made: grouping places them with their users, as
    torch's own ``sym_size`` nodes (in the module call that holds all of them)."""
    moved = shared_sizes(graph)
    if not moved:
        return
    order = {node: n for n, node in enumerate(graph.nodes)}
    cursor = graph.find_nodes(op="placeholder")[-1]
    for node in moved:
        anchor = max([cursor, *node.all_input_nodes], key=order.__getitem__)
        anchor.append(node)
        order[node] = order[anchor]
        cursor = node
        node.meta[_STACK] = {EMPTY_STACK_KEY: (EMPTY_STACK_KEY, EMPTY_STACK_KEY)}


def _between(start: torch.fx.Node, end: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes after ``start`` and before ``end``."""
    found, node = [], start.next
    while node is not end:
        found.append(node)
        node = node.next
    return found


def _input_size(value: Any) -> bool:
    """Whether ``value`` is a symbolic size of the program's inputs (``batch``, ``2 *
    sequence_length``...): the same at every call of a body. A size that depends on data
    (an unbacked symbol, ``u0``: the tokens a MoE routes to an expert) has one name in the
    body and another value at each call."""
    from torch.fx.experimental.symbolic_shapes import has_free_unbacked_symbols

    return isinstance(value, torch.SymInt) and not has_free_unbacked_symbols(value)


def _known_sizes(nodes: list, sizes: dict[str, torch.fx.Node]) -> None:
    """``sizes`` with the symbolic sizes of the inputs ``nodes`` compute (the first node of
    each)."""
    for node in nodes:
        value = node.meta.get("val")
        if _input_size(value):
            sizes.setdefault(str(value), node)


def _sizes_from_before(graph: torch.fx.Graph, new: list, sizes: dict[str, torch.fx.Node]
                       ) -> None:
    """An inlined body's symbolic sizes of the inputs (``sym_size``, their sums...) computed
    again where a node before its call computes the same size (``sizes``): that node's, as a
    trace of the whole program gives them (its tracer computes each symbolic size once)."""
    for node in new:
        value = node.meta.get("val")
        if not _input_size(value):
            continue
        earlier = sizes.get(str(value))
        if earlier is not None:
            node.replace_all_uses_with(earlier)
            graph.erase_node(node)
        else:
            _of_an_input(graph, node)
            sizes[str(value)] = node


def _of_an_input(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    """``node``, a ``sym_size`` of a body's operand computed in the program (a decoder
    layer's cross-attention keys, concatenated before the call) whose size is one of the
    program's inputs' (``past_encoder_sequence_length``), made to read the first input of
    that size, as a trace of the whole program reads it: then a size of the inputs alone,
    which :func:`sizes_at_top` moves out of the first call (the later calls read it)."""
    if node.target is not torch.ops.aten.sym_size.int or node.args[0].op == "placeholder":
        return
    size = str(node.meta["val"])
    for placeholder in graph.find_nodes(op="placeholder"):
        value = placeholder.meta.get("val")
        shape = getattr(value, "shape", ())
        dims = [d for d, n in enumerate(shape) if isinstance(n, torch.SymInt) and str(n) == size]
        if dims:
            node.args = (placeholder, dims[0])
            return


def _rerooted(items: list, base: list, call: list) -> dict:
    """A body node's stack for one call: the call's stack, then the body's calls below the
    region's module (``base``: what all body nodes share), their paths moved under the
    call's path."""
    if len(call) < 2 or not base or items[:len(base)] != base:  # no call to move under
        return dict(items)
    old, new = base[-1][1][0], call[-1][1][0]
    out = dict(call)
    for key, (path, cls) in items[len(base):]:
        moved = new + path[len(old):] if path.startswith(old) else path
        out[_strip_key(str(key), moved)] = (moved, cls)
    return out


def _user_inputs(program: torch.export.ExportedProgram) -> set[str]:
    from torch.export.graph_signature import InputKind

    return {spec.arg.name for spec in program.graph_signature.input_specs
            if spec.kind == InputKind.USER_INPUT}


def _with_graph_module(program: torch.export.ExportedProgram, gm: torch.fx.GraphModule,
                       lifted: _Lifted) -> torch.export.ExportedProgram:
    """``program`` with another graph module whose outputs may have new names and which may
    read constants lifted from its bodies."""
    import dataclasses

    from torch.export.graph_signature import (ExportGraphSignature, InputKind, InputSpec,
                                              TensorArgument)

    returned = list(gm.graph.output_node().args[0])
    specs = []
    for spec, value in zip(program.graph_signature.output_specs, returned):
        if isinstance(spec.arg, TensorArgument) and isinstance(value, torch.fx.Node):
            spec = dataclasses.replace(spec, arg=TensorArgument(name=value.name))
        specs.append(spec)
    inputs = list(program.graph_signature.input_specs)
    first_user = next((i for i, spec in enumerate(inputs) if spec.kind == InputKind.USER_INPUT),
                      len(inputs))
    inputs[first_user:first_user] = [
        InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), target=target)
        for node, target in zip(lifted.placeholders.values(), lifted.tensors)]
    signature = ExportGraphSignature(inputs, specs)
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=signature, state_dict=program.state_dict,
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph, example_inputs=program.example_inputs,
        constants={**program.constants, **lifted.tensors}, verifiers=program.verifiers)
