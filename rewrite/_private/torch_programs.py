"""The private torch APIs of programs and graph modules: the FX side and ``.pt2`` loading,
each with a fallback.

Checked against the torch versions of :data:`rewrite._private.CHECKED_WITH` (the layer's one
table). When a torch release moves or drops one of them, the fallback keeps ``rewrite``
working, slower or with a plainer result, instead of failing to import:

* ``torch.fx._lazy_graph_module._LazyGraphModule``: lowered FX modules compile their code
  once per distinct body (:mod:`rewrite.backends.fx.compile`). Fallback: plain
  ``GraphModule`` (compiles each module when built; same modules, slower).
* ``torch.fx._lazy_graph_module._use_lazy_graph_module``: the graph modules torch makes
  while the per-body lowering decomposes are lazy, their code generated on first use, not
  at each pass's recompile (:func:`lazy_graph_modules`). Fallback: eager (same modules).
* ``torch.export.exported_program._create_graph_module_for_export``: while a ``.pt2``
  loads, it makes lazy graph modules (:func:`lazy_program_graph_modules`; the loader made
  each graph's code twice, and rewrite reads graphs). Fallback: eager (same modules).
* ``torch._higher_order_ops.passes.inline_invoke_subgraph.inline_invoke_subgraph_nodes``
  (2.10+): each ``invoke_subgraph`` call replaced by its body's nodes, its submodules (a
  scan's body) hoisted (:mod:`rewrite.frontends.fx.regions`). Fallback: the same copy made
  here.
* ``torch.fx.graph._PyTreeCodeGen`` / ``_PyTreeInfo``: the lowered GraphModule takes the
  program's (nested) arguments like ``ExportedProgram.module()``. Fallback: the default
  code generation (flat positional arguments).
* ``Graph._codegen``: the code generation of a GraphModule given to ``rewrite``. Fallback:
  the default one.
* ``torch._ops.OpOverload`` / ``OpOverloadPacket``: an FX node's target printed as
  ``aten.mm.default``. Fallback: recognised by class name.
* ``torch._export.serde.serialize._dict_to_dataclass`` (with ``schema`` and ``union``:
  ``_Union``, ``_UnionTag``): while a ``.pt2`` loads, the JSON is decoded by a decoder that
  inspects each schema type once, not once per value (:func:`fast_pt2_decoding`,
  :mod:`rewrite._private._pt2_decode`; ~45% of ``torch.export.load``'s CPU time on the 48-block
  GPT-2). Same program; used only on the torch versions of ``CHECKED_WITH`` (it copies
  torch's decoding); fallback: torch's decoder.
* ``torch._export.serde.serialize`` (``_bytes_to_dataclass``, ``ExportedProgramDeserializer``,
  ``_SERIALIZE_TO_TORCH_DTYPE``) and ``schema.ExportedProgram``: a ``.pt2``'s program is
  deserialized around weights that rewrite made as views of the file
  (:func:`deserialize_program`, :mod:`rewrite.frontends.pt2.program`), instead of
  ``torch.export.load`` copying each out of the zip and unpickling sample inputs with a
  full-pickle fallback. Fallback (:class:`Unavailable`): ``torch.export.load`` once rewrite's
  own checks found nothing that needs pickle (same program, weights copied into memory).
* ``torch._C._pickle_load_obj``: a TorchBind object of a ``.pt2`` the user trusts
  (``--trust-model``), read as ``torch.export.load`` reads it (:func:`load_torchbind`).
  Fallback: none (an error naming the object: such a file then needs torch.export.load).

Texts torch prints are parsed in two places, each falling back to the plain message when the
text changes: :mod:`rewrite.frontends.pt2.program` (``torch.export.load``'s reasons) and
:mod:`rewrite.backends.onnx.lowering._torch_failure` (``torch.onnx.export``'s step and causes).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from rewrite._private import CHECKED_WITH as CHECKED_VERSIONS
from rewrite._private.errors import Unavailable
from rewrite._private._pt2_decode import SchemaDecoder
from rewrite._private._swap import swapped

CHECKED_WITH = CHECKED_VERSIONS["torch"]
"""torch versions these private APIs were checked against (the layer's one table)."""

try:
    from torch.fx._lazy_graph_module import _LazyGraphModule as LazyGraphModule
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
except ImportError:  # pragma: no cover - not in the checked versions
    LazyGraphModule = torch.fx.GraphModule  # type: ignore[misc, assignment]
    _use_lazy_graph_module = None

try:
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
except ImportError:  # pragma: no cover - not in the checked versions
    _PyTreeCodeGen = _PyTreeInfo = None  # type: ignore[assignment, misc]

_OP_TYPES: tuple[type, ...] = tuple(
    t for t in (getattr(getattr(torch, "_ops", None), n, None)
                for n in ("OpOverload", "OpOverloadPacket")) if isinstance(t, type)
)


def lazy_graph_modules() -> contextlib.AbstractContextManager:
    """Graph modules torch makes inside generate their code when first run or read, not when
    made or recompiled (torch's lazy graph modules). Fallback: when made (same modules)."""
    if _use_lazy_graph_module is None:  # pragma: no cover - not in the checked versions
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


@contextlib.contextmanager
def lazy_program_graph_modules() -> Iterator[None]:
    """While in this context, the graph modules torch makes for exported programs
    (``exported_program._create_graph_module_for_export``: twice per graph while a ``.pt2``
    loads) are lazy: their code is generated on first use, not when made. Fallback: eager."""
    try:
        from torch.export import exported_program
    except ImportError:  # pragma: no cover - not in the checked versions
        yield
        return
    if LazyGraphModule is torch.fx.GraphModule:  # pragma: no cover - not in the checked versions
        yield
        return
    with swapped(exported_program, "_create_graph_module_for_export", LazyGraphModule):
        yield


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


def inline_invoke_subgraph_nodes(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> None:
    """Replace each ``invoke_subgraph`` node of ``gm`` in ``nodes`` by its body's nodes, the
    body's submodules registered on ``gm``: torch's
    ``_higher_order_ops.passes.inline_invoke_subgraph`` (2.10+). Fallback (torch 2.9): the
    same copy."""
    try:
        from torch._higher_order_ops.passes.inline_invoke_subgraph import (
            inline_invoke_subgraph_nodes as inline)
    except ImportError:
        inline = _inline_invoke_subgraph_nodes
    inline(gm, nodes)


def _inline_invoke_subgraph_nodes(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> None:
    import operator

    for node in nodes:
        getter, operands = node.args[0], node.args[2:]
        body = getattr(gm, str(getter.target))
        names = _hoisted(gm, body)
        env = dict(zip(body.graph.find_nodes(op="placeholder"), operands))
        with gm.graph.inserting_before(node):
            for inner in body.graph.nodes:
                if inner.op not in ("placeholder", "output"):
                    env[inner] = gm.graph.node_copy(inner, lambda n: env[n])
                    if inner.op == "get_attr" and inner.target in names:
                        env[inner].target = names[inner.target]
        outputs = body.graph.output_node().args[0]
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(env[outputs[user.args[1]]])
                gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        if not getter.users:
            gm.graph.erase_node(getter)


def _hoisted(gm: torch.fx.GraphModule, body: torch.fx.GraphModule) -> dict[str, str]:
    """``body``'s submodules (a scan's body...) registered on ``gm`` under names of their
    own, as torch 2.10+ hoists them: their names in ``body`` -> in ``gm``."""
    names: dict[str, str] = {}
    taken = {name for name, _ in gm.named_children()}
    for name, module in body.named_children():
        new, k = name, 0
        while new in taken:
            new, k = f"{name}_{k}", k + 1
        gm.add_module(new, module)
        taken.add(new)
        names[name] = new
    return names


def fake_like(value: torch.Tensor) -> torch.Tensor:
    """A fake tensor of ``value``'s sizes, strides and dtype, in ``value``'s fake mode, made
    outside any trace (a value of its own for a node that would share one)."""
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with disable_proxy_modes_tracing(), value.fake_mode:  # type: ignore[attr-defined]
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                   device=value.device)


def codegen_of(graph: torch.fx.Graph) -> torch.fx.graph.CodeGen:
    """The code generation ``graph`` uses."""
    return getattr(graph, "_codegen", None) or torch.fx.graph.CodeGen()


def is_op_overload(target: Any) -> bool:
    """True for ``torch.ops.ns.op.overload`` (and ``torch.ops.ns.op``) targets."""
    if _OP_TYPES:
        return isinstance(target, _OP_TYPES)
    return type(target).__name__ in ("OpOverload", "OpOverloadPacket")  # pragma: no cover


@contextlib.contextmanager
def fast_pt2_decoding() -> Iterator[None]:
    """While in this context, ``torch.export.load`` decodes the program's JSON with a
    :class:`rewrite._private._pt2_decode.SchemaDecoder` (torch's ``_dict_to_dataclass`` inspects the
    target type again for every value; the decoder once per type; same program)."""
    try:
        from torch._export.serde import schema, serialize, union
    except ImportError:  # pragma: no cover - not in the checked versions
        yield
        return
    if torch.__version__.split("+")[0] not in CHECKED_WITH:  # pragma: no cover
        yield  # the decoder copies torch's decoding: only where it was checked against it
        return
    with swapped(serialize, "_dict_to_dataclass", SchemaDecoder(schema, union)):
        yield


def _serde() -> tuple[Any, Any]:
    """torch's serialization module and schema, or :class:`Unavailable`."""
    try:
        from torch._export.serde import schema, serialize
    except ImportError as e:  # pragma: no cover - not in the checked versions
        raise Unavailable(f"torch._export.serde: {e}") from e
    needed = ("_bytes_to_dataclass", "ExportedProgramDeserializer", "_SERIALIZE_TO_TORCH_DTYPE")
    missing = [name for name in needed if not hasattr(serialize, name)]
    if missing or not hasattr(schema, "ExportedProgram"):  # pragma: no cover
        raise Unavailable(f"torch._export.serde.serialize has no {', '.join(missing)}")
    return serialize, schema


def pt2_dtype(code: int) -> torch.dtype:
    """The dtype of a ``.pt2`` tensor's ``dtype`` code (``schema.ScalarType``)."""
    serialize, schema = _serde()
    try:
        return serialize._SERIALIZE_TO_TORCH_DTYPE[schema.ScalarType(code)]
    except (ValueError, KeyError) as e:
        raise ValueError(f"unknown dtype code {code!r}") from e


def deserialize_program(program_json: bytes, state_dict: dict[str, Any],
                        constants: dict[str, Any], example_inputs: Any
                        ) -> torch.export.ExportedProgram:
    """The ``ExportedProgram`` of a ``.pt2``'s ``models/<name>.json`` around the given
    tensors (used as given: views of the file stay views). torch's errors propagate."""
    serialize, schema = _serde()
    with fast_pt2_decoding(), lazy_program_graph_modules():
        serialized = serialize._bytes_to_dataclass(schema.ExportedProgram, program_json)
        return serialize.ExportedProgramDeserializer(None).deserialize(
            serialized, state_dict, constants, example_inputs)


def load_torchbind(data: bytes) -> Any:
    """A TorchBind object of a ``.pt2`` (only for a file the user trusts: it runs code)."""
    load = getattr(torch._C, "_pickle_load_obj", None)
    if load is None:  # pragma: no cover - not in the checked versions
        raise Unavailable("torch._C._pickle_load_obj is missing")
    return load(data)
