"""``--precision int4``, and ``fp32`` of a checkpoint stored in another dtype: the model built
without a float32 copy, each weight quantized (int4) or converted (fp32) as it is written,
checked against eager on the same weights.

* **Built**: a float32 model (what the builder's ``-p int4 -e cpu`` computes in) is needed
  for torch.export, but not the float32 values of the weights to quantize. A checkpoint in
  another dtype (bf16, fp16) is built as it is stored (mapped), then
  :func:`float32_shell` converts the model to float32 except the weights of its linear
  layers and embeddings (``nn.Linear``, GPT-2's ``Conv1D``, ``nn.Embedding``; a tied head
  and its table share one), which become float32 placeholders of anonymous memory not
  written (zero pages: no memory of their own; one page each marks it apart), the mapped
  originals kept as *sources*.
* **Converted** (fp32, :meth:`ShellExport.finish` without a block size): each source written
  in float32, converted when written; checked (:meth:`ShellExport.check`) against eager
  computing with the same float32 weights swapped in module by module, as below, with
  float32's tolerance: the peak memory of neither step holds a float32 copy of the model.
* **Quantized** (:meth:`ShellExport.finish`): :func:`~rewrite.backends.onnx.quantize.quantize_int4`
  computes each weight's blocks from its source when it is written; a source not quantized
  is written in float32, converted when written. A source the lowered model no longer
  names is an error: its placeholder would be written.
* **Checked** (:meth:`ShellExport.check`): the written model against eager run on the same
  weights, quantized and dequantized as its ``DequantizeLinear`` computes them (the
  quantized weights kept when written: :class:`~rewrite.backends.onnx.quantize.Kept`),
  with float32's tight tolerance; a wrong layout or a weight wired to the wrong call is a
  mismatch; the eager reference from one call where it can
  (:func:`~rewrite.exporting.checkpoint.checks.causal_lm_check`'s ``one_pass``), onnxruntime
  with the ``MatMulNBits`` fusion in float32 (:func:`~rewrite.exporting.verify.open_session`).
  The eager weights are swapped in module by module while it runs (forward hooks: one
  float32 weight at a time; a linear layer's of more than :data:`BY_ROWS_ABOVE` values, a
  head over a vocabulary, a block of rows at a time: :class:`ByRows`). The error against
  eager float32 is measured on the same file (its first step, the prefill: one eager run,
  one onnxruntime run for both) and reported, not checked; onnxruntime opens the file
  (fusing and packing the weights) after that eager run, once the quantized weights kept
  are dropped. Not while it runs: both use every core, and side by side they took longer
  than one after the other (1.24B bf16: 3.0 s against 2.1 s; 187M fp32: 0.45 s against
  0.32 s).
"""

from __future__ import annotations

import contextlib
import inspect
import mmap
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from attrs import evolve, frozen

from rewrite._shared.heap import give_back_freed
from rewrite.errors import VerificationError

if TYPE_CHECKING:
    import onnx_ir as ir
    import torch

    from rewrite.backends.onnx.packed import PackedWeight
    from rewrite.backends.onnx.quantize import Kept
    from rewrite.backends.onnx.quantize import Quantized
    from rewrite.exporting.verify import Check

Weights = dict[str, Callable[..., "torch.Tensor"]]
"""Parameter name -> the value eager uses for it while a reference is computed: a linear
layer's made in float32 into the buffer given (``out``)."""
Tables = dict[str, Callable[["torch.Tensor"], "tuple[torch.Tensor, torch.Tensor]"]]
"""An embedding's table name -> given the ids looked up, the table eager looks them up in
and the ids to look up there: its source as it is and the same ids, or only the rows asked
for, dequantized as the written model computes them, and the ids' places among them."""


def embedding_tables(model: "torch.nn.Module") -> frozenset[str]:
    """Every name of the weights of ``model``'s embeddings that a linear layer also reads
    (a tied head), to be written in 4 bits; an untied embedding stays float, as
    onnxruntime-genai's builder keeps it (its error is the model's largest int4 cost)."""
    import torch

    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    heads = {id(_weight(m)) for m in model.modules()
             if _swappable(m) and not isinstance(m, torch.nn.Embedding)}
    return frozenset(name for name, p in model.named_parameters(remove_duplicate=False)
                     if id(p) in tables & heads)


