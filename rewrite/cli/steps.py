"""Progress on a rich console: the CLI's own long steps and the backends' (one class).

A step shows a spinner while it runs (on a terminal, not with ``--quiet``), then its time:
for the CLI's steps (loading a model, grouping) with ``--verbose`` only, for the ONNX
backend's (export, outlining, optimizing) always, as ``<step>: done in 1.2s``. The backend
reports through :class:`rewrite.backends.onnx.progress.Progress`, which this implements.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

from rewrite.cli.console import Consoles


class Steps:
    """``with steps.step("loading model.pt2"):`` around each long piece of work."""

    def __init__(self, console: Console | None, *, spinner: bool = True,
                 finished: Callable[[str, float], None] | None = None) -> None:
        self.console = console
        """Where spinners and notes go (None: nowhere)."""
        self.spinner = spinner and console is not None
        self.finished = finished if finished is not None else self._done
        """Called with a step's text and seconds when it ends."""
        self._status = None
        self._text = ""
        self._transfer_start: float | None = None

    @classmethod
    def of(cls, consoles: Consoles) -> "Steps":
        """The CLI's own steps: times with ``--verbose`` only."""
        return cls(consoles.err, spinner=consoles.err.is_terminal and not consoles.quiet,
                   finished=lambda text, seconds: consoles.detail(f"{text}: {seconds:.1f}s"))

    @classmethod
    def backend(cls, consoles: Consoles) -> "Steps":
        """Where a backend reports: stderr, unless ``--quiet``."""
        return cls(None if consoles.quiet else consoles.err)

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        if self.console is None:
            yield
            return
        start = time.perf_counter()
        self._text, self._transfer_start = text, None
        if self.spinner:
            with self.console.status(text + " ...", spinner="dots") as status:
                self._status = status
                try:
                    yield
                finally:
                    self._status = None
        else:
            yield
        self.finished(text, time.perf_counter() - start)

    def update(self, text: str) -> None:
        """Change the text of the running step's spinner (cheap; call it freely)."""
        if self._status is not None:
            self._status.update(text)

    def transfer(self, done: int, total: int) -> None:
        """A bar with bytes and bytes/s on the running step's spinner line."""
        if self._status is None:
            return
        now = time.perf_counter()
        if done == 0 or self._transfer_start is None:
            self._transfer_start = now
        seconds = now - self._transfer_start
        rate = f"{done / seconds / 1e9:.2f} GB/s" if seconds > 0.2 else ""
        row = Table.grid(padding=(0, 1))
        row.add_row(self._text, ProgressBar(total=max(total, 1), completed=done, width=30),
                    f"{done / 1e9:.2f}/{total / 1e9:.2f} GB", rate)
        self._status.update(row)

    def note(self, text: str) -> None:
        """A line on the console, as it is (no markup, no highlighting)."""
        if self.console is not None:
            self.console.print(text, markup=False, highlight=False)

    def _done(self, text: str, seconds: float) -> None:
        self.note(f"{text}: done in {seconds:.1f}s")
