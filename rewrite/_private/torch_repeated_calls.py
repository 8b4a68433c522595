"""A program of a model's first layers extended to all of its layers, each further layer one
more call of a traced layer body, made in the program without tracing (private: the
``invoke_subgraph`` op's node layout, export's node metadata, signature and module call
graph; checked against the torch versions of :data:`rewrite._private.CHECKED_WITH`).

torch.export's cost grows with every layer even when a layer's call is only recorded (each
layer's weights and cache inputs made fake, their symbolic sizes reasoned about: ~50 ms per
layer). :func:`extended` takes the program of the model cut to its first layers (each layer
one ``invoke_subgraph`` call) and adds, for each further layer, the nodes a trace would have
made: its weights and cache as new inputs, a copy of the call of the traced layer of its
kind (its ``template``), fed the previous layer's outputs where the template is fed its
previous layer's, a copy of what the template's inputs go through before the first layer (a
hybrid's convolution state is copied) and the same shared values (mask, rotary tables)
otherwise; the layers' cache outputs join the program's outputs, and what followed the last
layer reads the new last layer. A program it cannot extend so raises :class:`Unavailable`
(the caller then traces or records every layer's call).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Mapping, Sequence

import torch
import torch.utils._pytree as pytree
from attrs import frozen

from rewrite._private.errors import Unavailable
from rewrite._private.torch_programs import fake_like
from rewrite._private.torch_recording import recordable

_STACK = "nn_module_stack"
_HOP = getattr(getattr(torch.ops, "higher_order", None), "invoke_subgraph", None)


@frozen
class Extension:
    """What :func:`extended` needs besides the program of the first layers."""

    path: str
    """The layer list's module path (``model.layers``)."""
    templates: tuple[int, ...]
    """Per layer of the whole model, the traced layer whose call it copies (a layer of the
    program: itself)."""
    args: tuple
    """The whole model's example inputs; a further layer's inputs are the leaves of its item
    in the list at :attr:`states_at` (after every other input)."""
    states_at: int | None
    """The position in :attr:`args` of the per-layer list of states (the cache), or None."""
    tensors: Mapping[str, torch.Tensor]
    """The whole model's parameters and buffers by name."""


def extended(program: torch.export.ExportedProgram, extension: Extension
             ) -> torch.export.ExportedProgram:
    """``program`` (the first layers) with every layer of ``extension`` (module docstring).
    The program's graph module is changed in place."""
    gm = program.graph_module
    calls = _calls(gm.graph, extension.path)
    traced = len(calls)
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
    builder = _Builder(gm.graph, extension, specs, calls)
    tail = _tail_users(calls[-1])
    for index in range(traced, len(extension.templates)):
        builder.add_layer(index)
    last = builder.calls[-1]
    for user, old in tail:
        user.replace_input_with(old, _getitem(last, old.args[1]))
    output_specs = _extend_outputs(builder, program.graph_signature.output_specs, traced)
    gm.recompile()
    return _program(program, gm, builder, output_specs, traced)


def _calls(graph: torch.fx.Graph, path: str) -> list[torch.fx.Node]:
    """The program's layer calls in layer order: one ``invoke_subgraph`` call per layer."""
    found: dict[int, torch.fx.Node] = {}
    for node in graph.find_nodes(op="call_function", target=_HOP):
        last = list(node.meta.get(_STACK, {}).values())[-1:]
        where = last[0][0] if last else ""
        if not where.startswith(f"{path}.") or not where[len(path) + 1:].isdigit():
            raise Unavailable(f"a traced call is not a layer's ({where or 'no module'})")
        found.setdefault(int(where[len(path) + 1:]), node)
    if sorted(found) != list(range(len(found))) or len(found) < 2:
        raise Unavailable("the traced program does not call its layers one by one")
    calls = [found[k] for k in range(len(found))]
    for call in calls:
        if any(user.target is not operator.getitem for user in call.users):
            raise Unavailable("a layer call's outputs are not read one by one")
    return calls


def _tail_users(call: torch.fx.Node) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """What reads the last traced layer's outputs after it (the final norm...), not the
    program's outputs: (user, the getitem it reads)."""
    return [(user, item) for item in call.users for user in item.users if user.op != "output"]