def float32_shell(model: "torch.nn.Module") -> dict[str, "torch.Tensor"]:
    """``model`` in float32 but the weights of its linear layers and embeddings (module
    docstring), in place; their names (each name of a shared one) -> their values as built
    (none for a float32 model)."""
    import torch

    if all(p.dtype == torch.float32 for p in model.parameters()):
        return {}
    uses: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    holders = [(prefix, module) for prefix, module in model.named_modules()
               if _swappable(module) and _weight(module) is not None]
    held: dict[int, int] = {}
    for _, module in holders:
        held[id(_weight(module))] = held.get(id(_weight(module)), 0) + 1
    sources: dict[str, torch.Tensor] = {}
    placeholders: dict[int, torch.nn.Parameter] = {}
    originals: dict[int, torch.Tensor] = {}
    for prefix, module in holders:
        weight = _weight(module)
        if held[id(weight)] != uses[id(weight)]:  # also read by a module eager cannot swap
            continue
        if id(weight) not in placeholders:
            placeholders[id(weight)] = torch.nn.Parameter(
                _untouched(tuple(weight.shape), len(placeholders) + 1), requires_grad=False)
            originals[id(weight)] = weight.detach()  # one source for all its names
        sources[f"{prefix}.weight" if prefix else "weight"] = originals[id(weight)]
        module._parameters["weight"] = placeholders[id(weight)]
    model.to(torch.float32)
    return sources


def _swappable(module: "torch.nn.Module") -> bool:
    """A module whose weight eager can swap while it runs (:func:`swapped`)."""
    import torch

    return isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or \
        type(module).__name__ == "Conv1D"


def _weight(module: "torch.nn.Module") -> "torch.nn.Parameter | None":
    """The module's 2-D floating-point ``weight``, or None."""
    weight = module._parameters.get("weight")
    if weight is None or weight.dim() != 2 or not weight.is_floating_point():
        return None
    return weight


def _untouched(shape: tuple[int, ...], mark: int) -> "torch.Tensor":
    """Float32 zeros in anonymous memory never written (no pages of their own) but their
    first value, ``mark``: placeholders that no pass takes for equal (onnxscript's optimizer
    merges equal small initializers)."""
    import torch

    count = 1
    for size in shape:
        count *= size
    if not count:
        return torch.zeros(shape)
    placeholder = torch.frombuffer(mmap.mmap(-1, 4 * count), dtype=torch.float32)
    placeholder[0] = mark
    return placeholder.view(shape)


