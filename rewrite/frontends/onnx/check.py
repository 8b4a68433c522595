"""Refuse an ONNX input that is itself invalid, before grouping it.

``rewrite`` outlines what it is given: an input that breaks the ONNX rules (a node reading a
value nothing defines, nodes out of order, an unknown operator, a missing opset import...)
would come out as an invalid output. ``onnx.checker`` with ``full_check`` (types and shapes
too) says so first, and the message says the input is at fault. About 70 ms on a 5,800-node
model; the command line runs it on every ``.onnx`` it reads.

Ops the checker cannot check. onnxruntime runs ops that ``onnx`` has no schema for: its
contrib ops (``com.microsoft::MatMulNBits``, ``GroupQueryAttention``...), which the checker
passes over as ops of a domain it does not know, and some it registers in the default domain
(``SimplifiedLayerNormalization``, ``SkipSimplifiedLayerNormalization``, ``RotaryEmbedding``
before opset 23...), which the checker refuses. onnxruntime-genai's builder and onnxruntime's
optimizer write both. :func:`check_onnx` checks everything else: the default-domain ops without
a schema that onnxruntime registers (when it is installed; any other is refused, as before)
are moved, in a copy of the model's graph (weights not loaded), to a domain the checker passes
over, and the ops left unchecked are returned, so that the caller says once which they were.
Outputs are checked the same way (tests).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from attrs import frozen

from rewrite.errors import InputError, ModelWarning, causes

if TYPE_CHECKING:
    import onnx

_UNREADABLE = ("Unable to parse proto", "Unable to open proto")
_DEFAULT_DOMAINS = ("", "ai.onnx")
_UNCHECKED = "pkg.rewrite.unchecked"
"""The domain the default-domain ops without a schema are moved to, for the checker."""


@frozen
class Unchecked:
    """What :func:`check_onnx` could not check."""

    ops: tuple[str, ...] = ()
    """Ops the checker has no schema for, as ``domain::OpType``, sorted."""
    value_info: str | None = None
    """Why the model's own ``value_info`` (optional shape annotations) failed the type and
    shape check, which passed without those of the nodes it named; None when they did
    not."""
    untyped: bool = False
    """Whether types and shapes were not checked at all: values made by ``ops`` have no
    type the checker knows, and it refuses the nodes that read them (in functions)."""

    def message(self, path: str | Path) -> str | None:
        """The one line that says so, None when everything was checked."""
        parts = []
        if self.ops:
            many = "s" if len(self.ops) > 1 else ""
            parts.append(f"onnx.checker has no schema for {len(self.ops)} op type{many} "
                         f"(onnxruntime's?), not checked: {', '.join(self.ops)}")
        if self.untyped:
            parts.append("nor the types and shapes of the values they make (structure "
                         "checked)")
        if self.value_info:
            parts.append("its value_info annotations disagree with the shapes onnx infers "
                         f"(checked without them): {self.value_info}")
        return f"{path}: " + "; ".join(parts) if parts else None


def check_onnx_input(path: str | Path) -> None:
    """Raise :class:`InputError` (``PATH: the input model is invalid: ...``) when the ONNX
    checker refuses the model at ``path``; warn (:class:`ModelWarning`, once) about what it
    could not check (see the module docstring)."""
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not a model at all: the loader says so, with its reason
        return
    try:
        unchecked = check_onnx(path, proto)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError, and a few others
        reason = _reason(e)
        if reason.startswith(_UNREADABLE):
            return  # not a model at all: the loader says so, with its own reason
        raise InputError(f"{path}: the input model is invalid: {reason}") from e
    message = unchecked.message(path)
    if message:
        warnings.warn(ModelWarning(message), stacklevel=2)


def check_onnx(model: "str | Path | onnx.ModelProto", proto: "onnx.ModelProto | None" = None
               ) -> Unchecked:
    """``onnx.checker.check_model(full_check=True)`` on the model (a path: read from there, so
    external data is checked), but for the ops it has no schema for, and without the
    ``value_info`` of the nodes whose inferred shapes disagree with it (onnxruntime-genai's
    builder declares its 1-D constants scalars); returns what was not checked. Raises what
    the checker raises (its first error). ``proto``: the model at the path, already read
    without its external data."""
    import onnx

    path = None if isinstance(model, onnx.ModelProto) else Path(model)
    if proto is None:
        proto = onnx.load(str(path), load_external_data=False) if path is not None else model
    local = {(f.domain, f.name) for f in proto.functions}
    moved: set[str] = set()
    unchecked: set[str] = set()
    graphs = [proto.graph, *proto.functions]
    for graph in graphs:
        for node in graph.node:
            _visit(node, local, moved, unchecked)
            graphs.extend(_subgraphs(node))
    known = runtime_ops(moved)
    unchecked -= {f"ai.onnx::{op}" for op in moved - known}  # the checker refuses them
    moved &= known
    ops = tuple(sorted(unchecked))
    if not moved:
        try:
            onnx.checker.check_model(str(path) if path is not None else proto, full_check=True)
            return Unchecked(ops)
        except onnx.shape_inference.InferenceError as e:
            error = e
    copy = _copy(proto, moved)
    first = None
    for _ in range(_ROUNDS):
        try:
            _check(copy, path)
            return Unchecked(ops, None if first is None else _reason(first))
        except onnx.shape_inference.InferenceError as e:
            first, error = first or e, e
            if not _drop_value_info(copy, error):
                break
    if ops and _only_untyped(error):  # past ops without a schema: types unknown
        _check(copy, path, full=False)
        return Unchecked(ops, None if first is error else _reason(first), untyped=True)
    raise (first or error) from None


_LEAF_ERROR = re.compile(r"\[(?:Type|Shape)InferenceError\] (?!Inference error)([^\n(]*)")
_UNTYPED = re.compile(r"Input \d+ expected to have type but instead is null\s*")


def _only_untyped(error: Exception) -> bool:
    """Whether every inference error in ``error`` is an input without a type (a value made by
    an op without a schema: the checker knows its type only from ``value_info``, which a
    producer may not write, and a function body does not hold before IR 10)."""
    leaves = _LEAF_ERROR.findall(str(error))
    return bool(leaves) and all(_UNTYPED.fullmatch(leaf) for leaf in leaves)


_ROUNDS = 20
"""How many nodes' conflicting ``value_info`` :func:`check_onnx` drops at most."""


