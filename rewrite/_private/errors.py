"""The errors of the private-API layer (:mod:`rewrite._private`); whose fault a failure is
comes from the one rule, :func:`rewrite.errors.blame`."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from rewrite.errors import blame, first_line


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
        if blame(e) == "rewrite":
            raise
        raise wrap(e) from e


def torch_code() -> contextlib.AbstractContextManager[None]:
    """Around a call into torch's (or onnxscript's) code for a program: an error raised in
    that code becomes :class:`TorchFailed` (the per-body path does not apply); the layer's
    own errors, and any error raised in rewrite's code (a bug), pass unchanged."""
    return library_code(TorchFailed.of, (Unavailable, TorchFailed))
