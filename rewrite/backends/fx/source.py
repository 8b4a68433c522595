"""What the FX backend needs to know about the model it lowers, read once.

An :class:`FxSource` describes the flat graph independently of where it came from:

* an ``ExportedProgram``: lifted parameters, buffers, constants and script objects are
  placeholders named by the graph signature; they become :class:`Attribute` values
  (parameters shared with the program, buffers and tensor constants the module's own
  detached copies: running it leaves the program unchanged). User
  inputs stay placeholders, mutated buffers / user inputs are outputs that the lowered module
  writes back with ``copy_`` (as ``ExportedProgram.module()`` does), and the calling
  convention comes from the program's ``in_spec`` / ``out_spec``;
* a ``GraphModule`` (``symbolic_trace``, ``ep.module()``...): ``get_attr`` targets are the
  attributes, every placeholder is an input, and the graph's own code generator is kept.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from attrs import field, frozen
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.graph import CodeGen

from rewrite._private.torch_programs import codegen_of, pytree_codegen
from rewrite.errors import InputError

PARAMETER, BUFFER, CONSTANT, MODULE = "parameter", "buffer", "constant", "module"


@frozen
class Attribute:
    """A value the lowered modules hold as an attribute (a parameter, buffer, constant...)."""

    fqn: str
    """Where the original model holds it: ``h.0.attn.c_attn.weight``."""
    value: Any = field(eq=False, repr=False)
    kind: str
    """``parameter``, ``buffer``, ``constant`` (tensor constant or script object) or ``module``."""
    persistent: bool = True
    """For buffers: whether it belongs in ``state_dict()``."""


@frozen
class Mutation:
    """A value the graph computes for a buffer or a user input, written back in place."""

    value: torch.fx.Node
    """The node holding the new value."""
    buffer: str | None
    """Target attribute FQN (buffer / parameter mutation), or None for a user input."""
    user_input: torch.fx.Node | None
    """The mutated user-input placeholder, or None for a buffer."""


@frozen
class FxSource:
    """The flat FX graph to lower, with its attributes and calling convention."""

    graph: torch.fx.Graph = field(repr=False)
    attributes: Mapping[torch.fx.Node, Attribute] = field(repr=False)
    """Nodes that stand for attributes (lifted placeholders, ``get_attr`` nodes)."""
    all_attributes: tuple[Attribute, ...] = field(repr=False)
    """Every attribute the result should hold, used or not (the whole state of a program)."""
    inputs: tuple[torch.fx.Node, ...] = field(repr=False)
    """User-input placeholders, in signature order."""
    outputs: Any = field(repr=False)
    """The output node's argument with mutation outputs removed (nodes inside)."""
    mutations: tuple[Mutation, ...] = field(repr=False)
    codegen: CodeGen = field(repr=False)
    root_class: str
    """Class name for the lowered root module (``GPT2Model``)."""
    meta: Mapping[str, Any] = field(repr=False)
    modules: torch.nn.Module = field(repr=False)
    """Where ``call_module`` targets live (the source GraphModule)."""


def read_source(model: Any, root_class: str | None) -> FxSource:
    """The :class:`FxSource` of an ExportedProgram or GraphModule."""
    if isinstance(model, torch.export.ExportedProgram):
        return _from_program(model, root_class)
    if isinstance(model, torch.fx.GraphModule):
        return _from_graph_module(model, root_class)
    raise InputError(
        f"FX output needs a PyTorch model (ExportedProgram, .pt2 or GraphModule), "
        f"not {type(model).__name__}; use .onnx output for ONNX models"
    )


def _short(cls: str | None, default: str) -> str:
    if not cls:
        return default
    name = cls.rsplit(".", 1)[-1]
    return name if name.isidentifier() else default


def resolve_attribute(root: torch.nn.Module, target: str) -> Attribute:
    """The attribute ``target`` of ``root``, with its kind (parameter, buffer...)."""
    *path, leaf = target.split(".")
    owner = root
    try:
        for part in path:
            owner = getattr(owner, part)
        value = getattr(owner, leaf)
    except AttributeError:
        raise InputError(f"the graph reads attribute {target!r}, "
                         "which the module does not have") from None
    if leaf in getattr(owner, "_parameters", {}):
        return Attribute(target, value, PARAMETER)
    if leaf in getattr(owner, "_buffers", {}):
        persistent = leaf not in getattr(owner, "_non_persistent_buffers_set", set())
        return Attribute(target, value, BUFFER, persistent)
    if isinstance(value, torch.nn.Module):
        return Attribute(target, value, MODULE)
    return Attribute(target, value, CONSTANT)


def _from_graph_module(gm: torch.fx.GraphModule, root_class: str | None) -> FxSource:
    graph = gm.graph
    attributes = {
        node: resolve_attribute(gm, node.target)  # type: ignore[arg-type]
        for node in graph.nodes
        if node.op == "get_attr"
    }
    inputs = tuple(n for n in graph.nodes if n.op == "placeholder")
    output = graph.output_node()
    name = type(gm).__name__
    if name == "GraphModuleImpl" or not name.isidentifier():
        name = "GraphModule"
    return FxSource(
        graph=graph,
        attributes=attributes,
        all_attributes=(),
        inputs=inputs,
        outputs=output.args[0] if output.args else None,
        mutations=(),
        codegen=codegen_of(graph),
        root_class=_short(root_class, name) if name == "GraphModule" else name,
        meta=dict(gm.meta),
        modules=gm,
    )


