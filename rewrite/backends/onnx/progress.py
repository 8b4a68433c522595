"""How the ONNX backend reports on its long steps: through a :class:`Progress` the caller
passes, which renders it (the CLI's :class:`rewrite.cli.steps.Steps` on a console) or not.

The backend only calls it: ``with progress.step("exporting"):`` around a long step,
``progress.update(text)`` while one runs (cheap, call it freely), ``progress.transfer(done,
total)`` while a step moves bytes (writing weights), ``progress.note(text)`` for a line worth
showing (a warning, what was written). :data:`SILENT` shows nothing.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator, Protocol


class Progress(Protocol):
    """What the backend calls to report (see the module docstring)."""

    def step(self, text: str) -> ContextManager[None]:
        """Around a long step named ``text``."""
        ...

    def update(self, text: str) -> None:
        """The running step's text changes (``outlining groups: 3/12``)."""
        ...

    def transfer(self, done: int, total: int) -> None:
        """The running step has moved ``done`` of ``total`` bytes."""
        ...

    def note(self, text: str) -> None:
        """A line of information (a rendered warning, a summary)."""
        ...


class _Silent:
    """Reports nothing: the default of library calls."""

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        yield

    def update(self, text: str) -> None:
        pass

    def transfer(self, done: int, total: int) -> None:
        pass

    def note(self, text: str) -> None:
        pass


SILENT: Progress = _Silent()
