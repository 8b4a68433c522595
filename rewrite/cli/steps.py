"""Progress of the CLI's own long steps (loading a model, grouping) on stderr.

On a terminal a step shows a rich spinner while it runs; with ``--verbose`` its time is
printed when it ends; with ``--quiet``, or when stderr is not a terminal, nothing is shown.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

from rewrite.cli.console import Consoles


class Steps:
    """``with steps.step("loading model.pt2"):`` around each long piece of work."""

    def __init__(self, consoles: Consoles) -> None:
        self.consoles = consoles
        self.spinner = consoles.err.is_terminal and not consoles.quiet

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        start = time.perf_counter()
        if self.spinner:
            with self.consoles.err.status(text + " ...", spinner="dots"):
                yield
        else:
            yield
        self.consoles.detail(f"{text}: {time.perf_counter() - start:.1f}s")

    @property
    def console(self):
        """The console a backend may draw its own progress on (None when quiet)."""
        return None if self.consoles.quiet else self.consoles.err
