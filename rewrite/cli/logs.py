"""The process's logging while a command runs: the libraries' log chatter off stderr.

The library never changes logging (levels, handlers, transformers' progress bars: a program
calling rewrite configures its own process); the ``rewrite`` command owns its process, so it
keeps stderr for its own lines while a command runs (:func:`quiet_libraries`), and restores
everything afterwards (``main`` may be called in-process).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

CHATTY = ("torch.onnx", "onnxscript", "onnx_ir", "transformers.integrations.hub_kernels")
"""Loggers that say errors only: torch.onnx's and onnxscript's notices (torchvision, failed
folding attempts), onnx_ir's, and transformers' advice to install a kernel package when its
eager model falls back to torch code (``causal_conv1d``, ``fla``): the export traces
rewrite's own scans, never those kernels, so the advice would change nothing."""
TORCH_EXPORT = ("torch.export", "torch._export")
"""torch.export's loggers, which log with a traceback what they could not read or
export (the command reports it in one line; ``-v`` shows the exception)."""


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """While inside, :data:`CHATTY` say errors only and :data:`TORCH_EXPORT` say nothing;
    restored after. Imports torch (whose import sets its loggers up)."""
    import torch  # noqa: F401  (its logging is set up on import: set it after)

    with muted(*CHATTY), _silenced(*TORCH_EXPORT):
        yield


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


@contextlib.contextmanager
def _silenced(*names: str) -> Iterator[None]:
    """Loggers ``names`` and those below them write nothing while inside (torch's logging
    gives some, ``torch._export.serde.serialize``, a stderr handler of their own that does
    not propagate)."""
    sink = logging.NullHandler()
    below = tuple(f"{name}." for name in names)
    known = [name for name in list(logging.root.manager.loggerDict) if name.startswith(below)]
    saved = []
    for name in (*names, *known):
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers[:] = [sink]
        logger.propagate = False
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers[:] = handlers
            logger.propagate = propagate


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off while inside (``from_pretrained``'s "Loading
    weights": the command's steps report the loading), when transformers is installed."""
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        yield
        return
    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()