_LIFTED = {
    InputKind.PARAMETER: PARAMETER,
    InputKind.BUFFER: BUFFER,
    InputKind.CONSTANT_TENSOR: CONSTANT,
    InputKind.CUSTOM_OBJ: CONSTANT,
}
_MUTATIONS = (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION,
              OutputKind.USER_INPUT_MUTATION)
_USER_OUTPUTS = (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)


def _program_attributes(program: torch.export.ExportedProgram) -> dict[str, Attribute]:
    """Parameters as the program holds them; buffers and tensor constants as the lowered
    module's own copies (see :func:`own_state`)."""
    signature = program.graph_signature
    state, constants = program.state_dict, program.constants
    non_persistent = set(signature.non_persistent_buffers)
    copies = own_state([state.get(n, constants.get(n)) for n in signature.buffers]
                       + list(constants.values()))
    found: dict[str, Attribute] = {}
    for name in signature.parameters:
        found[name] = Attribute(name, state[name], PARAMETER)
    for name in signature.buffers:
        if name in non_persistent:
            found[name] = Attribute(name, copies[id(constants[name])], BUFFER, persistent=False)
        else:
            found[name] = Attribute(name, copies[id(state[name])], BUFFER)
    for name in signature.lifted_tensor_constants:
        found[name] = Attribute(name, copies[id(constants[name])], CONSTANT)
    for name in signature.lifted_custom_objs:
        found[name] = Attribute(name, constants[name], CONSTANT)
    for name, value in constants.items():  # aliases of a lifted constant, as module() has
        if name not in found:
            found[name] = Attribute(name, copies[id(value)], CONSTANT)
    return found


def own_state(values: list[Any]) -> dict[int, Any]:
    """Per ``id`` of each tensor, a detached copy the lowered module owns.

    A program's buffers and constants are mutated in place by programs with state (a KV
    cache ``index_copy_``), and may be views that require grad; running the lowered module
    must change neither the program nor fail on them. So, like ``ExportedProgram.module()``
    (which detaches constants that require grad), they are detached, and copied so that the
    program stays as it was. Tensors that share storage keep sharing it (copied once, each
    view made again at its offset and strides), so a write through one is seen through all.
    """
    storages: dict[int, torch.UntypedStorage] = {}
    out: dict[int, Any] = {}
    for value in values:
        if id(value) in out or not isinstance(value, torch.Tensor):
            out.setdefault(id(value), value)
            continue
        tensor = value.detach()
        try:
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if not key or type(tensor) is not torch.Tensor:
                raise RuntimeError("no shared storage to keep")
            if key not in storages:
                storages[key] = storage.clone()
            copy = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
            copy.set_(storages[key], tensor.storage_offset(), tensor.size(), tensor.stride())
        except (RuntimeError, NotImplementedError, TypeError):  # subclasses, fake tensors...
            copy = tensor.clone()
        out[id(value)] = copy
    return out


def _codegen(program: torch.export.ExportedProgram) -> CodeGen:
    in_spec, out_spec = program.call_spec.in_spec, program.call_spec.out_spec
    signature = program.module_call_graph[0].signature if program.module_call_graph else None
    names = list(signature.forward_arg_names or []) if signature else []
    if not names:
        args, kwargs = in_spec.child(0), in_spec.child(1)
        names = [f"arg_{i}" for i in range(args.num_children)] + list(kwargs.context)
    return pytree_codegen(names, in_spec, out_spec)


def _from_program(program: torch.export.ExportedProgram, root_class: str | None) -> FxSource:
    signature = program.graph_signature
    graph = program.graph_module.graph
    by_name = {node.name: node for node in graph.nodes}
    known = _program_attributes(program)
    attributes: dict[torch.fx.Node, Attribute] = {}
    inputs: list[torch.fx.Node] = []
    for spec in signature.input_specs:
        node = by_name[spec.arg.name]
        if spec.kind == InputKind.USER_INPUT:
            inputs.append(node)
        elif spec.kind in _LIFTED:
            attributes[node] = known[spec.target]
        else:
            raise InputError(
                f"cannot lower a program with {spec.kind.name} inputs to FX (input {node.name}); "
                "re-export it without side-effect tokens"
            )
    for node in graph.nodes:
        if node.op == "get_attr":  # submodules of higher-order ops, rare constants
            attributes[node] = resolve_attribute(program.graph_module, node.target)  # type: ignore[arg-type]

    output = graph.output_node()
    returned = list(output.args[0])
    user: list[Any] = []
    mutations: list[Mutation] = []
    for spec, value in zip(signature.output_specs, returned):
        if spec.kind in _USER_OUTPUTS:
            user.append(value)
        elif spec.kind in _MUTATIONS:
            if spec.kind == OutputKind.USER_INPUT_MUTATION:
                mutations.append(Mutation(value, None, by_name[spec.target]))
            else:
                mutations.append(Mutation(value, spec.target, None))
        else:
            raise InputError(
                f"cannot lower a program with {spec.kind.name} outputs to FX; export the "
                "inference graph (no gradients)"
            )
    return FxSource(
        graph=graph,
        attributes=attributes,
        all_attributes=tuple(known.values()),
        inputs=tuple(inputs),
        outputs=tuple(user),
        mutations=tuple(mutations),
        codegen=_codegen(program),
        root_class=_short(root_class, "GraphModule"),
        meta=dict(program.graph_module.meta),
        modules=program.graph_module,
    )
