"""Blockwise int4 weights in a lowered model, one function per layer class kept.

:func:`quantize_int4` (and :class:`QuantizeInt4`, the same as an onnx_ir pass) rewrites,
in the main graph and in every function body, each ``MatMul`` whose weight operand is a
2-D float weight (``MatMul(x, W)``, or ``MatMul(x, Transpose(W))``: a Linear's ``[out,
in]`` weight) into ``MatMul(x, DequantizeLinear(q, scale[, zero_point], axis=0,
block_size=B))`` (opset 21). The weight is found where it arrives
(:mod:`rewrite.backends.onnx.weight_slots`):

- in the main graph, an initializer (the lm_head's); its other uses (a tied embedding's
  ``Gather``) keep the float initializer, which stays only for them;
- in a function, one of its inputs, when every use of that input is such a weight operand
  (or is passed on to a function whose input is one), and either every call is in the main
  graph and passes a 2-D float initializer (an *entry*: the decoder layer) or every call is
  in a function and passes an input of it that is quantized (*inner*: the attention or MLP
  inside the layer). An entry takes ``q`` in that input's place and ``scale`` (and
  ``zero_point``) as new inputs at its end, every call passing the main graph's quantized
  initializers, and dequantizes: before the MatMul when the MatMul is in its own body,
  else before the call that passes the weight on (onnxruntime 1.32 refuses a 4-bit value
  passed from a function to another, and has no 4-bit ``Identity``); an inner input then
  receives the float ``[K, N]`` weight (its ``Transpose`` goes). Either way one body
  serves every layer of its class, and once onnxruntime inlines the functions the
  ``DequantizeLinear`` feeds the ``MatMul`` directly.
- a plain ``Gemm`` (GPT-2's Conv1D) whose B is such a weight becomes ``MatMul`` + ``Add``.
- an embedding's table (an initializer named in ``tables``, its row length a multiple of
  the block), where a ``Gather`` reads its rows (in the main graph, or in a function every
  call of which is in the main graph): its 4-bit values two to a byte (uint8: ONNX's
  ``Gather`` takes no 4-bit type, and a whole table dequantized at each step would cost
  0.4 s on a 128K x 2K table) and its scales by rows; the ``Gather`` takes the rows asked
  for of each, which alone are unpacked and dequantized with standard ops
  (:func:`_gather`). A tied head reads its own ``[K, N]`` int4 copy: a
  ``DequantizeLinear`` + ``MatMul`` (which onnxruntime fuses) cannot read the rows' uint8;
  with ``target="onnxruntime"`` (symmetric) it reads the table's rows instead, as
  ``com.microsoft.MatMulNBits`` (their layout is its ``B``'s): one table, as the builder's.

The quantized tensors are stored ``[K, N]`` (in, out), blocks along K (axis 0): what
onnxruntime fuses with the ``MatMul`` into ``MatMulNBits`` after it inlines the functions
(:mod:`_blockwise` computes them when they are written, one weight at a time). A float
initializer no use reads any more is dropped. What is quantized and what is not is
returned as :class:`Quantized`. :class:`Kept` (the quantized weights kept when written),
:func:`fake_quantized` and :func:`as_float32` are for an eager reference of the same weights.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Any, Callable, Collection, Mapping

import numpy as np
import onnx_ir as ir
from attrs import frozen

from rewrite.backends.onnx._blockwise import (
    Blockwise, Kept, as_float32, fake_quantized, made, weight_values)
from rewrite.backends.onnx.packed import Stacked
from rewrite.backends.onnx.weight_slots import (
    FLOATS, Container, FunctionId, Slot, call_sites, callee, is_weight, use_layout,
    weight_slots, weight_use)

OPSET = 21
"""The first opset of ``DequantizeLinear`` with ``block_size`` and of int4 / uint4."""
ACCURACY_LEVEL = 4
"""A ``MatMulNBits``'s: int8 activations, as the builder's CPU int4 and onnxruntime's own
fusion of ``DequantizeLinear`` + ``MatMul`` (its session's default). At 0 (float32) a 1.24B
model's tied head cost 10% of a decode step. The check before publishing runs the file at 0
(:func:`rewrite.exporting.verify.open_session`): float32's tolerance against eager."""


@frozen
class Quantized:
    """What :func:`quantize_int4` did."""

    weights: int
    """Main-graph initializers quantized."""
    in_functions: dict[str, int]
    """Function name -> MatMuls of its body that now dequantize their weight."""
    in_main: int
    """MatMuls of the main graph that now dequantize their weight (the lm_head)."""
    kept_float: tuple[str, ...]
    """Float initializers still in the model with more than one dimension (embeddings)."""
    block: int
    symmetric: bool
    layouts: tuple[tuple[str, str], ...] = ()
    """(initializer, layout) of each weight quantized: ``"NK"``, a Linear's ``[out, in]``
    weight (blocks along its second dimension); ``"KN"``, ``[in, out]``; ``"rows"``, an
    embedding's table gathered by rows (blocks along its second dimension)."""
    shared: int = 0
    """Of ``in_main``, the tied heads that read their table's rows (``MatMulNBits``)."""

    def note(self) -> str:
        kind = "int4, symmetric" if self.symmetric else "uint4 with zero points"
        bodies = ", ".join(f"{name} {n}" for name, n in sorted(self.in_functions.items()))
        kept = ", ".join(self.kept_float) or "none"
        tables = ", ".join(name for name, layout in self.layouts if layout == "rows")
        shared = f" ({self.shared} a head's MatMulNBits on its table)" if self.shared else ""
        return (f"int4 ({kind}, blocks of {self.block}, round to nearest): {self.weights} "
                f"weights; MatMuls dequantizing in functions: {bodies or 'none'}; in the "
                f"main graph: {self.in_main}{shared}; embeddings gathered in 4 bits: "
                f"{tables or 'none'}; kept in float: {kept}")


class QuantizeInt4(ir.passes.InPlacePass):
    """:func:`quantize_int4` as an onnx_ir pass."""

    def __init__(self, block: int = 32, symmetric: bool = True) -> None:
        super().__init__()
        self.block, self.symmetric = block, symmetric
        self.result: Quantized | None = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.result = quantize_int4(model, block=self.block, symmetric=self.symmetric)
        return ir.passes.PassResult(model, modified=self.result.weights > 0)


def quantize_int4(model: ir.Model, *, block: int = 32, symmetric: bool = True,
                  sources: Mapping[str, Any] | None = None, kept: Kept | None = None,
                  tables: Collection[str] = (), target: str = "onnx") -> Quantized:
    """Quantize ``model``'s MatMul weights in place (see the module); what was done.
    ``sources``: initializer name -> the tensor its quantized parts are computed from (or
    a function making it when it is written), instead of the initializer's value (a
    half-precision weight behind a float32 placeholder); ``kept``: where the quantized
    weights are also kept, keyed ``name:layout`` (an embedding's under ``"NK"``: the same
    numbers as a tied head's); ``tables``: the initializers that are embeddings' tables,
    quantized where a ``Gather`` reads their rows; ``target``: ``"onnx"`` (standard ops) or
    ``"onnxruntime"`` (a tied head reads its table's rows with ``MatMulNBits``)."""
    functions = {f.identifier(): f for f in model.functions.values()}
    calls, opaque = call_sites(model, functions)
    fits = partial(_fits, frozenset(tables), block)
    slots = weight_slots(model, functions, calls, opaque, fits)
    rewriter = _Rewriter(model, functions, slots, calls, (block, symmetric), fits)
    rewriter.nbits = target == "onnxruntime" and symmetric
    rewriter.initializers.sources, rewriter.initializers.kept = sources or {}, kept
    rewriter.run()
    rewriter.initializers.register_trailing()
    if rewriter.initializers.created:
        _raise_opsets(model)
    made = {v.name for values in rewriter.initializers.created.values() for v in values}
    kept = tuple(sorted(
        name for name, v in model.graph.initializers.items()
        if name not in made and v.const_value is not None
        and v.const_value.dtype in FLOATS and len(v.const_value.shape) >= 2))
    return Quantized(len(rewriter.initializers.created), dict(rewriter.in_functions),
                     rewriter.in_main, kept, block, symmetric,
                     tuple(sorted(rewriter.initializers.created)), rewriter.shared)


def _as_matmul(container: "ir.Graph | ir.Function", node: ir.Node) -> ir.Node:
    """A plain ``Gemm`` as ``MatMul`` (and ``Add`` of its C): onnxruntime fuses
    ``DequantizeLinear`` with a ``MatMul`` only; another node as it is."""
    if node.op_type != "Gemm":
        return node
    a, b, *rest = node.inputs
    matmul = ir.node("MatMul", [a, b])
    new = [matmul]
    if rest and rest[0] is not None:
        new.append(ir.node("Add", [matmul.outputs[0], rest[0]]))
    new[-1].outputs[0].type, new[-1].outputs[0].shape = node.outputs[0].type, \
        node.outputs[0].shape
    container.insert_before(node, new)
    ir.convenience.replace_all_uses_with(node.outputs[0], new[-1].outputs[0])
    container.remove(node, safe=True)
    return matmul


def _fits(tables: frozenset[str], block: int, value: ir.Value | None, layout: str) -> bool:
    """``value`` is a weight that may be quantized for a use of ``layout``: an embedding's
    table only if named in ``tables``, its rows whole blocks."""
    if not is_weight(value) or value is None:
        return False
    shape = value.const_value.shape if value.const_value is not None else (0, 0)
    return layout != "rows" or (value.name in tables and shape[1] % block == 0)


Sources = dict[ir.Value, tuple[tuple[ir.Value, ...], str]]
"""A function's entry inputs: old input -> (its q, scale[, zero point] inputs, layout)."""


class _Initializers:
    """The quantized initializers of main-graph weights, made once per weight and layout."""

    def __init__(self, model: ir.Model, block: int, symmetric: bool) -> None:
        self.model, self.block, self.symmetric = model, block, symmetric
        self.created: dict[tuple[str, str], tuple[ir.Value, ...]] = {}
        self.sources: Mapping[str, Any] = {}
        self.kept: Kept | None = None
        self.trailing: list[ir.Value] = []
        """The scales and zero points, registered after every ``q``
        (:meth:`register_trailing`)."""

    def register_trailing(self) -> None:
        """The scales and zero points made, as initializers after the weights: the weights
        are written in the initializers' order by concurrent writers, and a weight's parts
        are made at once, so that a writer given a weight's scale while another quantizes it
        would wait (each scale is kept until written: 0.125 bytes per value)."""
        for value in self.trailing:
            self.model.graph.register_initializer(value)
        self.trailing.clear()

    def of(self, value: ir.Value, layout: str) -> tuple[ir.Value, ...]:
        """``(q, scale[, zero point])`` of the weight ``value`` read as ``layout``."""
        key = (value.name or "", layout)
        if key in self.created:
            return self.created[key]
        tensor = value.const_value
        if tensor is None:
            raise ValueError(f"{value.name}: a weight without a value cannot be quantized")
        name = {"NK": value.name, "KN": f"{value.name}_KN"}.get(layout, f"{value.name}_rows")
        source = self.sources.get(key[0])
        kept_as = "NK" if layout == "rows" else layout  # the same numbers
        kept = None if self.kept is None else (self.kept, f"{key[0]}:{kept_as}")
        stacked = isinstance(source, Stacked) and source.axis == 0  # parts of its rows
        parts = Blockwise(partial(weight_values, tensor, source),
                          tuple(tensor.shape), transposed=layout != "KN", block=self.block,
                          symmetric=self.symmetric, scale_dtype=tensor.dtype, name=name,
                          kept=kept, rows=layout == "rows",
                          parts=source.parts if stacked else None)
        values = []
        for part in (parts.q, parts.scale, parts.zero_point):
            if part is None:
                continue
            new = ir.Value(name=part.name, shape=part.shape, type=ir.TensorType(part.dtype),
                           const_value=part)
            if part is parts.q:
                self.model.graph.register_initializer(new)
            else:
                self.trailing.append(new)
            values.append(new)
        self.created[key] = tuple(values)
        return self.created[key]


class _Rewriter:
    """The rewrite of every container, given the slots to quantize."""

    def __init__(self, model: ir.Model, functions: dict[FunctionId, ir.Function],
                 slots: dict[Slot, str], calls: dict, scheme: tuple[int, bool],
                 fits: Callable[[ir.Value | None, str], bool]) -> None:
        """``scheme``: the block and whether symmetric; ``fits``: :func:`_fits`."""
        self.model, self.functions, self.slots, self.fits = model, functions, slots, fits
        block, symmetric = self.block, self.symmetric = scheme
        self.entries = {slot for slot in slots
                        if all(isinstance(c, ir.Graph) for c, _ in calls[slot[0]])}
        self.initializers = _Initializers(model, block, symmetric)
        self.in_functions: Counter[str] = Counter()
        self.in_main, self.shared, self.nbits = 0, 0, False  # nbits: see _reads_rows

    def run(self) -> None:
        sources = {fid: self._new_signature(fid, f) for fid, f in self.functions.items()}
        self._rewrite(self.model.graph, None, set())
        for fid, function in self.functions.items():
            inner = {function.inputs[i]: layout for (f, i), layout in self.slots.items()
                     if f == fid and (f, i) not in self.entries}
            self._rewrite(function, sources[fid], inner)
        graph = self.model.graph
        for name, value in list(graph.initializers.items()):
            if any(key[0] == name for key in self.initializers.created) \
                    and not list(value.uses()):
                del graph.initializers[name]

    def _new_signature(self, fid: FunctionId, function: ir.Function) -> Sources:
        """An entry input becomes ``q`` in place, its scale (and zero point) at the end,
        in input order."""
        found: Sources = {}
        extra: list[ir.Value] = []
        for index, old in enumerate(list(function.inputs)):
            if (fid, index) not in self.entries:
                continue
            rows = self.slots[(fid, index)] == "rows"
            four = ir.DataType.INT4 if self.symmetric else ir.DataType.UINT4
            q = ir.Value(name=f"{old.name}_Q4G{self.block}",
                         type=ir.TensorType(ir.DataType.UINT8 if rows else four))
            new = [q, ir.Value(name=f"{old.name}_scale", type=old.type)]
            if not self.symmetric:
                new.append(ir.Value(name=f"{old.name}_zp", type=ir.TensorType(
                    ir.DataType.UINT8 if rows else ir.DataType.UINT4)))
            function.inputs[index] = q
            extra.extend(new[1:])
            found[old] = (tuple(new), self.slots[(fid, index)])
        function.inputs.extend(extra)
        return found

    def _rewrite(self, container: Container, sources: Sources | None,
                 inner: dict[ir.Value, str]) -> None:
        """Each weight use of ``container``; ``sources``: a function's entry inputs (None:
        the main graph, whose weights are initializers); ``inner``: its inner inputs."""
        passed: dict[ir.Value, ir.Value] = {}
        for node in list(container):
            if node.graph is None:  # removed: a MatMul made MatMulNBits
                continue
            called = callee(node)
            if called in self.functions:
                self._call(container, node, called, sources, passed)
                continue
            for index, value in enumerate(node.inputs):
                layout = weight_use(node, index) if value is not None else None
                if layout is None or value is None:
                    continue
                if sources is None and layout == "NK" and self._reads_rows(value):
                    self._nbits(container, node, value)
                    continue
                if value in inner or self._source(value, layout, sources) is not None:
                    node = _as_matmul(container, node)
                if value in inner:
                    if layout == "NK":  # it arrives as [K, N] already
                        ir.convenience.replace_all_uses_with(node.outputs[0], value)
                        container.remove(node, safe=True)
                    continue
                triple = self._source(value, layout, sources)
                if triple is not None and layout == "rows":
                    _gather(container, node, triple, self.block)
                elif triple is not None:
                    self._dequantize(container, node, triple, layout)

    def _source(self, value: ir.Value, layout: str, sources: Sources | None
                ) -> tuple[ir.Value, ...] | None:
        if sources is not None:
            found = sources.get(value)
            return found[0] if found is not None and found[1] == layout else None
        return self.initializers.of(value, layout) if self.fits(value, layout) else None

    def _dequantize(self, container: Container, node: ir.Node, triple: tuple[ir.Value, ...],
                    layout: str) -> None:
        """A dequantized weight in place of the one ``node`` reads (a MatMul's operand, or
        a Transpose's input: the Transpose goes)."""
        weight = _dq(container, node, triple, self.block)
        if layout == "NK":  # the Transpose: every use is a MatMul
            ir.convenience.replace_all_uses_with(node.outputs[0], weight)
            container.remove(node, safe=True)
            matmuls = len(list(weight.uses()))
        else:
            node.replace_input_with(1, weight)
            matmuls = 1
        self._count(container, matmuls)

    def _reads_rows(self, value: ir.Value) -> bool:
        """A main-graph table a ``Gather`` reads, that a head reads with ``MatMulNBits``."""
        seen = (value.name or "", "rows") in self.initializers.created  # its Gather's call
        return self.nbits and self.fits(value, "rows") and (seen or any(
            use_layout(node, i, self.slots) == "rows" for node, i in value.uses()))

    def _nbits(self, container: Container, transpose: ir.Node, value: ir.Value) -> None:
        """:func:`_as_nbits` of a tied head's ``Transpose`` of its table ``value``."""
        shape = value.const_value.shape if value.const_value is not None else (0, 0)
        made = _as_nbits(container, transpose, self.initializers.of(value, "rows"),
                         tuple(shape), self.block)
        self.in_main, self.shared = self.in_main + made, self.shared + made
        self.model.opset_imports.setdefault("com.microsoft", 1)

    def _count(self, container: Container, matmuls: int) -> None:
        if isinstance(container, ir.Graph):
            self.in_main += matmuls
        else:
            self.in_functions[container.name] += matmuls

    def _call(self, container: Container, node: ir.Node, callee: FunctionId,
              sources: Sources | None, passed: dict[ir.Value, ir.Value]) -> None:
        """A call of a function with quantized inputs. From the main graph (entries):
        ``q`` in place, the scales (and zero points) appended in input order. From a
        function: its entry input dequantized once (``passed``) and the ``[K, N]`` weight
        passed on (onnxruntime 1.32 refuses a 4-bit value passed from function to
        function); its inner input, as it is."""
        extra: list[ir.Value] = []
        for index in range(len(node.inputs)):
            layout = self.slots.get((callee, index))
            value = node.inputs[index]
            if layout is None or value is None:
                continue
            if sources is None:
                triple = self._source(value, layout, None)
                assert triple is not None, f"{node.op_type} input {index}: no weight"
                node.replace_input_with(index, triple[0])
                extra.extend(triple[1:])
            elif value in sources:
                if value not in passed:
                    passed[value] = _dq(container, node, sources[value][0], self.block)
                    self._count(container, 1)
                node.replace_input_with(index, passed[value])
        if extra:
            node.resize_inputs(len(node.inputs) + len(extra))
            for offset, value in enumerate(extra):
                node.replace_input_with(len(node.inputs) - len(extra) + offset, value)


def _dq(container: Container, before: ir.Node, triple: tuple[ir.Value, ...], block: int
        ) -> ir.Value:
    """A ``DequantizeLinear`` of ``triple`` inserted before ``before``: its output."""
    dq = ir.node("DequantizeLinear", list(triple),
                 attributes={"axis": 0, "block_size": block})
    dq.outputs[0].type = triple[1].type
    dq.outputs[0].name = f"{triple[0].name}_dequantized"
    container.insert_before(before, dq)
    return dq.outputs[0]


def _gather(container: Container, node: ir.Node, triple: tuple[ir.Value, ...], block: int
            ) -> None:
    """``node``'s ``Gather`` of a table's rows, from its 4-bit rows
    (:func:`~rewrite.backends.onnx._blockwise._by_rows`): the rows asked for of the values,
    the scales (and zero points), then only they unpacked and dequantized, ``(nibble - zero
    point or 8) * scale``."""
    q, scale, *zero_point = triple
    ids, out = node.inputs[1], node.outputs[0]
    dtype = scale.type.dtype if scale.type is not None else ir.DataType.FLOAT
    new: list[ir.Node] = []

    def add(op: str, inputs: list, **attributes: Any) -> ir.Value:
        new.append(ir.node(op, inputs, attributes=attributes))
        return new[-1].outputs[0]

    def const(values: Any, numpy_dtype: Any) -> ir.Value:
        return add("Constant", [], value=ir.tensor(np.array(values, numpy_dtype)))

    last, four = const([-1], np.int64), const(4, np.uint8)
    codes = add("Gather", [q, ids], axis=0)
    low = add("Unsqueeze", [add("BitwiseAnd", [codes, const(15, np.uint8)]), last])
    high = add("Unsqueeze", [add("BitShift", [codes, four], direction="RIGHT"), last])
    shape = add("Shape", [ids])  # [..., blocks, block / 2, 2] -> [..., blocks, block]
    blocked = add("Concat", [shape, const([-1, block], np.int64)], axis=0)
    grouped = add("Reshape", [add("Concat", [low, high], axis=-1), blocked])
    values = add("Cast", [grouped], to=dtype)
    offset = (add("Cast", [add("Unsqueeze", [add("Gather", [zero_point[0], ids], axis=0),
                                             last])], to=dtype) if zero_point
              else const(8, dtype.numpy()))
    scales = add("Unsqueeze", [add("Gather", [scale, ids], axis=0), last])
    rows = add("Mul", [add("Sub", [values, offset]), scales])
    merged = add("Reshape", [rows, add("Concat", [shape, last], axis=0)])  # [..., K]
    merged.type, merged.shape = out.type, out.shape
    container.insert_before(node, new)
    ir.convenience.replace_all_uses_with(out, merged, replace_graph_outputs=True)
    container.remove(node, safe=True)
    merged.name = out.name


def _as_nbits(container: Container, transpose: ir.Node, parts: tuple[ir.Value, ...],
              shape: tuple[int, int], block: int) -> int:
    """Each ``MatMul`` reading ``transpose`` (of a table of ``shape``) as ``MatMulNBits`` on
    the table's rows ``parts`` (:func:`~rewrite.backends.onnx._blockwise._by_rows`: ``B``
    ``[N, blocks, block / 2]``, scales ``[N, blocks]``; symmetric: no zero point, 8;
    accuracy level :data:`ACCURACY_LEVEL`); how many."""
    q, scale = parts[:2]
    n, k = shape
    uses = list(transpose.outputs[0].uses())
    for use, _ in uses:
        fused = ir.node("MatMulNBits", [use.inputs[0], q, scale], domain="com.microsoft",
                        attributes={"K": k, "N": n, "bits": 4, "block_size": block,
                                    "accuracy_level": ACCURACY_LEVEL})
        out = use.outputs[0]
        fused.outputs[0].type, fused.outputs[0].shape = out.type, out.shape
        container.insert_before(use, fused)
        ir.convenience.replace_all_uses_with(out, fused.outputs[0], replace_graph_outputs=True)
        container.remove(use, safe=True)
        fused.outputs[0].name = out.name
    container.remove(transpose, safe=True)
    return len(uses)


def _raise_opsets(model: ir.Model) -> None:
    """The default domain at :data:`OPSET` at least, in the model and every function."""
    version = max(model.opset_imports.get("", OPSET), OPSET)
    model.opset_imports[""] = version
    for function in model.functions.values():  # onnxruntime types a function's inputs by
        function.opset_imports[""] = version      # its default opset: int4 needs 21


__all__ = ["Kept", "QuantizeInt4", "Quantized", "as_float32", "fake_quantized", "made",
           "quantize_int4"]
