"""The two consoles of the CLI: results on stdout, everything else on stderr.

Diagnostics are never wrapped to the terminal width (a ``file:line:col`` line must stay one
line for editors and grep), never read as rich markup or emoji codes (paths and rule text are
printed as given), and colour only the severity word, only on a terminal.
"""

from __future__ import annotations

import re
import traceback

from attrs import frozen
from rich.console import Console
from rich.text import Text

from rewrite.errors import Diagnostic

_SEVERITY = re.compile(r"(?m)(?<=: )(error|warning|internal error)(?=:)|^(error|warning)(?=:)")
_STYLES = {"error": "bold red", "warning": "yellow", "internal error": "bold red"}


_UNBOUNDED = 10_000
"""Width used when the output is not a terminal: tables are never cut to 80 columns."""


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away (``rewrite explain ... | head``): ``main`` exits 141, as a
        process killed by SIGPIPE (rich's own handler exits 1, the code of a rules error)."""
        self.quiet = True
        raise BrokenPipeError


def _console(*, stderr: bool) -> Console:
    # stderr never wraps (diagnostics, also the backends' messages); stdout's trees may wrap
    console = _Console(stderr=stderr, soft_wrap=stderr, highlight=False, markup=False,
                       emoji=False)
    if not console.is_terminal:
        console.width = _UNBOUNDED
    return console


@frozen
class Consoles:
    """``out`` for what the user asked for, ``err`` for diagnostics, warnings and progress."""

    out: Console
    err: Console
    quiet: bool = False
    verbose: bool = False

    @classmethod
    def create(cls, *, quiet: bool = False, verbose: bool = False) -> "Consoles":
        return cls(_console(stderr=False), _console(stderr=True), quiet, verbose)

    def error(self, text: str) -> None:
        """An error message (printed even with ``--quiet``)."""
        self.err.print(_styled(text), soft_wrap=True)

    def warning(self, item: Diagnostic | str) -> None:
        """A warning (dropped with ``--quiet``); with ``--verbose``, the traceback of the
        exception behind it (:attr:`Diagnostic.cause`)."""
        if not self.quiet:
            text = item.render() if isinstance(item, Diagnostic) else f"warning: {item}"
            self.err.print(_styled(text), soft_wrap=True)
            if isinstance(item, Diagnostic):
                self.trace(item.cause)

    def trace(self, error: BaseException | None) -> None:
        """With ``--verbose``, the traceback of ``error`` (and of what it chains)."""
        if self.verbose and error is not None:
            text = "".join(traceback.format_exception(error)).rstrip()
            self.err.print(Text(text, style="dim"), soft_wrap=True)

    def info(self, text: str) -> None:
        """A short note on stderr such as ``wrote out.onnx`` (dropped with ``--quiet``)."""
        if not self.quiet:
            self.err.print(Text(text), soft_wrap=True)

    def detail(self, text: str) -> None:
        """Extra detail shown with ``--verbose`` only."""
        if self.verbose:
            self.err.print(Text(text, style="dim"), soft_wrap=True)


def _styled(text: str) -> Text:
    """``text`` as plain text with the severity words coloured."""
    styled = Text(text)
    for match in _SEVERITY.finditer(text):
        word = match.group(1) or match.group(2)
        styled.stylize(_STYLES[word], match.start(), match.end())
    return styled
