"""The errors of the private-API layer (:mod:`rewrite._private`)."""

from __future__ import annotations


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
        text = str(error).strip()
        line = text.splitlines()[0] if text else ""
        return cls(f"{type(error).__name__}: {line}" if line else type(error).__name__)