def _drop_value_info(proto: "onnx.ModelProto", error: Exception) -> bool:
    """Drop the ``value_info`` of the outputs of the nodes whose inferred shapes disagree
    with it, as ``error`` names them; False when it names none or they have none."""
    text = str(error)
    names = {m.group(1) for m in re.finditer(r"node name: ([^)]*)\): \[ShapeInferenceError\] "
                                             r"Inferred shape and existing shape differ", text)}
    if not names:
        return False
    dropped = False
    for graph in [proto.graph, *proto.functions]:
        outputs = {o for n in graph.node if n.name in names for o in n.output}
        keep = [v for v in graph.value_info if v.name not in outputs]
        if len(keep) < len(graph.value_info):
            dropped = True
            del graph.value_info[:]
            graph.value_info.extend(keep)
    return dropped


def _visit(node: "onnx.NodeProto", local: set, moved: set[str], unchecked: set[str]) -> None:
    """Record ``node``'s op when the checker has no schema for it."""
    import onnx

    if (node.domain, node.op_type) in local:
        return
    if node.domain in _DEFAULT_DOMAINS:
        if not onnx.defs.has(node.op_type):
            moved.add(node.op_type)
            unchecked.add(f"ai.onnx::{node.op_type}")
    elif node.domain not in ("ai.onnx.ml", "ai.onnx.preview.training"):
        unchecked.add(f"{node.domain}::{node.op_type}")


def runtime_ops(ops: set[str]) -> set[str]:
    """Those of ``ops`` (default-domain op types) that onnxruntime registers, when it is
    installed (its schemas read only when ``ops`` is not empty: ~0.2 s)."""
    if not ops:
        return set()
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort
    except ImportError:
        return set()
    return ops & {s.name for s in ort.get_all_operator_schema() if s.domain in _DEFAULT_DOMAINS}


def _subgraphs(node: "onnx.NodeProto") -> list["onnx.GraphProto"]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _copy(proto: "onnx.ModelProto", ops: set[str]) -> "onnx.ModelProto":
    """A copy of ``proto`` whose default-domain nodes of ``ops`` (everywhere) are in
    :data:`_UNCHECKED`."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    graphs = [copy.graph, *copy.functions]
    for graph in graphs:
        for node in graph.node:
            if node.domain in _DEFAULT_DOMAINS and node.op_type in ops:
                node.domain = _UNCHECKED
            graphs.extend(_subgraphs(node))
    if ops:
        for holder in [copy, *copy.functions]:
            holder.opset_import.add(domain=_UNCHECKED, version=1)
    return copy


def _check(proto: "onnx.ModelProto", path: Path | None, full: bool = True) -> None:
    """Check ``proto`` (external data not loaded) as the model at ``path``: the checker looks
    up a proto's external tensors from the working directory, so it runs in ``path``'s
    folder."""
    import onnx

    if path is None:
        onnx.checker.check_model(proto, full_check=full)
        return
    here = os.getcwd()
    os.chdir(path.parent)
    try:
        onnx.checker.check_model(proto, full_check=full)
    finally:
        os.chdir(here)


def _reason(e: BaseException) -> str:
    """The checker's message on one line (it spreads a node's description over several)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300] + ("..." if len(text) > 300 else "")


def unwritable_input(path: str | Path, error: BaseException) -> InputError | None:
    """The :class:`InputError` for an output that cannot be serialized because of what the
    input ``path`` holds, or None when ``error`` is not that (a bug in rewrite).

    The checker does not look at text: a corrupt file may hold names that are not UTF-8;
    ``onnx_ir`` reads them as bytes and fails to write them back (``SerdeError`` caused by a
    ``TypeError`` or ``UnicodeError``)."""
    root = causes(error)[-1]
    if not str(path).lower().endswith(".onnx") or not isinstance(root, (TypeError,
                                                                         UnicodeError)):
        return None
    return InputError(f"{path}: the input model is invalid: it holds text that is not UTF-8 "
                      f"(a corrupt file?), which ONNX cannot write back ({_reason(root)})")
