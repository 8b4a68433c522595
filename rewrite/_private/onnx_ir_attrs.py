"""A node's attributes as a plain dict: onnx_ir's ``Node.attributes`` is a ``UserDict``
whose mapping views are several times slower than its underlying ``data`` dict (an onnx_ir
internal). The hot loops that read every node's attributes (keying bodies, comparing
repeats, finding subgraphs) read them here; without ``data`` (another onnx_ir), the mapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import onnx_ir as ir


def attribute_dict(node: "ir.Node") -> Mapping[str, "ir.Attr"]:
    """``node.attributes``, read from its underlying dict when it has one."""
    attributes = node.attributes
    return getattr(attributes, "data", attributes)