def _getitem(call: torch.fx.Node, index: int) -> torch.fx.Node:
    for item in call.users:
        if item.args[1] == index:
            return item
    raise Unavailable(f"a layer call's output {index} is not read")


def _moved(meta: Mapping[str, Any], old: str, new: str) -> dict[str, Any]:
    """A node's metadata for another layer: its module stack's entries under layer ``old``'s
    path moved to ``new``'s (keys and paths), the rest shared."""
    meta = dict(meta)
    stack = meta.get(_STACK)
    if stack:
        moved = {}
        for key, (path, cls) in stack.items():
            if path == old or path.startswith(f"{old}."):
                path = new + path[len(old):]
                key = key.replace(old, new)
            moved[key] = (path, cls)
        meta[_STACK] = moved
    meta.pop("eager_input_vals", None)
    return meta


def inputs_apart(program: torch.export.ExportedProgram) -> None:
    """Each input of ``program`` with a value of its own, in place: :func:`extended` gives a
    further layer's weights their template's fake tensors where only recorded calls read
    them, and torch's re-traces (``run_decompositions``) bind inputs by their fake tensors,
    so that every layer sharing one would compute with the last one's weights."""
    seen: set[int] = set()
    for node in program.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and id(value) in seen:
            node.meta["val"] = _fresh(value)
        seen.add(id(node.meta.get("val")))


def _fresh(value: Any) -> Any:
    """A node value of its own: fake tensors made anew with the same sizes."""
    if isinstance(value, torch.Tensor):
        return fake_like(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_fresh(v) for v in value)
    return value


