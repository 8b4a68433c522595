"""One at a time in a process: the blocks that drive libraries keeping process-wide state.

torch.export and torch.onnx keep state in module globals while they trace (torch.export's
module hierarchy, the proxy mode stack, ``torch.fx.traceback``'s node-meta flag, torch's
config patches); transformers sets torch's default dtype and replaces ``torch.nn.init``'s
functions while it builds a model; a :mod:`._swap` replaces a library's function for the
whole process while its block runs. Two such blocks in two threads break each other (two
``torch.export`` calls in threads fail with "Trying to pop empty mode stack"), so rewrite
runs each of them holding one re-entrant lock: ``rewrite.export`` or ``Result.to_onnx``
called from threads give what they give one after another. The lock orders rewrite's own
calls only: code outside rewrite that calls torch.export at the same time is not covered.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

_LOCK = threading.RLock()


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Run the block alone among rewrite's blocks of this kind in this process (nested
    blocks of one thread are fine)."""
    with _LOCK:
        yield