class ShellExport:
    """The export of a model built as stored whose weights are written in float32: each
    quantized to int4 (``block``: the block size), or converted (``block`` None); the
    shell's sources, the ``finish`` writing them and the check of what is written."""

    def __init__(self, model: "torch.nn.Module", *, block: int | None, symmetric: bool,
                 report: Callable[[str], None], verify: bool, target: str = "onnx") -> None:
        from rewrite.backends.onnx.quantize import Kept

        self.model, self.block, self.symmetric, self.report = model, block, symmetric, report
        self.target = target
        self.tables = embedding_tables(model) if block is not None else frozenset()
        self.sources = float32_shell(model)
        self.kept: Kept | None = Kept() if verify and block is not None else None
        self.quantized: Quantized | None = None
        self.packed: dict[str, PackedWeight] = {}

    def finish(self, onnx_model: "ir.Model") -> None:
        """Quantize ``onnx_model``'s weights (each when written) where a block size is set;
        the shell's other sources in float32. A packed weight (``backends.onnx.packed``) is
        its parts' sources concatenated when it is written."""
        from rewrite.backends.onnx.quantize import quantize_int4
        from rewrite.backends.onnx.transposed import transpose_weights

        graph = onnx_model.graph
        self.packed = _packed(graph)
        sources = {**self.sources, **{name: tensor.stacked(self._parts_of(tensor))
                                      for name, tensor in self.packed.items()}}
        transposed: tuple[str, ...] = ()
        if self.block is not None:
            self.quantized = quantize_int4(onnx_model, block=self.block,
                                           symmetric=self.symmetric, sources=sources,
                                           kept=self.kept, tables=self.tables,
                                           target=self.target)
        else:  # the linear layers' weights written [in, out], as MatMul reads them
            transposed = transpose_weights(onnx_model, sources, float32=True)
        done = {name for name, _ in self.quantized.layouts} if self.quantized else set()
        done.update(transposed)
        found: set[int] = set()
        for name, source in sources.items():
            value = graph.initializers.get(name)
            if value is not None and name not in transposed:  # not quantized, or also
                value.const_value = _float32(source, name, value.shape)  # read as it is
            if value is None and name not in done:
                continue
            parts = self.packed[name].names if name in self.packed else (name,)
            found.update(id(self.sources[part]) for part in parts if part in self.sources)
        lost = [name for name, source in self.sources.items() if id(source) not in found]
        if lost:
            raise VerificationError(f"{self._what}: the weight {lost[0]} is not an "
                                    "initializer of the lowered model, it cannot be written "
                                    "from the checkpoint; nothing was written")
        if self.quantized is not None:
            self.report(self.quantized.note())

    @property
    def _what(self) -> str:
        return "fp32" if self.block is None else "int4"

    def check(self, make: "Callable[[], Check | None]") -> "Callable[[Path], str] | None":
        """The check of the written file: ``make``'s steps (the eager reference) on the
        quantized weights, tight; on the float weights, reported."""
        return partial(self._check, make)

    def _check(self, make: "Callable[[], Check | None]", path: Path) -> str:
        from rewrite.exporting.verify import open_session

        if self.block is None:  # converted: eager on the float32 weights, made as it runs
            with swapped(self.model, *self._weights(quantized=False)):
                converted = _taking(make, one_pass=True)()
            return "not verified against eager" if converted is None else converted(path)
        assert self.quantized is not None, "checked before it was quantized"
        with swapped(self.model, *self._weights(quantized=True)):
            strict = _taking(make, one_pass=True)()
        if self.kept is not None:
            self.kept.clear()  # before onnxruntime loads the model (a new export refills it)
        give_back_freed()  # the kept weights' and the dequantized buffers' pages
        if strict is None:
            return "not verified against eager"
        with swapped(self.model, *self._weights(quantized=False)):
            loose = _taking(make, decode=False)()
        give_back_freed()  # the float32 buffers' pages
        session = open_session(path, int4=True, nbits=self.quantized.shared > 0)
        if loose is None:
            return "not verified against eager"
        if isinstance(session, str):
            return session
        memo: dict = {}  # the first step, fed alike, is run once for both
        worst, _ = strict.run(session, memo=memo)
        first = evolve(loose, steps=loose.steps[:1])
        error, relative = first.run(session, strict=False, memo=memo)
        return (f"verified against eager in onnxruntime ({strict.what}) on the same int4 "
                f"weights dequantized: max |difference| {worst:.2g}; int4 against eager "
                f"float32 ({first.steps[0].name}): max |difference| {error:.3g} "
                f"({relative:.2g} of the largest value)")

    def _weights(self, quantized: bool) -> tuple[Weights, Tables]:
        """What eager uses for each weight, in a linear layer and in an embedding: the
        written int4 weights dequantized (``quantized``), else the shell's sources in
        float32; an embedding looks its rows up in its source as built (converted after:
        :func:`swapped`), or, quantized, in its rows asked for dequantized."""
        from rewrite.backends.onnx.quantize import fake_quantized

        floats: Weights = {name: ByRows(partial(_converted_rows, source))
                           for name, source in self.sources.items()}
        tables: Tables = {name: partial(_as_is, source) for name, source in self.sources.items()}
        if not quantized or self.quantized is None:
            return floats, tables
        linear = dict(floats)
        for name, layout in self.quantized.layouts:
            if layout == "rows":  # a tied head (MatMulNBits) reads the same rows
                aliases = self._aliases(name)
                tables.update(dict.fromkeys(aliases, partial(
                    _rows, self.kept, f"{name}:NK", self.block)))
                if self.kept is not None and f"{name}:NK" in self.kept:
                    linear.update(dict.fromkeys(aliases, _kept_made(
                        self.kept, f"{name}:NK", "NK", self.block, by_rows=True)))
                continue
            key = f"{name}:{layout}"
            kept = self.kept is not None and key in self.kept
            if kept:
                made = _kept_made(self.kept, key, layout, self.block, name not in self.packed)
            elif name in self.packed:
                made = partial(_fake_packed, self.packed[name],
                               self._parts_of(self.packed[name]), layout, self.block,
                               self.symmetric)
            else:
                source = self.sources.get(name)
                made = partial(
                    fake_quantized, self.model.get_parameter(name) if source is None
                    else source, layout, self.block, self.symmetric)
            if name in self.packed:
                parts = _kept_parts(self.kept, key, self.packed[name], self.block) \
                    if kept and layout == "NK" else None
                linear.update(parts or _parts(self.packed[name], made))
            else:
                linear[name] = made if kept else partial(_converted, made)
        return linear, tables

    def _aliases(self, name: str) -> list[str]:
        """Every name of the parameter ``name``."""
        held = self.model.get_parameter(name)
        return [other for other, p in self.model.named_parameters(remove_duplicate=False)
                if p is held]

    def _parts_of(self, tensor: "PackedWeight") -> list["torch.Tensor"]:
        """The sources of a packed weight's parts (a parameter eager holds as it is
        where the shell has none)."""
        return [self.sources[part] if part in self.sources else self.model.get_parameter(part)
                for part in tensor.names]


