"""Build one FX graph and one lazily compiled GraphModule per group, children first.

Each body is written straight into a fresh ``torch.fx.Graph``: placeholders for the group's
inputs, ``get_attr`` for the attributes it holds, its nodes (copied with their meta) and a
``call_module`` per child group, unpacked with ``getitem`` when the child has several
outputs, then an output node. The root also keeps the user inputs, the calling convention,
and writes mutated buffers / inputs back with ``copy_`` as ``ExportedProgram.module()``
does.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Hashable

import torch
from attrs import frozen

from rewrite.backends.fx.compile import code_key
from rewrite.backends.fx.flow import Flow
from rewrite.backends.fx.hierarchy import Hierarchy
from rewrite.backends.fx.layout import Layout
from rewrite.backends.fx.meta import call_meta, getitem_meta, input_meta
from rewrite.backends.fx.module import META_KEY, LoweredModule, new_module
from rewrite.backends.fx.names import identifier, local_name, node_name
from rewrite.backends.fx.source import MODULE, Attribute, FxSource, resolve_attribute
from rewrite.backends.fx.state import register, register_module


def _node(graph: torch.fx.Graph, op: str, target: Any, args: tuple, kwargs: dict, name: str,
          type_expr: Any = None) -> torch.fx.Node:
    """``graph.create_node``, with the arguments assigned after creation.

    ``create_node`` scans the arguments of every call for raw SymInts to warn about; they come
    from a valid graph here, and the scan is a noticeable share (~10% in a profile) of the
    lowering time on large models.
    """
    node = graph.create_node(op, target, name=name, type_expr=type_expr)
    if args:
        node.args = args
    if kwargs:
        node.kwargs = kwargs
    return node


Env = dict[torch.fx.Node, torch.fx.Node]
"""Source node -> the node holding its value in the graph being built."""
Namer = Callable[[str], str]


@frozen
class Built:
    root: LoweredModule
    keys: dict[int, Hashable | None]
    """``id(module)`` -> code key, for every non-root lowered module."""


class _Builder:
    """Turns the plan of every group into modules (one instance per lowering)."""

    def __init__(self, h: Hierarchy, layout: Layout, flow: Flow, source: FxSource):
        self.h, self.layout, self.flow, self.source = h, layout, flow, source
        self.modules: list[torch.nn.Module | None] = [None] * len(h)
        self.keys: dict[int, Hashable | None] = {}
        self.held: set[str] = set()
        """Original names of the attributes some module holds already."""

    def build(self) -> Built:
        for gid in range(len(self.h) - 1, -1, -1):  # pre-order ids: children after parents
            leaf = self.h.leaf[gid]
            if gid and leaf is not None:
                self.modules[gid] = resolve_attribute(self.source.modules, leaf.target).value  # type: ignore[arg-type]
            else:
                self.modules[gid] = self._group_module(gid)
        root = self.modules[0]
        assert isinstance(root, LoweredModule)
        return Built(root, self.keys)

    # -- one group ----------------------------------------------------------------------

    def _group_module(self, gid: int) -> LoweredModule:
        flow, source = self.flow, self.source
        is_root = gid == 0
        graph = torch.fx.Graph()
        env: Env = {}
        children: dict[str, torch.nn.Module] = {}
        attributes: dict[str, Attribute] = {}
        name = (lambda n: n) if is_root else local_name

        if is_root:
            for node in source.inputs:
                new = graph.create_node("placeholder", node.target, node.args, node.kwargs,
                                        name=node.name, type_expr=node.type)
                new.meta = dict(node.meta)
                env[node] = new
        else:
            for value in flow.inputs[gid]:
                attribute = source.attributes.get(value)
                label = node_name(attribute.fqn) if attribute else local_name(value.name)
                new = graph.create_node("placeholder", label, name=label, type_expr=value.type)
                new.target = new.name  # the argument name, once torch.fx made it unique
                new.meta = input_meta(value)
                env[value] = new

        for node in flow.attributes[gid]:
            attribute = source.attributes[node]
            relative = self.layout.relative(gid, attribute.fqn)
            new = graph.create_node("get_attr", relative, name=node_name(relative))
            new.meta = input_meta(node)
            env[node] = new
            attributes[relative] = attribute

        for item in flow.body[gid]:
            if isinstance(item, int):
                self._emit_call(graph, env, item, children, name)
            else:
                self._emit_node(graph, env, gid, item, attributes, name)

        if is_root:
            _root_output(source, graph, env, attributes)
            graph.set_codegen(source.codegen)
        else:
            outputs = tuple(env[o] for o in flow.outputs[gid])
            graph.output(outputs[0] if len(outputs) == 1 else outputs)

        module = new_module(_class_name(self.h, source, gid), _meta(self.h, gid))
        for location, child in children.items():
            register_module(module, location, child)
        for relative, attribute in attributes.items():
            register(module, relative, attribute)
            self.held.add(attribute.fqn)
        if is_root:
            module.meta.update(source.meta)
            for attribute in source.all_attributes:  # the state no graph reads, as in the model
                if attribute.fqn not in self.held:
                    register(module, attribute.fqn, attribute)
        module.graph = graph
        if not is_root:
            self.keys[id(module)] = code_key(graph)
        return module

    def _emit_node(self, graph: torch.fx.Graph, env: Env, gid: int, node: torch.fx.Node,
                   attributes: dict[str, Attribute], name: Namer) -> None:
        """Copy ``node`` (with its meta) into the group's graph."""
        target = node.target
        if node.op == "call_module":
            full = str(target)
            target = (self.layout.relative(gid, full) if self.layout.owns(self.h, gid, full)
                      else full)
            attributes[target] = Attribute(
                full, resolve_attribute(self.source.modules, full).value, MODULE)
        new = _node(
            graph, node.op, target,
            torch.fx.map_arg(node.args, env.__getitem__),
            torch.fx.map_arg(node.kwargs, env.__getitem__),
            name(node.name), node.type,
        )
        new.meta = dict(node.meta)
        env[node] = new

    def _emit_call(self, graph: torch.fx.Graph, env: Env, child: int,
                   children: dict[str, torch.nn.Module], name: Namer) -> None:
        """Call child group ``child``; unpack its outputs with ``getitem`` when several."""
        h, flow = self.h, self.flow
        location = self.layout.location[child]
        children[location] = self.modules[child]  # type: ignore[assignment]
        leaf = h.leaf[child]
        if leaf is not None:  # the original leaf module, called as in the source graph
            new = _node(
                graph, "call_module", location,
                torch.fx.map_arg(leaf.args, env.__getitem__),
                torch.fx.map_arg(leaf.kwargs, env.__getitem__),
                node_name(location), leaf.type,
            )
            new.meta = dict(leaf.meta)
            env[leaf] = new
            return
        outputs = flow.outputs[child]
        meta = call_meta(h.groups[child], h.subtree_nodes(child), outputs)
        call = _node(graph, "call_module", location, tuple([env[v] for v in flow.inputs[child]]),
                     {}, node_name(location))
        call.meta = meta
        if len(outputs) == 1:
            env[outputs[0]] = call
            return
        for i, output in enumerate(outputs):
            item = _node(graph, "call_function", operator.getitem, (call, i), {},
                         name(output.name), output.type)
            item.meta = getitem_meta(meta, output)
            env[output] = item


