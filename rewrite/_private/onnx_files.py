"""The names onnx_ir gives the chunks of external data (``max_shard_size_bytes``): its
private ``_shard_filename.get_shard_filename``, so that a later run recognises an earlier
run's chunks. Without it, only the unchunked name is recognised (stale chunks stay)."""

from __future__ import annotations

import re

try:
    from onnx_ir._shard_filename import get_shard_filename
except ImportError:  # pragma: no cover - another onnx_ir
    get_shard_filename = None


def chunk_names(single: str) -> re.Pattern[str] | None:
    """The names of the chunks onnx_ir writes for the data file ``single``, or None."""
    if get_shard_filename is None:
        return None  # pragma: no cover
    head, _, tail = get_shard_filename(single, 1, 2).partition("-00001-of-00002")
    return re.compile(rf"{re.escape(head)}-\d{{5}}-of-\d{{5}}{re.escape(tail)}")
