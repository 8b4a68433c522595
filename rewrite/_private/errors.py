"""The errors of the private-API layer (:mod:`rewrite._private`), and the one rule that
decides whose fault a library's failure is (:func:`library_call`, :func:`blame`): the
input's (exit 2), the library's (exit 3, named with its version) or rewrite's (exit 3)."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator

from rewrite.errors import LibraryError, RewriteError, first_line


class Unavailable(Exception):
    """A private API is missing or not what its shim was written against (see
    :data:`rewrite._private.CHECKED_WITH`): the caller takes a public path."""


class TorchFailed(Exception):
    """torch's own code (its decomposition, functionalization or translation, called through
    a shim) raised on this program: the per-body path does not apply (torch.onnx.export of the flat
    program, which runs the same code, says what fails, or succeeds)."""

    @classmethod
    def of(cls, error: BaseException) -> "TorchFailed":
        """``Type: first line`` of ``error``."""
        line = first_line(error)
        return cls(f"{type(error).__name__}: {line}" if line else type(error).__name__)


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


def raised_by_rewrite(error: BaseException) -> bool:
    """Whether ``error`` is rewrite's own (:func:`blame`): a bug, not the library's."""
    return blame(error) == "rewrite"


@contextlib.contextmanager
def library_call(library: str, what: str,
                 rejected: Callable[[BaseException], Exception] | None = None, *,
                 parses_input: bool = False) -> Iterator[None]:
    """Around every call into a library (torch, onnxscript, onnx_ir, transformers) with a
    program or model: the one place that decides whose fault a failure is (:func:`blame`).

    rewrite's own errors (:class:`~rewrite.errors.RewriteError`, the private layer's
    :class:`Unavailable` / :class:`TorchFailed`) and rewrite's bugs pass unchanged (exit 3);
    a library's verdict on the input becomes ``rejected(error)`` (an
    :class:`~rewrite.errors.InputError`, exit 2), raised from it; a library's crash, or any
    failure where ``rejected`` is None (the input is rewrite's own, valid program), a
    :class:`~rewrite.errors.LibraryError` naming ``library``, its version and ``what`` it was
    doing (exit 3). ``parses_input``: the library reads the user's files (transformers'
    ``from_pretrained``), so any failure of its own is the input's too."""
    try:
        yield
    except (RewriteError, Unavailable, TorchFailed):
        raise
    except Exception as e:
        fault = blame(e)
        if fault == "rewrite":
            raise
        if (fault == "input" or parses_input) and rejected is not None:
            raise rejected(e) from e
        raise LibraryError(library, what, e) from e


@contextlib.contextmanager
def library_code(wrap: Callable[[Exception], Exception],
                 passing: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Inside the private layer: an error raised in a library's code becomes
    ``wrap(error)``, raised from it; the errors in ``passing``, and rewrite's own
    (:func:`blame`), pass unchanged."""
    try:
        yield
    except passing:
        raise
    except Exception as e:
        if raised_by_rewrite(e):
            raise
        raise wrap(e) from e


def torch_code() -> contextlib.AbstractContextManager[None]:
    """Around a call into torch's (or onnxscript's) code for a program: an error raised in
    that code becomes :class:`TorchFailed` (the per-body path does not apply); the layer's
    own errors, and any error raised in rewrite's code (a bug), pass unchanged."""
    return library_code(TorchFailed.of, (Unavailable, TorchFailed))
