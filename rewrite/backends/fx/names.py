"""Node and attribute names in the generated modules.

Submodule bodies use *local* names: the original node name without its numeric suffix
(``linear_37`` -> ``linear``), numbered again inside the submodule by ``torch.fx``. Every block
of a model then reads the same (``linear``, ``linear_1``...), and identical blocks generate
identical code, which is compiled once. The root keeps the original names.
"""

from __future__ import annotations

import re
from functools import lru_cache

_SUFFIX = re.compile(r"^(.*?)_\d+$")
_NOT_WORD = re.compile(r"\W")


@lru_cache(maxsize=4096)
def local_name(name: str) -> str:
    """``linear_37`` -> ``linear``; ``conv2d`` stays."""
    match = _SUFFIX.match(name)
    return node_name(match.group(1) if match and match.group(1) else name)


def identifier(text: str) -> str:
    """``h.0`` -> ``h_0``: a Python identifier for a dotted path or a tag value."""
    if text.isidentifier() and text.isascii():
        return text
    out = _NOT_WORD.sub("_", text.encode("ascii", "replace").decode()) or "_"
    return out if not out[0].isdigit() else f"_{out}"


def node_name(text: str) -> str:
    """A node name (a local variable of ``forward``): an identifier that is not ``self``."""
    out = identifier(text)
    return "self_" if out == "self" else out