def _taking(make: "Callable[..., Check | None]", **flags: bool
            ) -> "Callable[[], Check | None]":
    """``make`` given those of ``flags`` it takes: the quantized weights' reference from one
    eager pass (``one_pass``), the float weights' of the first step only (``decode=False``:
    the error against float32 is reported on the prefill). Each eager pass converts or
    dequantizes every weight."""
    taken = inspect.signature(make).parameters
    return partial(make, **{name: value for name, value in flags.items() if name in taken})


def _float32(source: "torch.Tensor | Callable[[], torch.Tensor]", name: str,
             shape: "ir.Shape | None" = None) -> "ir.LazyTensor":
    """``source`` (or what it makes, of ``shape``) in float32, converted when written."""
    import onnx_ir as ir
    import torch

    from rewrite.backends.onnx.quantize import made

    return ir.LazyTensor(lambda: ir.Tensor(made(source).to(torch.float32).numpy(), name=name),
                         ir.DataType.FLOAT, ir.Shape(tuple(
                             source.shape if shape is None else shape)), name=name)


def _packed(graph: "ir.Graph") -> "dict[str, PackedWeight]":
    """The graph's packed weights, by name."""
    from rewrite.backends.onnx.packed import PackedWeight

    return {name: value.const_value for name, value in graph.initializers.items()
            if isinstance(value.const_value, PackedWeight)}


def _fake_packed(tensor: "PackedWeight", sources: list["torch.Tensor"], layout: str,
                 block: int, symmetric: bool) -> "torch.Tensor":
    from rewrite.backends.onnx.quantize import fake_quantized

    return fake_quantized(tensor.rows(sources), layout, block, symmetric)


def _kept_parts(kept: "Kept | None", key: str, tensor: "PackedWeight", block: int
                ) -> Weights | None:
    """Each part's weight dequantized from the kept packed weight ``key`` (``"NK"``, its
    parts one after another along its rows) straight into the buffer it is given, not sliced
    from the packed weight made whole (gate and up: 32 MB of fresh pages at each layer); None
    where a part starts at an odd row (the rows are kept in pairs)."""
    bounds = tensor.bounds()
    if kept is None or tensor.axis != 0 or any(start % 2 for start, _ in bounds.values()):
        return None
    return {name: partial(_kept_rows, kept, key, block, start, stop)
            for name, (start, stop) in bounds.items()}


def _parts(tensor: "PackedWeight", made: Callable[[], "torch.Tensor"]) -> Weights:
    """Each part's weight, sliced from the packed weight ``made`` makes into the buffer it
    is given, made once for its parts in a row (eager enters the query, key and value
    projections one after another; one packed weight held at a time)."""
    last: dict[str, "torch.Tensor"] = {}

    def part(start: int, stop: int, out: "torch.Tensor") -> "torch.Tensor":
        if "packed" not in last:
            last["packed"] = made()
        whole = last["packed"]
        if stop == whole.shape[tensor.axis]:
            last.clear()  # the last part: the next use makes it again
        return out.copy_(whole.narrow(tensor.axis, start, stop - start))

    return {name: partial(part, *bounds) for name, bounds in tensor.bounds().items()}


