"""A model written with its weights in the file (no external data), each weight's bytes
held once, one weight at a time.

``ir.save`` of such a model makes the whole ``ModelProto`` (every weight's bytes copied into
it: weights made when written, int4 blocks, are made then, all of them), then its serialized
bytes (a second full copy), then writes them: twice the model in memory at its peak. Here
the model is serialized with each large initializer of the main graph standing in without
bytes (its name, type, shape and metadata; an empty ``raw_data``), and the file is written
from that skeleton, each weight's bytes written (``tofile``) where its empty ``raw_data`` is,
made when written: the same bytes as ``ir.save``'s. Protobuf writes a message's fields in an
order that does not depend on what they hold, with minimal length prefixes, so only the
length prefixes of each such tensor, of the graph and of the ``raw_data`` fields differ from
the skeleton's, and they are computed from each weight's ``nbytes`` (a weight writing other
than its ``nbytes`` is an error: the file is never a wrong model).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Union

import onnx
import onnx_ir as ir

HOLLOW_BYTES = 1 << 16
"""Initializers of more than this many bytes are written from the skeleton's holes; smaller
ones are serialized with it (their copies are small)."""
_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_NAME = onnx.TensorProto.DESCRIPTOR.fields_by_name["name"].number
_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_LENGTH_DELIMITED = 2

Piece = Union[bytes, ir.TensorProtocol]
"""What the file is written from, in order: bytes of the skeleton, or a weight's bytes."""


class _Hollow:
    """A tensor as ``onnx_ir.serde`` serializes it, without its bytes (``raw_data`` empty)."""

    def __init__(self, tensor: ir.TensorProtocol) -> None:
        self.name, self.doc_string = tensor.name, tensor.doc_string
        self.dtype, self.shape = tensor.dtype, tensor.shape
        self.metadata_props = tensor.metadata_props

    def tobytes(self) -> bytes:
        return b""


def save_embedded(model: ir.Model, path: Path) -> None:
    """Write ``model`` to ``path`` with every weight in the file: the bytes of
    ``ir.save(model, path)``, each large weight read (made) once when its bytes are
    written (module docstring). A path whose extension names a text format (``.json``,
    ``.textproto``: onnx's serializers) is written by ``ir.save``."""
    if onnx.serialization.registry.get_format_from_file_extension(
            Path(path).suffix) not in (None, "protobuf"):
        ir.save(model, path)
        return
    values = [value for value in model.graph.initializers.values()
              if _hollowed(value.const_value)]
    tensors = {value.name: value.const_value for value in values}
    for value in values:
        value.const_value = _Hollow(value.const_value)  # type: ignore[assignment]
    try:
        skeleton = ir.serde.serialize_model(model).SerializeToString()
    finally:
        for value in values:
            value.const_value = tensors[value.name]
    pieces = _model_pieces(memoryview(skeleton), tensors)
    with open(path, "wb") as file:
        for piece in pieces:
            _write(file, piece)


def _hollowed(tensor: ir.TensorProtocol | None) -> bool:
    """Whether ``tensor`` is written from a hole: large, and serialized as ``raw_data``."""
    return (tensor is not None and tensor.nbytes > HOLLOW_BYTES
            and not isinstance(tensor, (ir.ExternalTensor, ir.StringTensor,
                                        ir.serde.TensorProtoTensor)))


def _write(file: BinaryIO, piece: Piece) -> None:
    if isinstance(piece, (bytes, memoryview)):
        file.write(piece)
        return
    start = file.tell()
    if hasattr(piece, "tofile"):
        piece.tofile(file)
    else:  # pragma: no cover - a tensor of an older onnx_ir protocol
        file.write(piece.tobytes())
    written = file.tell() - start
    if written != piece.nbytes:
        raise AssertionError(f"{piece.name}: wrote {written} bytes, its nbytes are "
                             f"{piece.nbytes}")


def _model_pieces(model: memoryview, tensors: dict[str, ir.TensorProtocol]) -> list[Piece]:
    """The file's pieces: the skeleton ``model`` with the main graph's hollowed tensors
    filled with ``tensors`` (by name, each found once)."""
    pieces: list[Piece] = []
    found: set[str] = set()
    for tag, body in _fields(model):
        if body is not None and _number(tag) == _GRAPH:
            pieces.extend(_enclosed(tag, _graph_pieces(body, tensors, found)))
        else:
            pieces.append(_as_read(tag, body))
    if found != set(tensors):
        raise AssertionError(f"the serialized graph lacks {sorted(set(tensors) - found)[:3]}")
    return pieces


def _graph_pieces(graph: memoryview, tensors: dict[str, ir.TensorProtocol],
                  found: set[str]) -> list[Piece]:
    pieces: list[Piece] = []
    for tag, body in _fields(graph):
        if body is not None and _number(tag) == _INITIALIZER:
            name = _name(body)
            if name in tensors:
                if name in found:
                    raise AssertionError(f"two initializers named {name}")
                found.add(name)
                pieces.extend(_enclosed(tag, _tensor_pieces(body, tensors[name])))
                continue
        pieces.append(_as_read(tag, body))
    return pieces


def _tensor_pieces(tensor: memoryview, value: ir.TensorProtocol) -> list[Piece]:
    """A hollowed ``TensorProto``'s fields, its empty ``raw_data`` filled with ``value``."""
    pieces: list[Piece] = []
    filled = False
    for tag, body in _fields(tensor):
        if body is not None and _number(tag) == _RAW_DATA:
            if filled or len(body):
                raise AssertionError(f"{value.name}: not one empty raw_data in its stand-in")
            pieces.extend((bytes(tag) + _varint(value.nbytes), value))
            filled = True
        else:
            pieces.append(_as_read(tag, body))
    if not filled:
        raise AssertionError(f"{value.name}: no raw_data in its stand-in")
    return pieces


def _as_read(tag: memoryview, body: memoryview | None) -> Piece:
    """A field of :func:`_fields` written back as it was read."""
    return tag if body is None else bytes(tag) + _varint(len(body)) + body


def _enclosed(tag: memoryview, pieces: list[Piece]) -> list[Piece]:
    """``pieces`` as the body of a length-delimited field ``tag``."""
    length = sum(len(p) if isinstance(p, (bytes, memoryview)) else p.nbytes for p in pieces)
    return [bytes(tag) + _varint(length), *pieces]


def _fields(message: memoryview):
    """Each field of a serialized message, in order: (its tag's bytes, its body) for a
    length-delimited field; (the whole field's bytes, None) for another."""
    at = 0
    while at < len(message):
        start = at
        key, at = _read_varint(message, at)
        wire = key & 7
        if wire == _LENGTH_DELIMITED:
            tag = message[start:at]
            length, at = _read_varint(message, at)
            yield tag, message[at:at + length]
            at += length
            continue
        if wire == 0:
            _, at = _read_varint(message, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        else:
            raise AssertionError(f"wire type {wire} in a serialized ONNX model")
        yield message[start:at], None


def _number(tag: memoryview) -> int:
    return _read_varint(tag, 0)[0] >> 3


def _name(tensor: memoryview) -> str | None:
    """A serialized ``TensorProto``'s name."""
    for tag, body in _fields(tensor):
        if body is not None and _number(tag) == _NAME:
            return bytes(body).decode("utf-8")
    return None


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
