"""The errors of the private-API layer (:mod:`rewrite._private`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

from rewrite.errors import first_line

_REWRITE = Path(__file__).resolve().parents[1]
"""The ``rewrite`` package's folder: an error raised by a file in it is rewrite's own."""


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


def raised_by_rewrite(error: BaseException) -> bool:
    """Whether the innermost Python frame of ``error``'s traceback is in ``rewrite``'s code
    (a bug of rewrite's, or a deliberate error of its own), not in the library it called."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_REWRITE)


@contextlib.contextmanager
def library_code(wrap: Callable[[Exception], Exception],
                 passing: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Around a call into a library's code for a program: an error raised in that code
    becomes ``wrap(error)``, raised from it (the library's exception chained); the errors in
    ``passing``, and any error raised in rewrite's own code (a bug: exit 3), pass unchanged."""
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
