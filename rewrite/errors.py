"""Typed errors: each maps to one CLI exit code and carries what a user needs to fix it."""

from __future__ import annotations

import unicodedata
from typing import Protocol

from attrs import field, frozen


class Location(Protocol):
    """Where a diagnostic points (a rules file's ``rewrite.lang.source.Span``)."""

    @property
    def location(self) -> str:
        """``file:line:col``."""

    @property
    def source_line(self) -> str | None:
        """The text of the line, without its newline."""

    @property
    def column(self) -> int:
        """1-based, in characters."""


@frozen
class Diagnostic:
    """One message about a rules file, printed as ``file:line:col: severity: message``."""

    severity: str
    """``error`` or ``warning``."""
    message: str
    span: Location | None = None
    """Where in the rules text; None for messages about the whole run."""
    hint: str | None = None
    """A suggestion such as ``did you mean 'class'?``."""
    cause: BaseException | None = field(default=None, eq=False, repr=False)
    """The exception behind a warning (a dependency's, e.g. why per-body lowering did not
    apply): the CLI shows its traceback with ``--verbose``."""

    def render(self) -> str:
        """The message with its location, the source line and a caret under the column."""
        if self.span is None:
            text = f"{self.severity}: {self.message}"
        else:
            text = f"{self.span.location}: {self.severity}: {self.message}"
            line = self.span.source_line
            if line is not None and line.strip():
                shown, caret = _show_line(line, self.span.column)
                text += f"\n    {shown}\n    {caret}"
        if self.hint:
            text += f"\n  {self.hint}"
        return text


def _show_line(line: str, column: int) -> tuple[str, str]:
    """The line as it can be printed, and a caret under ``column`` (1-based, in characters).

    Control characters print as spaces; tabs stay tabs in both lines and wide characters get
    two caret columns, so the caret sits under the character in a terminal.
    """
    shown = "".join(c if c.isprintable() or c == "\t" else " " for c in line)
    pad = []
    for c in shown[: max(column - 1, 0)]:
        if c == "\t":
            pad.append("\t")
        elif unicodedata.east_asian_width(c) in ("W", "F"):
            pad.append("  ")
        elif not unicodedata.combining(c):
            pad.append(" ")
    return shown, "".join(pad) + "^"


def causes(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it wraps (``__cause__``, else a ``__context__`` not
    suppressed), outermost first, each once: the root cause is last."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not e for e in chain):
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return chain


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (no trace, no advice after it); ``""`` if empty."""
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


class RewriteError(Exception):
    """Base class of every error ``rewrite`` raises on purpose."""

    exit_code = 1

    def render(self) -> str:
        return str(self)


class RuleError(RewriteError):
    """The rules text is invalid (syntax, unknown name, include cycle...). Exit code 1."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))


class GroupingError(RewriteError):
    """The rules cannot group this graph (cycle, conflict, split order). Exit code 1."""

    def __init__(self, message: str, *, rule: str | None = None, nodes: tuple[str, ...] = ()):
        self.rule = rule
        self.nodes = tuple(nodes)
        text = message
        if rule:
            text = f"{rule}: error: {message}"
        if nodes:
            shown = ", ".join(nodes[:8]) + (
                f", ... ({len(nodes)} in all)" if len(nodes) > 8 else "")
            text += f"\n  nodes involved: {shown}"
        super().__init__(text)


class InputError(RewriteError):
    """The model or an output path is unusable (missing, corrupt, wrong kind). Exit code 2."""

    exit_code = 2


class DependencyError(InputError):
    """A library rewrite calls (torch's exporter, onnxscript's optimizer) failed on a valid
    program: this model cannot be converted with it. Exit code 2, as for unusable input; the
    library's exception is chained (``raise ... from e``) and ``--verbose`` shows it."""


class ModelWarning(UserWarning):
    """Something about the model the user should know: a slower path was taken (the CLI
    prints these as warnings)."""
