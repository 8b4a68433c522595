"""The ``rewrite`` command's logging while it runs (rewrite/cli/logs.py): the libraries'
chatter off, the caller's settings restored after."""

from __future__ import annotations

import logging

from rewrite.cli.logs import quiet_libraries


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_transformers_kernel_advice_is_dropped_while_a_command_runs():
    """transformers advises installing ``causal_conv1d`` or ``fla`` when a hybrid's eager
    model falls back to torch code; rewrite exports its own scans, never those kernels, so
    the command drops the advice; the logger's level is restored after."""
    from transformers.integrations import hub_kernels

    logger, kept = hub_kernels.logger, _Kept()
    level = logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.WARNING)  # as a caller that wants transformers' warnings
    try:
        with quiet_libraries():
            logger.warning("`chunk_kda` is falling back to its reference implementation")
        assert kept.messages == []
        logger.warning("after the command")
        assert kept.messages == ["after the command"]
        assert logger.level == logging.WARNING
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
