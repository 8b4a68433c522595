"""What every part of :mod:`torch_private` shares: the versions checked, the errors."""

from __future__ import annotations

CHECKED_TORCH_VERSIONS = ("2.13.0",)
"""torch versions the private APIs of :mod:`torch_private` were checked against."""


class Unavailable(Exception):
    """The private APIs are not what this module was written against."""


class TorchFailed(Exception):
    """torch's own code (its decomposition, functionalization or translation) raised on this
    program: the per-body path does not apply (torch.onnx.export of the flat program, which
    runs the same code, says what fails, or succeeds)."""

    @classmethod
    def of(cls, error: BaseException) -> "TorchFailed":
        """``Type: first line`` of ``error``."""
        text = str(error).strip()
        line = text.splitlines()[0] if text else ""
        return cls(f"{type(error).__name__}: {line}" if line else type(error).__name__)
