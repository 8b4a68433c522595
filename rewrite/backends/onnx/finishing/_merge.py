"""Merge functions of one group identity whose bodies are equal, or equal up to scalars.

Outlining gives one function per distinct body; optimizing can make distinct bodies equal
(a no-op folded away), and bodies may differ only in a scalar setting (a LayerNorm ``eps``, a
residual scale, a rope theta). ``finishing.finish`` merges scalar variants before optimizing
(the optimizer would fold a scale of 1.0 away in one block only, and keep it apart), and
everything again after. Both kinds are merged here, innermost functions first (a
function comes after the functions it calls in ``model.functions``), and calls retargeted:

* equal bodies (structural keys, see ``outlining._body_keys``) always share one function;
* under the ``attribute`` and ``input`` constant policies (not ``embed``), bodies that differ
  only in *scalars* share one
  function whose body reads a function attribute (``ref_attr_name``) where they differ, each
  call giving its value, as ``export_modules_as_functions`` did. Scalars are float
  attributes of an op (``LayerNormalization.epsilon``, ``Gemm.alpha``), the value of a
  ``Constant`` node holding one floating-point element, and attributes of calls of functions
  that already read one. Only the values that differ between the merged bodies are lifted;
  an attribute is named after what it sets (``epsilon``; ``mul``, ``add``: the op reading
  the constant), with ``_1``, ``_2`` for more of the same name.

Afterwards the suffixes of one identity are renumbered without gaps (``Name``, ``Name_1``, ...
in the order the functions were made, i.e. of their first call in the graph).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping

import onnx_ir as ir
from attrs import frozen

from rewrite._shared.onnx_ir_nodes import model_nodes
from rewrite.backends.onnx.distinct import Variants
from rewrite.backends.onnx.summary import FunctionId
from rewrite.backends.onnx.outlining import (
    FunctionNames,
    Key,
    Keyer,
    NodeKey,
    Refs,
    canonical_order,
    function_name,
)

_GRAPHS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}


def is_scalar(node: ir.Node, attr: ir.Attr, functions: Mapping[FunctionId, ir.Function]) -> bool:
    """Whether ``attr`` of ``node`` is a scalar that may become a function attribute."""
    if attr.is_ref():
        return False
    if (node.domain, node.op_type, node.overload) in functions:
        return True  # a call passing a value its callee lifted
    if attr.type == ir.AttributeType.FLOAT:
        return True
    return (node.op_type == "Constant" and node.domain == "" and attr.name == "value"
            and attr.type == ir.AttributeType.TENSOR and attr.value.size == 1
            and attr.value.dtype in _FLOATS)


class _ScalarBlindKeyer(Keyer):
    """Keys that see a scalar's kind (and a tensor's dtype and shape), not its value."""

    def __init__(self, functions: Mapping[FunctionId, ir.Function]) -> None:
        super().__init__()
        self.functions = functions
        self.exact = Keyer()
        """Keys a subgraph (a Scan's body) as it is: no scalar in it is lifted."""

    def node(self, node: ir.Node, refs: Refs, depth: int = 0) -> NodeKey:
        key = super().node(node, refs, depth)
        if not node.attributes:
            return key
        return key._replace(attributes=tuple(self._attributes(node, refs, depth)))

    def attribute_labels(self, node: ir.Node) -> list[str]:
        return [f"{name}={key!r}" for name, key in self._attributes(node, {}, 0)]

    def _attributes(self, node: ir.Node, refs: Refs, depth: int) -> list[tuple[str, Key]]:
        keys = []
        for name, attr in sorted(node.attributes.items()):
            if attr.type in _GRAPHS:
                keys.append((name, self.exact.attribute(attr, refs, depth)))
            elif not is_scalar(node, attr, self.functions):
                keys.append((name, self.attribute(attr, refs, depth)))
            elif attr.type == ir.AttributeType.TENSOR:
                keys.append((name, ("scalar", str(attr.value.dtype), tuple(attr.value.shape))))
            else:
                keys.append((name, ("scalar", attr.type.name)))
        return keys


@frozen
class _Canonical:
    """A body in canonical order, with its inputs and outputs in the order of that body."""

    nodes: list[ir.Node]
    inputs: list[ir.Value]
    outputs: list[ir.Value]

    @classmethod
    def of(cls, keyer: Keyer, function: ir.Function) -> "_Canonical":
        nodes = list(function)
        ordered = canonical_order(keyer, nodes, {n: (i,) for i, n in enumerate(nodes)},
                                        lambda value: None)
        params = set(function.inputs)
        inputs: dict[ir.Value, None] = {}
        for node in ordered:
            inputs.update((v, None) for v in node.inputs if v in params)
        inputs.update((v, None) for v in function.inputs)  # unused ones last
        rank = {node: i for i, node in enumerate(ordered)}
        arg_rank = {v: i for i, v in enumerate(inputs)}

        def place(value: ir.Value) -> tuple:
            producer = value.producer()
            if producer in rank:
                return (0, rank[producer], value.index())
            return (1, arg_rank.get(value, -1), 0)

        return cls(ordered, list(inputs), sorted(function.outputs, key=place))

    def permutation(self, function: ir.Function, kept: "_Canonical", kept_function: ir.Function
                    ) -> tuple[list[int], list[int]]:
        """For each input and output of ``kept_function``, the index of the matching input or
        output of ``function`` (whose canonical form is ``self``)."""
        inputs = [list(function.inputs).index(self.inputs[kept.inputs.index(v)])
                  for v in kept_function.inputs]
        outputs = [list(function.outputs).index(self.outputs[kept.outputs.index(v)])
                   for v in kept_function.outputs]
        return inputs, outputs


def merge_functions(model: ir.Model, identity: Mapping[FunctionId, tuple[str, str]], *,
                    lift_scalars: bool, variants: Variants | None = None
                    ) -> dict[FunctionId, FunctionId]:
    """Merge as the module docstring says; returns, for each function merged or renamed
    (suffixes renumbered), the function that now stands for it.

    ``identity`` maps each function made by outlining to its group's domain and base name;
    functions of other identities, or of the input model, are never merged. ``variants``
    hears of each body kept apart, with its key (see ``distinct``)."""
    functions = model.functions
    keyer = _ScalarBlindKeyer(functions) if lift_scalars else Keyer()
    kept_by_key: dict[Key, FunctionId] = {}
    classes: dict[FunctionId, list[FunctionId]] = defaultdict(list)
    canonical: dict[FunctionId, _Canonical] = {}
    merged: dict[FunctionId, _Merge] = {}
    for fid, function in list(functions.items()):
        group = identity.get(fid)
        if group is None:
            continue
        _retarget(function.graph, merged, {})
        form = canonical[fid] = _Canonical.of(keyer, function)
        key = keyer.body(group, form.nodes, form.inputs, {}, form.outputs)
        kept = kept_by_key.setdefault(key, fid)
        classes[kept].append(fid)
        if kept == fid and variants is not None:
            variants.add(group, fid, key, form.nodes, form.inputs)
        if kept != fid:
            order = form.permutation(function, canonical[kept], functions[kept])
            merged[fid] = _Merge(kept, *order)
    values: dict[FunctionId, dict[str, ir.Attr]] = {}
    for kept, members in classes.items():
        for fid in members:  # calls inside: their callees' lifted values are known now
            _retarget(functions[fid].graph, merged, values)
        if len(members) > 1 and lift_scalars:
            _lift(functions[kept], [canonical[f].nodes for f in members], members, values)
    for fid, function in functions.items():
        if fid not in merged:
            _retarget(function.graph, merged, values)
    _retarget(model.graph, merged, values)
    for fid in merged:
        del functions[fid]
    result = {fid: m.kept for fid, m in merged.items()}
    if merged:
        renamed = _renumber(model, identity)
        result = {fid: renamed.get(kept, kept) for fid, kept in result.items()}
        result.update(renamed)
    _forget_origins(model)
    return result


def _forget_origins(model: ir.Model) -> None:
    """No call keeps the function it called before this merge (``_ORIGIN``): in a later
    merge its first callee is the one it calls then (renumbering gives an old id to another
    function: Beam's layers 3 and 4, merged in the second pass, got no attribute values)."""
    for node in model_nodes(model):
        node.meta.pop(_ORIGIN, None)


def merge_keys(model: ir.Model, identity: Mapping[FunctionId, tuple[str, str]], *,
               lift_scalars: bool) -> dict[FunctionId, Key]:
    """The body key :func:`merge_functions` compares, of each function of ``identity`` the
    model has (for checking that no two are left equal)."""
    functions = model.functions
    keyer = _ScalarBlindKeyer(functions) if lift_scalars else Keyer()
    keys = {}
    for fid, group in identity.items():
        if fid in functions:
            form = _Canonical.of(keyer, functions[fid])
            keys[fid] = keyer.body(group, form.nodes, form.inputs, {}, form.outputs)
    return keys


def _renumber(model: ir.Model, identity: Mapping[FunctionId, tuple[str, str]]
              ) -> dict[FunctionId, FunctionId]:
    """Close the gaps merging left in the suffixes of one identity (``Name``, ``Name_2`` ->
    ``Name``, ``Name_1``), in the order the functions were made; returns old -> new ids."""
    functions = model.functions
    taken = {(domain, name) for domain, name, _ in functions}
    made: dict[tuple[str, str], list[FunctionId]] = defaultdict(list)
    for fid in functions:
        if fid in identity:
            made[identity[fid]].append(fid)
    renamed: dict[FunctionId, FunctionId] = {}
    for (domain, base), fids in made.items():
        for k, fid in enumerate(fids):
            name = function_name(base, k)
            if fid[1] == name or (domain, name) in taken:
                continue
            taken.discard((domain, fid[1]))
            taken.add((domain, name))
            renamed[fid] = (domain, name, fid[2])
    if renamed:
        moves = {fid: _Merge(new, [], []) for fid, new in renamed.items()}
        for graph in [model.graph, *(f.graph for f in functions.values())]:
            _retarget(graph, moves, {})
        ordered = list(functions.items())  # a callee stays before its callers
        functions.clear()
        for fid, function in ordered:
            if fid in renamed:
                function.name = renamed[fid][1]
            functions[renamed.get(fid, fid)] = function
    return renamed


@frozen
class _Merge:
    """A merged function: the function kept, and where its calls' inputs and outputs go."""

    kept: FunctionId
    inputs: list[int]
    """For each input of the kept function, the index of the merged one's input."""
    outputs: list[int]


def _lift(function: ir.Function, bodies: list[list[ir.Node]], members: list[FunctionId],
          values: dict[FunctionId, dict[str, ir.Attr]]) -> None:
    """Turn the scalars where ``bodies`` differ into attributes of ``function`` (the first)."""
    first = bodies[0]
    exact = Keyer()  # what "the same value" means: the structural keys' attribute keys
    names = FunctionNames()  # attribute names get _1, _2 like function names
    declared: list[ir.Attr] = []
    for j, node in enumerate(first):
        for attr_name, attr in list(node.attributes.items()):
            if attr.type in _GRAPHS:
                continue  # the same (keyed with the values they capture): never lifted
            seen = [body[j].attributes[attr_name] for body in bodies]
            key = exact.attribute(attr, {}, 0)
            if all(exact.attribute(a, {}, 0) == key for a in seen):
                continue
            name = names.new("", _attribute_name(node, attr_name))
            call_value = [_call_form(node, a, name) for a in seen]
            kind = call_value[0].type
            if node.op_type == "Constant" and node.domain == "" and kind != attr.type:
                del node.attributes[attr_name]  # value -> value_float: same scalar, by kind
                attr_name = "value_float"
            node.attributes[attr_name] = ir.RefAttr(attr_name, name, kind)
            declared.append(ir.Attr(name, kind, None))
            for fid, value in zip(members, call_value):
                values.setdefault(fid, {})[name] = value
    if declared:
        function.attributes.update({a.name: a for a in declared})


def _call_form(node: ir.Node, attr: ir.Attr, name: str) -> ir.Attr:
    """The value a call passes for ``attr``: a float for a rank-0 float32 constant."""
    if node.op_type == "Constant" and attr.type == ir.AttributeType.TENSOR:
        tensor = attr.value
        if tensor.dtype == ir.DataType.FLOAT and tensor.shape.rank() == 0:
            return ir.Attr(name, ir.AttributeType.FLOAT, float(tensor.numpy()))
    return ir.Attr(name, attr.type, attr.value)


def _attribute_name(node: ir.Node, attr_name: str) -> str:
    if node.op_type == "Constant" and node.domain == "":
        readers = [use.node.op_type.lower() for use in node.outputs[0].uses()]
        return readers[0] if len(set(readers)) == 1 else "value"
    return attr_name


_ORIGIN = "rewrite.called"
"""``Node.meta`` key: the function a retargeted call called before merging."""


def _retarget(graph: ir.Graph, merged: Mapping[FunctionId, _Merge],
              values: Mapping[FunctionId, Mapping[str, ir.Attr]]) -> None:
    """Calls of merged functions call the kept one (inputs and outputs in its order); each
    call passes the values lifted for the function it called first (a value already passed
    stays)."""
    for node in list(ir.traversal.RecursiveGraphIterator(graph)):
        current = (node.domain, node.op_type, node.overload)
        origin = node.meta.get(_ORIGIN, current)
        merge = merged.get(current)
        if merge is not None:
            node = _recall(node, merge)
            node.meta[_ORIGIN] = origin
        passed = values.get(origin)
        if passed:
            for name, attr in passed.items():
                if name not in node.attributes:
                    node.attributes[name] = ir.Attr(name, attr.type, attr.value)


def _recall(node: ir.Node, merge: _Merge) -> ir.Node:
    """``node`` calling ``merge.kept``: the same node, or a new one where the kept function
    takes its inputs or returns its outputs in another order."""
    domain, name, overload = merge.kept
    if merge.inputs == sorted(merge.inputs) and merge.outputs == sorted(merge.outputs):
        # the same order (or a renaming: no orders given)
        node.domain, node.op_type, node.overload = domain, name, overload
        return node
    outputs = [node.outputs[i] for i in merge.outputs]
    results = [ir.Value(name=v.name, type=v.type, shape=v.shape) for v in outputs]
    call = ir.Node(domain, name, [node.inputs[i] for i in merge.inputs],
                   list(node.attributes.values()), overload=overload, outputs=results,
                   name=node.name, metadata_props=dict(node.metadata_props))
    call.meta.update(node.meta)
    graph = node.graph
    graph.insert_after(node, call)
    for old, new in zip(outputs, results):
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
    graph.remove(node)
    return call
