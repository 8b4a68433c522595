"""What a group's function is: the function of an earlier repeat, the one whose body key is
equal, or a new one made from the members.

Repeated blocks are matched in graph order first (``outlining._repeats``: cheaper than
keying); otherwise the body in canonical order is keyed (``outlining._body_keys``) and looked
up. A new function takes the members as its body (they leave the main graph), its arguments
as inputs (named by ``outlining._naming``) and its embedded constants as ``Constant`` nodes.
"""

from __future__ import annotations

import onnx_ir as ir
from attrs import frozen

from rewrite.backends.onnx.outlining import _naming as naming
from rewrite.backends.onnx.outlining._body_keys import Key, Keyer
from rewrite.backends.onnx.outlining._boundary import substitute
from rewrite.backends.onnx.outlining._constants import Embedded
from rewrite.backends.onnx.outlining._repeats import Body, Reference, Repeats
from rewrite.grouping import Group


@frozen
class Snapshot:
    """A body outlined for the first time, as :class:`Repeats` will match later repeats."""

    body: Body
    """``Repeats.snapshot`` of the body."""
    args: list[ir.Value]
    """Its arguments and outputs in member order (before the canonical order)."""
    outputs: list[ir.Value]

    def reference(self, function: ir.Function, member_order: list[int],
                  args: list[ir.Value], outputs: list[ir.Value]) -> Reference:
        """The :class:`Reference` to ``function``, made from this body in these orders."""
        arg_index = {v: i for i, v in enumerate(self.args)}
        output_index = {v: i for i, v in enumerate(self.outputs)}
        return Reference(self.body, function, member_order, [arg_index[v] for v in args],
                         [output_index[v] for v in outputs])


class Functions:
    """The functions outlining made, by body key and as references for repeats."""

    def __init__(self, model: ir.Model, keyer: Keyer, position: dict[ir.Node, tuple]
                 ) -> None:
        self.model = model
        self.keyer = keyer
        self.position = position
        self.names = naming.FunctionNames(((f.domain, f.name) for f in model.functions.values()),
                                          functions=True)
        self.by_key: dict[Key, ir.Function] = {}
        self.repeats = Repeats(keyer)
        self.made: list[ir.Function] = []
        """The functions made, in the order they were made."""

    def repeat(self, identity: tuple[str, str], members: list[ir.Node], args: list[ir.Value],
               constants: dict[ir.Value, Key], outputs: list[ir.Value]) -> Reference | None:
        """The earlier body (graph order) that this one repeats, if any."""
        return self.repeats.find(identity, members, args, constants, outputs)

    def snapshot(self, identity: tuple[str, str], members: list[ir.Node],
                 args: list[ir.Value], constants: dict[ir.Value, Key],
                 outputs: list[ir.Value]) -> Snapshot:
        """This body as later repeats will be compared with it (before it is outlined)."""
        return Snapshot(self.repeats.snapshot(identity, members, args, constants, outputs),
                        args, outputs)

    def remember(self, snapshot: Snapshot, function: ir.Function, member_order: list[int],
                 args: list[ir.Value], outputs: list[ir.Value]) -> None:
        """Later repeats of ``snapshot``'s body call ``function``, in these orders."""
        self.repeats.add(snapshot.reference(function, member_order, args, outputs))

    def keyed(self, key: Key) -> ir.Function | None:
        """The function whose body has this key, if one was made."""
        return self.by_key.get(key)

    def new_name(self, group: Group) -> str:
        """A free name for a new function of ``group`` (suffixed for variants)."""
        return self.names.new(group.domain, group.function_name)

    def make(self, group: Group, name: str, key: Key, members: list[ir.Node],
             args: list[ir.Value], embedded: dict[ir.Value, Embedded],
             outputs: list[ir.Value]) -> ir.Function:
        """A new function whose body is ``members`` (moved out of the main graph)."""
        internal = {v.name for node in members for v in node.outputs}
        internal.update(constant.name for constant in embedded.values())
        names = naming.input_names(args, group, internal)
        params = [ir.Value(name=n, type=v.type, shape=v.shape) for n, v in zip(names, args)]
        mapping: dict[ir.Value, ir.Value] = dict(zip(args, params))
        constant_nodes = []
        for value, constant in embedded.items():
            node = constant.make_node()
            mapping[value] = node.outputs[0]
            constant_nodes.append(node)
        self.model.graph.remove(members)
        for node in members:
            substitute(node, mapping)
        body = ir.Graph(params, outputs, name=name,
                        nodes=constant_nodes + sorted(members, key=self.position.__getitem__))
        body.sort()
        function = ir.Function(group.domain, name, graph=body, attributes=())
        self.model.functions[function.identifier()] = function
        self.made.append(function)
        self.by_key[key] = function
        return function