@contextlib.contextmanager
def swapped(model: "torch.nn.Module", linear: Weights, embedding: Tables
            ) -> Iterator[None]:
    """While the block runs, each module holding one of the parameters named computes with
    the value made for it instead (``embedding``'s in an embedding, for the ids it is
    given, whose output is then converted to float32: a tied table's lookup; ``linear``'s
    in any other module), made when the module is entered and dropped when it returns; an
    error if a weight is held by no such module."""
    import torch

    tables = {id(model.get_parameter(name)): make for name, make in embedding.items()}
    others = {id(model.get_parameter(name)): make for name, make in linear.items()}
    handles, found, by_rows = [], set(), []
    buffers = _Buffers()
    for module in model.modules():
        table = isinstance(module, torch.nn.Embedding)
        wanted = tables if table else others
        mine = {attr: wanted[id(p)] for attr, p in module._parameters.items()
                if p is not None and id(p) in wanted}
        if not mine:
            continue
        found.update(id(module._parameters[attr]) for attr in mine)
        if _in_blocks_of_rows(module, mine):
            module.forward = partial(_linear_by_rows, module, mine["weight"], buffers)
            by_rows.append(module)
            continue
        saved: dict[str, torch.nn.Parameter] = {}
        lent = None if table else buffers
        handles.append(module.register_forward_pre_hook(partial(_swap_in, mine, saved, lent)))
        handles.append(module.register_forward_hook(partial(_swap_out, saved, lent)))
    try:
        missing = (set(tables) | set(others)) - found
        if missing:
            raise VerificationError(f"{len(missing)} weight(s) used by no module eager "
                                    "can swap them in; nothing was written")
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in by_rows:
            del module.forward  # the class's again


@frozen
class ByRows:
    """A linear layer's weight (``[out, in]``) made a block of its rows at a time: ``make(start,
    stop, out)`` writes rows ``start:stop`` (``start`` even) into ``out``; called with ``out``
    alone, the whole weight, as any other maker of :data:`Weights`."""

    make: Callable[[int, int, "torch.Tensor"], "torch.Tensor"]

    def __call__(self, out: "torch.Tensor") -> "torch.Tensor":
        return self.make(0, out.shape[0], out)


ROWS_AT_ONCE = 1 << 20
"""Values of a weight made at a time where it is made by rows (4 MB in float32)."""
BY_ROWS_ABOVE = 1 << 23
"""A linear layer whose weight holds more values (32 MB in float32) computes with it a block
of rows at a time while eager runs: a head over a vocabulary (32000 x 1024: 131 MB) is no
longer made whole, the largest buffer of the check."""


def _in_blocks_of_rows(module: "torch.nn.Module", mine: Weights) -> bool:
    """Whether ``module`` is a plain ``nn.Linear`` (its class's ``forward``, none of the
    instance's, which :func:`swapped` could not give back) whose only weight swapped, a large
    one, can be made by rows."""
    import torch

    weight = module._parameters.get("weight")
    return (type(module).forward is torch.nn.Linear.forward and "forward" not in vars(module)
            and set(mine) == {"weight"}
            and isinstance(mine["weight"], ByRows) and weight is not None
            and weight.numel() > BY_ROWS_ABOVE)