class _Builder:
    """Adds the further layers' inputs, calls and output reads to a graph, and their specs."""

    def __init__(self, graph: torch.fx.Graph, extension: Extension,
                 specs: Mapping[str, Any], calls: list[torch.fx.Node]) -> None:
        self.graph, self.extension, self.specs = graph, extension, dict(specs)
        self.calls = list(calls)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.last = {kind: self._last_of(placeholders, kind) for kind in ("PARAMETER", "BUFFER")}
        self.last["USER_INPUT"] = placeholders[-1]
        users = [n for n in placeholders if self.specs[n.name].kind.name == "USER_INPUT"]
        self.states = _States(extension, users, len(calls))
        self.shared = _before(graph, calls[0])
        self.new_specs: dict[str, Any] = {}
        """The further layers' input specs by input name."""
        self.weights: dict[str, torch.fx.Node] = {}
        """The further layers' weight inputs by name."""

    def _last_of(self, placeholders: list[torch.fx.Node], kind: str) -> torch.fx.Node | None:
        prefix = f"{self.extension.path}."
        found = None
        for node in placeholders:
            spec = self.specs[node.name]
            if spec.kind.name == kind and str(spec.target).startswith(prefix):
                found = node
        return found

    def add_layer(self, index: int) -> None:
        """Layer ``index``'s inputs, call and output reads, after the previous layer's."""
        template = self.extension.templates[index]
        if not 1 <= template < len(self.states.traced_inputs):
            raise Unavailable(f"layer {index} has no traced layer of its kind after another")
        call = self.calls[template]
        path = self.extension.path
        layer = _Layer(index, f"{path}.{template}", f"{path}.{index}",
                       self.calls[template - 1], _last_read(self.calls[index - 1]))
        layer.states = dict(zip(self.states.traced_inputs[template],
                                self._state_inputs(index, template)))
        operands = [self._operand(o, layer) for o in call.args[2:]]
        with self.graph.inserting_after(layer.at):
            attr = self.graph.get_attr(call.args[0].target)
        attr.meta = _moved(call.args[0].meta, layer.old, layer.new)
        with self.graph.inserting_after(attr):
            made = self.graph.call_function(call.target, (attr, call.args[1], *operands))
        made.meta = _moved(call.meta, layer.old, layer.new)  # its value the template's: the
        value = made.meta["val"]  # decomposition gives a recorded call's outputs their own
        previous = made
        for item in sorted(call.users, key=lambda n: n.args[1]):
            with self.graph.inserting_after(previous):
                previous = self.graph.call_function(operator.getitem, (made, item.args[1]))
            previous.meta = _moved(item.meta, layer.old, layer.new)
            previous.meta["val"] = value[item.args[1]] if isinstance(value, tuple) else None
        self.calls.append(made)

    def _operand(self, operand: Any, layer: "_Layer") -> Any:
        """What ``layer`` is fed where its template is fed ``operand``: its own input, the
        previous layer's output, a copy of what is computed from its template's inputs
        before the first layer (a state's copy), or the shared value itself."""
        if not isinstance(operand, torch.fx.Node):
            return operand
        if operand in layer.states:
            return layer.states[operand]
        if operand in layer.copies:
            return layer.copies[operand]
        if operand.op == "placeholder":
            spec = self.specs[operand.name]
            if spec.kind.name in ("PARAMETER", "BUFFER") and str(spec.target).startswith(
                    f"{layer.old}."):
                return self._weight(operand, spec, layer.new + spec.target[len(layer.old):])
            return operand  # shared: an input of the model, a weight outside the layers
        if operand.target is operator.getitem and operand.args[0] is layer.before:
            return _getitem(self.calls[layer.index - 1], operand.args[1])
        if operand not in self.shared:
            raise Unavailable(f"a layer call reads {operand.name}, computed between the "
                              "layers")
        if not self._reads_template(operand, layer):
            return operand  # computed before the first layer: the mask, rotary tables
        with self.graph.inserting_after(layer.at):
            copy = self.graph.node_copy(operand, lambda a: self._operand(a, layer))
        copy.meta = _moved(operand.meta, layer.old, layer.new)
        layer.copies[operand] = layer.at = copy
        return copy

    def _reads_template(self, node: torch.fx.Node, layer: "_Layer") -> bool:
        """Whether ``node`` (before the first layer) is computed from an input of ``layer``'s
        template: its state or its weights."""
        memo = layer.reads
        if node not in memo:
            if node.op == "placeholder":
                spec = self.specs[node.name]
                memo[node] = node in layer.states or str(spec.target).startswith(
                    f"{layer.old}.")
            else:
                memo[node] = any(self._reads_template(n, layer) for n in node.all_input_nodes)
        return memo[node]

    def _weight(self, like: torch.fx.Node, spec: Any, target: str) -> torch.fx.Node:
        """The input of weight ``target`` (made once), placed after the layers' weights."""
        name = _name(like.name, str(spec.target), target)
        if name in self.weights:
            return self.weights[name]
        if target not in self.extension.tensors:
            raise Unavailable(f"the model has no {target}")
        node = self._input(like, spec.kind.name, name)
        self.new_specs[node.name] = dataclasses.replace(
            spec, arg=dataclasses.replace(spec.arg, name=node.name), target=target)
        self.weights[name] = node
        return node

    def _input(self, like: torch.fx.Node, kind: str, name: str) -> torch.fx.Node:
        """An input placed after the last of its kind, valued as ``like``: the same fake
        tensor where only recordable calls read it (:func:`recordable`: the decomposition
        defers such inputs, never traces them; a fake tensor costs ~1 ms), else a copy."""
        after = self.last[kind]
        if after is None:
            raise Unavailable(f"a further layer has a {kind.lower()} the traced ones lack")
        with self.graph.inserting_after(after):
            node = self.graph.placeholder(name)
        node.meta = dict(like.meta)
        if not all(user.target is _HOP and recordable(user) for user in like.users):
            node.meta["val"] = _fresh(like.meta.get("val"))
        self.last[kind] = node
        return node

    def _state_inputs(self, index: int, template: int) -> list[torch.fx.Node]:
        """Layer ``index``'s state inputs (its cache), in its template's order."""
        made = []
        for like in self.states.traced_inputs[template]:
            node = self._input(like, "USER_INPUT", _renumbered(like.name, template, index))
            self.new_specs[node.name] = dataclasses.replace(
                self.specs[like.name], arg=dataclasses.replace(self.specs[like.name].arg,
                                                               name=node.name))
            made.append(node)
        return made