def _root_output(source: FxSource, graph: torch.fx.Graph, env: Env,
                 attributes: dict[str, Attribute]) -> None:
    """Write mutations back with ``copy_``, then return the user outputs."""
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    for mutation in source.mutations:
        if mutation.user_input is not None:
            target = env[mutation.user_input]
        else:
            target = _root_attribute(source, graph, env, attributes, mutation.buffer)  # type: ignore[arg-type]
        value = env[mutation.value]
        new = graph.create_node("call_function", torch.ops.aten.copy_.default, (target, value),
                                name=node_name(f"copy_{target.name}"))
        new.meta = {k: v for k, v in value.meta.items()
                    if k in ("nn_module_stack", "stack_trace", "val")}
        copies[mutation.value] = new
    result = torch.fx.map_arg(source.outputs, lambda n: copies[n] if n in copies else env[n])
    out = graph.output(result)
    original = source.graph.output_node()
    if "stack_trace" in original.meta:
        out.meta["stack_trace"] = original.meta["stack_trace"]


def _root_attribute(source: FxSource, graph: torch.fx.Graph, env: Env,
                    attributes: dict[str, Attribute], fqn: str) -> torch.fx.Node:
    """The root's ``get_attr`` node for ``fqn``, made if the root does not read it yet."""
    for node, attribute in source.attributes.items():
        if attribute.fqn == fqn and node in env and env[node].graph is graph:
            return env[node]
    known = {a.fqn: a for a in source.all_attributes}
    attributes[fqn] = known[fqn]
    new = graph.get_attr(fqn)
    return new


def _class_name(h: Hierarchy, source: FxSource, gid: int) -> str:
    group = h.groups[gid]
    if gid == 0:
        return source.root_class
    if group.kind == "module" and group.call is not None:
        return group.call.class_name
    return identifier(group.function_name or group.key)


def _meta(h: Hierarchy, gid: int) -> dict[str, Any]:
    group = h.groups[gid]
    info = {
        "group": group.id or "",
        "kind": group.kind,
        "class": group.call.cls if group.call is not None else None,
        "rule": group.origin,
    }
    return {META_KEY: info}


def build_modules(h: Hierarchy, layout: Layout, flow: Flow, source: FxSource) -> Built:
    """The lowered root module and the code keys of its submodules (not compiled yet)."""
    return _Builder(h, layout, flow, source).build()