def _linear_by_rows(module: "torch.nn.Linear", weight: ByRows, buffers: "_Buffers",
                    x: "torch.Tensor") -> "torch.Tensor":
    """``module(x)`` with ``weight`` made a block of rows at a time, each block's outputs
    computed from it (each output is the same dot product as with the whole weight)."""
    import torch

    count, width = module.weight.shape
    step = max(2, ROWS_AT_ONCE // max(width, 1) // 2 * 2)
    out = x.new_empty(*x.shape[:-1], count)
    buffer = buffers.take((min(step, count), width))
    try:
        for start in range(0, count, step):
            stop = min(start + step, count)
            block = weight.make(start, stop, buffer[:stop - start])
            bias = None if module.bias is None else module.bias[start:stop]
            out[..., start:stop] = torch.nn.functional.linear(x, block, bias)
    finally:
        buffers.give(buffer)
    return out


class _Buffers:
    """The float32 buffers weights are made into while eager runs, each given back when
    its module returns and taken again by the next module with a weight of its shape: a
    fresh buffer of 64 MB costs 3x the time of writing into one already touched (its pages
    are faulted in and zeroed)."""

    def __init__(self) -> None:
        self._free: dict[tuple[int, ...], list[torch.Tensor]] = {}

    def take(self, shape: tuple[int, ...]) -> "torch.Tensor":
        import torch

        free = self._free.get(shape)
        return free.pop() if free else torch.empty(shape)

    def give(self, buffer: "torch.Tensor") -> None:
        self._free.setdefault(tuple(buffer.shape), []).append(buffer)


def _swap_in(mine: Weights, saved: dict, buffers: _Buffers | None,
             module: "torch.nn.Module", args: tuple) -> tuple | None:
    """``module``'s weights made (a linear layer's into a buffer, an embedding's for the
    ids it is given, which it may change: :data:`Tables`) in place of its own, saved."""
    import torch

    for attr, make in mine.items():
        saved[attr] = module._parameters[attr]
        if buffers is None:
            made, ids = make(args[0])
            args = (ids, *args[1:])
        else:
            made = make(out=buffers.take(tuple(saved[attr].shape)))
        module._parameters[attr] = torch.nn.Parameter(made, requires_grad=False)
    return args


def _swap_out(saved: dict, buffers: _Buffers | None, module: "torch.nn.Module",
              args: object, output: "torch.Tensor") -> "torch.Tensor | None":
    """``module``'s own weights back, its buffers given back; an embedding's output in
    float32 (a table looked up as built)."""
    import torch

    if buffers is not None:
        for attr in saved:
            buffers.give(module._parameters[attr].data)
    module._parameters.update(saved)
    saved.clear()
    return output.to(torch.float32) if buffers is None else None


def _converted(source: "torch.Tensor | Callable[[], torch.Tensor]", out: "torch.Tensor"
               ) -> "torch.Tensor":
    """``source`` (or what it makes) in float32, in ``out``."""
    from rewrite.backends.onnx.quantize import made

    return out.copy_(made(source))


def _converted_rows(source: "torch.Tensor", start: int, stop: int, out: "torch.Tensor"
                    ) -> "torch.Tensor":
    """Rows ``start:stop`` of ``source`` in float32, in ``out``."""
    return out.copy_(source[start:stop])


def _kept_made(kept: "Kept", key: str, layout: str, block: int, by_rows: bool
               ) -> Callable[..., "torch.Tensor"]:
    """The kept quantized weight ``key`` dequantized into the buffer it is given; by rows
    (:class:`ByRows`) where it is a linear layer's own weight (``by_rows``: not a part of a
    packed one) in its layout (``"NK"``)."""
    if by_rows and layout == "NK":
        return ByRows(partial(_kept_rows, kept, key, block))
    return partial(kept.weight, key, layout, block)


def _kept_rows(kept: "Kept", key: str, block: int, start: int, stop: int,
               out: "torch.Tensor") -> "torch.Tensor":
    """Rows ``start:stop`` of the kept quantized weight ``key`` (``"NK"``), dequantized
    into ``out``."""
    return kept.weight(key, "NK", block, out=out, rows=(start, stop))


def _as_is(source: "torch.Tensor", ids: "torch.Tensor"
           ) -> "tuple[torch.Tensor, torch.Tensor]":
    return source, ids


def _rows(kept: "Kept | None", key: str, block: int, ids: "torch.Tensor"
          ) -> "tuple[torch.Tensor, torch.Tensor]":
    """The rows ``ids`` asks for of the quantized table ``key`` kept, dequantized (each
    once), and the ids' places among them."""
    import torch

    if kept is None or key not in kept:
        raise VerificationError(f"int4: the embedding {key} was not kept when written; "
                                "nothing was written")
    asked, places = torch.unique(ids, return_inverse=True)
    return kept.rows(key, asked, block), places