def _extend_outputs(builder: _Builder, specs: Sequence[Any], traced: int) -> list[Any]:
    """The program's outputs with the added layers' (after the last traced layer's, each
    layer's in its template's order); their specs returned."""
    graph, calls, templates = builder.graph, builder.calls, builder.extension.templates
    output = graph.output_node()
    values, specs = list(output.args[0]), list(specs)
    mine = [k for k, v in enumerate(values) if _reads(v, calls[traced - 1])]
    at = mine[-1] + 1 if mine else None
    for index in range(traced, len(calls)):
        template = calls[templates[index]]
        read = [k for k, v in enumerate(values) if _reads(v, template)]
        if read and at is None:
            raise Unavailable("a layer's outputs are not after the last traced one's")
        for k in read:
            item = _getitem(calls[index], values[k].args[1])
            values.insert(at, item)
            specs.insert(at, dataclasses.replace(
                specs[k], arg=dataclasses.replace(specs[k].arg, name=item.name)))
            at += 1
    output.args = (tuple(values),)
    return specs


class _Layer:
    """An added layer while its nodes are made: its index, its and its template's module
    paths, the template's previous call, where the next node goes, its state inputs by the
    template's, the copies made for it and what reads its template's inputs."""

    def __init__(self, index: int, old: str, new: str, before: torch.fx.Node,
                 at: torch.fx.Node) -> None:
        self.index, self.old, self.new = index, old, new
        self.before, self.at = before, at
        self.states: dict[torch.fx.Node, torch.fx.Node] = {}
        self.copies: dict[torch.fx.Node, torch.fx.Node] = {}
        self.reads: dict[torch.fx.Node, bool] = {}


class _States:
    """Which program inputs are each traced layer's state (its cache): the leaves of its item
    of the states list of the example inputs (:attr:`Extension.states_at`)."""

    def __init__(self, extension: Extension, users: list[torch.fx.Node], traced: int) -> None:
        leaves = pytree.tree_flatten_with_path(extension.args)[0]
        at = extension.states_at
        layer = [_layer_of(path, at) for path, _ in leaves]
        kept = [k for k, n in enumerate(layer) if n is None or n < traced]
        if len(kept) != len(users) or kept != list(range(len(kept))):
            raise Unavailable("the further layers' states are not the example's last inputs")
        self.traced_inputs: list[list[torch.fx.Node]] = [[] for _ in range(traced)]
        for k in kept:
            if layer[k] is not None:
                self.traced_inputs[layer[k]].append(users[k])


def _layer_of(path: tuple, at: int | None) -> int | None:
    """The layer whose state an input leaf at ``path`` is, or None."""
    if at is None or len(path) < 2 or getattr(path[0], "idx", None) != at:
        return None
    return getattr(path[1], "idx", None)


def _before(graph: torch.fx.Graph, first: torch.fx.Node) -> set[torch.fx.Node]:
    """The nodes before ``first``: what every layer may share."""
    found = set()
    for node in graph.nodes:
        if node is first:
            break
        found.add(node)
    return found


def _last_read(call: torch.fx.Node) -> torch.fx.Node:
    """The last of the reads of a call's outputs that follow it."""
    node = call
    while node.next.target is operator.getitem and node.next.args[0] is call:
        node = node.next
    return node


def _reads(value: Any, call: torch.fx.Node) -> bool:
    return isinstance(value, torch.fx.Node) and value.target is operator.getitem \
        and value.args[0] is call


def _name(like: str, old_target: str, new_target: str) -> str:
    """A weight input's name as torch names them (``p_model_layers_3_mlp_up_proj_weight``)."""
    old, new = old_target.replace(".", "_"), new_target.replace(".", "_")
    return like.replace(old, new) if old in like else f"{like}_{new}"


def _renumbered(name: str, old: int, new: int) -> str:
    """A state input's name for layer ``new`` (``past_key_values_3_0``)."""
    marker = f"_{old}_"
    if marker in name:
        head, _, tail = name.rpartition(marker)
        return f"{head}_{new}_{tail}"
    return f"{name}_{new}"


