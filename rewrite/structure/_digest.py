"""A function's signature and the digest of its body, as a lock records them.

The digest is sha256 (16 hex digits) of the body as a DAG: each node is labelled by a hash of
its key as deduplication keys it (``Keyer.node``: domain, op, overload, output count,
attributes with tensors by content and float attributes as float32, as a file holds them)
whose inputs are the labels of their producers (or ``("arg", k)`` for function input k);
the digest hashes the sorted node labels, the returned values' labels, each input's dtype
and rank, and the names of the attributes the function declares.

Not in it: value and node names, metadata (``namespace``, ``name_scopes``, doc strings),
weight values (weights are function inputs), input dims (a dynamic dim's symbol is torch's
choice), the order the nodes are listed in, and the callees' bodies (a call is its
callee's ``domain::name``; the callee has a digest of its own).
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy
import onnx_ir as ir

from rewrite.backends.onnx import Keyer, label

DIGITS = 16


def value_type(value: ir.Value) -> str:
    """``dtype:rRANK`` (``float:r3``, ``int64:r?``), ``?`` with no type."""
    if value.dtype is None:
        return "?"
    rank = "?" if value.shape is None else str(value.shape.rank())
    return f"{value.dtype.name.lower()}:r{rank}"


def op_name(node: ir.Node) -> str:
    """``Add``, ``com.microsoft::Attention``, a function's ``domain::name``."""
    return label((node.domain, node.op_type, node.overload)) if node.domain else node.op_type


def histograms(nodes, functions) -> tuple[Counter, Counter]:
    """``(ops, calls)``: ops that are not calls of ``functions``, and function calls."""
    ops: Counter = Counter()
    calls: Counter = Counter()
    for node in nodes:
        fid = (node.domain, node.op_type, node.overload)
        (calls if fid in functions else ops)[label(fid) if fid in functions
                                             else op_name(node)] += 1
    return ops, calls


def _as_stored(key):
    """``key`` with float attributes as a file stores them (float32: in memory, lowering
    holds them as Python floats); named tuples (``NodeKey``) as plain ones, so the digest does
    not depend on how the backend spells its keys."""
    if not isinstance(key, tuple):
        return key
    if len(key) == 2 and key[0] == "f" and type(key[1]) is str:
        return ("f", _f32(key[1]))
    if len(key) == 2 and key[0] == "fs" and type(key[1]) is tuple:
        return ("fs", tuple(_f32(v) for v in key[1]))
    return tuple(_as_stored(part) for part in key)


def _f32(text: str) -> str:
    try:
        return float(numpy.float32(float.fromhex(text))).hex()
    except ValueError:  # not a float's key after all
        return text


def body_digest(function: ir.Function, keyer: Keyer) -> str:
    """The digest described in the module docstring."""
    refs: dict[int, tuple] = {id(v): ("arg", k) for k, v in enumerate(function.inputs)}
    labels = []
    for node in function:  # a body lists its nodes in a topological order
        label = _hash(_as_stored(keyer.node(node, refs)))
        labels.append(label)
        for t, value in enumerate(node.outputs):
            refs[id(value)] = (label, t)
    return _hash((
        tuple(sorted(labels)),
        tuple(refs.get(id(v)) for v in function.outputs),
        tuple(value_type(v) for v in function.inputs),
        tuple(sorted(function.attributes)),
    ))[:DIGITS]


def _hash(key) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()
