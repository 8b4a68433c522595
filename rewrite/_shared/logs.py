"""Muting the log chatter of the libraries rewrite drives (torch.onnx, onnxscript, onnx_ir)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


@contextlib.contextmanager
def muted(*names: str) -> Iterator[None]:
    """Loggers ``names`` say errors only while inside; their levels are restored after."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
