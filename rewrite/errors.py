"""Typed errors: each maps to one CLI exit code and carries what a user needs to fix it; and
the one rule that decides whose fault a library's failure is (:func:`library_call`,
:func:`blame`): the input's (exit 2), the library's (exit 3, named with its version) or
rewrite's (exit 3)."""

from __future__ import annotations

import contextlib
import re
import sys
import unicodedata
from typing import Callable, Iterator, Protocol

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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _described(error: BaseException) -> str:
    """``Type: first line`` of ``error`` (terminal colours removed)."""
    line = _ANSI.sub("", first_line(error))
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


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


class VerificationError(RewriteError):
    """The written model disagrees with eager PyTorch on the check's inputs: it is not
    published. Exit code 1."""


class LibraryError(RewriteError):
    """A library rewrite calls (torch, onnxscript, onnx_ir, transformers) crashed on a program
    rewrite gave it: a bug in that library, or in how rewrite calls it. Exit code 3; names the
    library and its version; the library's exception is chained (``--verbose`` shows it)."""

    exit_code = 3

    def __init__(self, library: str, what: str, error: BaseException):
        self.library = library
        self.version = library_version(library)
        chain = causes(error)
        head, root = _described(chain[0]), _described(chain[-1])
        root = f"\n  cause: {root}" if len(chain) > 1 and root != head else ""
        super().__init__(
            f"{library} {self.version} failed {what}: {head}{root}\n  this is a bug in "
            f"{library} or in rewrite; rerun with --verbose for the traceback and report it")


class ModelWarning(UserWarning):
    """Something about the model the user should know: a slower path was taken (the CLI
    prints these as warnings)."""


_MACHINERY = frozenset({
    "torch", "onnxscript", "onnx_ir", "onnx", "onnxruntime", "sympy", "numpy", "safetensors",
    "huggingface_hub", "attrs", "typing_extensions", "_pytest",
})
"""Top-level packages whose frames are a library's machinery, never the culprit: the code a
library runs *for* someone (a model's ``forward``, a translation function, rewrite's own
callbacks) is judged by its own frames. Python's standard library counts too."""

_PROGRAMMING_ERRORS = (AssertionError, AttributeError, NameError, TypeError, IndexError,
                       KeyError, UnboundLocalError, RecursionError, ZeroDivisionError)
"""Raised by a library's own code on a program it accepted, these are its bugs (exit 3);
other types are its verdict on the input (exit 2)."""


def _package(frame) -> str:
    return (frame.f_globals.get("__name__") or "").split(".")[0]


def _culprit(error: BaseException, skip_first: bool) -> str | None:
    """The top-level package of the innermost frame of ``error``'s traceback that is not a
    library's machinery (:data:`_MACHINERY`, the standard library), past the library's
    entry; None when only machinery ran. ``skip_first``: the first frame is the caller's
    (where the ``with`` block is), before the library was entered."""
    tb = error.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    entered = not skip_first
    culprit = None
    for frame in frames[1:] if skip_first else frames:
        package = _package(frame)
        if package in _MACHINERY or package in sys.stdlib_module_names:
            entered = True
        elif entered:
            culprit = package
    if not entered and frames:  # raised before any library ran: by the caller's own code
        return _package(frames[-1])
    return culprit


def blame(error: BaseException) -> str:
    """Whose fault ``error``, raised while a library ran, is: ``rewrite`` (a bug of ours: its
    innermost frame that is not a library's machinery is rewrite's code, such as a forward
    of ours that ``torch.export`` traces, or any exception it wraps is), ``input`` (the
    model's own code raised, or the library rejected the input: an error type other than
    :data:`_PROGRAMMING_ERRORS`), or ``library`` (the library's own code crashed)."""
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 32:
        chain.append(chain[-1].__cause__)
    culprits = [_culprit(e, skip_first=(k == 0)) for k, e in enumerate(chain)]
    if "rewrite" in culprits:
        return "rewrite"
    if any(c is not None for c in culprits):
        return "input"
    if isinstance(chain[-1], _PROGRAMMING_ERRORS) or isinstance(error, _PROGRAMMING_ERRORS):
        return "library"
    return "input"


@contextlib.contextmanager
def library_call(library: str, what: str,
                 rejected: Callable[[BaseException], Exception] | None = None, *,
                 parses_input: bool = False) -> Iterator[None]:
    """Around every call into a library (torch, onnxscript, onnx_ir, transformers) with a
    program or model: the one place that decides whose fault a failure is (:func:`blame`).

    rewrite's own errors (:class:`RewriteError`, the private layer's ``Unavailable`` /
    ``TorchFailed``: raised in rewrite's code) and rewrite's bugs pass unchanged (exit 3); a
    library's verdict on the input becomes ``rejected(error)`` (an :class:`InputError`, exit
    2), raised from it; a library's crash, or any failure where ``rejected`` is None (the
    input is rewrite's own, valid program), a :class:`LibraryError` naming ``library``, its
    version and ``what`` it was doing (exit 3). ``parses_input``: the library reads the
    user's files (transformers' ``from_pretrained``, an ONNX or ``.pt2`` deserializer), so
    any failure of its own is the input's too."""
    try:
        yield
    except RewriteError:
        raise
    except Exception as e:
        fault = blame(e)
        if fault == "rewrite":
            raise
        if (fault == "input" or parses_input) and rejected is not None:
            raise rejected(e) from e
        raise LibraryError(library, what, e) from e


def library_version(library: str) -> str:
    """The installed version of ``library`` (its distribution: ``torch.onnx`` -> torch), or
    ``?``."""
    from importlib import metadata

    try:
        return metadata.version(library.split(".")[0].replace("_", "-"))
    except metadata.PackageNotFoundError:
        return "?"
