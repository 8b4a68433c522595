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


class LibraryError(RewriteError):
    """A library rewrite calls (torch, onnxscript, onnx_ir, transformers) crashed on a program
    rewrite gave it: a bug in that library, or in how rewrite calls it. Exit code 3; names the
    library and its version; the library's exception is chained (``--verbose`` shows it)."""

    exit_code = 3

    def __init__(self, library: str, what: str, error: BaseException):
        self.library = library
        self.version = library_version(library)
        cause = first_line(error)
        super().__init__(
            f"{library} {self.version} failed {what}: {type(error).__name__}"
            f"{': ' + cause if cause else ''}\n  this is a bug in {library} or in rewrite; "
            "rerun with --verbose for the traceback and report it")


DependencyError = LibraryError
"""The former name of :class:`LibraryError` (it was an :class:`InputError`, exit 2)."""


class ModelWarning(UserWarning):
    """Something about the model the user should know: a slower path was taken (the CLI
    prints these as warnings)."""


def library_version(library: str) -> str:
    """The installed version of ``library`` (its distribution: ``torch.onnx`` -> torch), or
    ``?``."""
    from importlib import metadata

    try:
        return metadata.version(library.split(".")[0].replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "?"