def _program(program: torch.export.ExportedProgram, gm: torch.fx.GraphModule,
             builder: _Builder, output_specs: list[Any], traced: int
             ) -> torch.export.ExportedProgram:
    """The extended program: its signature, weights, specs and module call graph."""
    from torch.export.graph_signature import ExportGraphSignature

    extension = builder.extension
    specs = {**builder.specs, **builder.new_specs}
    inputs = [specs[n.name] for n in gm.graph.nodes if n.op == "placeholder"]
    state_dict, constants = dict(program.state_dict), dict(program.constants)
    for spec in builder.new_specs.values():
        if spec.kind.name in ("PARAMETER", "BUFFER"):
            into = constants if spec.persistent is False else state_dict
            into[spec.target] = extension.tensors[spec.target]
    in_spec = pytree.tree_flatten((extension.args, {}))[1]
    out_spec = _out_spec(program, gm, traced, builder, output_specs)
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=ExportGraphSignature(inputs, output_specs),
        state_dict=state_dict, range_constraints=program.range_constraints,
        module_call_graph=_call_graph(program, extension, traced, in_spec, out_spec),
        example_inputs=(extension.args, {}), constants=constants,
        verifiers=program.verifiers)


def _out_spec(program: torch.export.ExportedProgram, gm: torch.fx.GraphModule, traced: int,
              builder: _Builder, specs: list[Any]) -> Any:
    """The extended program's output structure: the program's, its list of the traced
    layers' outputs (the cache) grown to every layer."""
    values = list(gm.graph.output_node().args[0])
    users = [v for v, s in zip(values, specs) if s.kind.name == "USER_OUTPUT"]
    calls = builder.calls
    new = {id(v) for v in users if any(_reads(v, c) for c in calls[traced:])}
    old = [v for v in users if id(v) not in new]
    structure = pytree.tree_unflatten(old, program.call_spec.out_spec)
    if new:
        structure = _grown(structure, calls, traced, builder.extension.templates)
    leaves, spec = pytree.tree_flatten(structure)
    if [id(v) for v in leaves] != [id(v) for v in users]:
        raise Unavailable("the model's outputs are not its layers' outputs in order")
    return spec


def _grown(structure: Any, calls: list[torch.fx.Node], traced: int,
           templates: Sequence[int]) -> Any:
    """``structure`` with its list of the traced layers' outputs grown to every layer."""
    def per_layer(value: Any) -> bool:
        return isinstance(value, list) and len(value) == traced and all(
            all(_reads(leaf, calls[k]) for leaf in pytree.tree_leaves(item))
            for k, item in enumerate(value))

    if per_layer(structure):
        grown = list(structure)
        for index in range(traced, len(calls)):
            item = structure[templates[index]]
            leaves, spec = pytree.tree_flatten(item)
            grown.append(pytree.tree_unflatten(
                [_getitem(calls[index], leaf.args[1]) for leaf in leaves], spec))
        return grown
    if isinstance(structure, (tuple, list)):
        return type(structure)(_grown(v, calls, traced, templates) for v in structure)
    return structure


def _call_graph(program: torch.export.ExportedProgram, extension: Extension, traced: int,
                in_spec: Any, out_spec: Any) -> list[Any]:
    """The module call graph with the further layers' modules (as their templates') after the
    traced layers', the root's signature taking and returning every layer's."""
    entries = list(program.module_call_graph)
    path = extension.path
    inside = [k for k, e in enumerate(entries) if e.fqn.startswith(f"{path}.")]
    added = []
    for index in range(traced, len(extension.templates)):
        old, new = f"{path}.{extension.templates[index]}", f"{path}.{index}"
        added += [dataclasses.replace(e, fqn=new + e.fqn[len(old):]) for e in entries
                  if e.fqn == old or e.fqn.startswith(f"{old}.")]
    at = inside[-1] + 1 if inside else len(entries)
    entries[at:at] = added
    for k, entry in enumerate(entries):
        if entry.fqn == "" and entry.signature is not None:
            entries[k] = dataclasses.replace(entry, signature=dataclasses.replace(
                entry.signature, in_spec=in_spec, out_spec=out_spec))
    return entries
