"""Progress of long steps (export, outlining) on a rich console; silent without one."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from rich.console import Console


class Progress:
    """``with progress.step("exporting"):`` shows a spinner, then the step's time."""

    def __init__(self, console: "Console | None" = None) -> None:
        self.console = console
        self._status = None

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        if self.console is None:
            yield
            return
        start = time.perf_counter()
        with self.console.status(text + "...") as status:
            self._status = status
            try:
                yield
            finally:
                self._status = None
        self.console.print(f"{text}: done in {time.perf_counter() - start:.1f}s",
                           markup=False, highlight=False)

    def update(self, text: str) -> None:
        """Change the text of the running step's spinner (cheap; call it freely)."""
        if self._status is not None:
            self._status.update(text)
