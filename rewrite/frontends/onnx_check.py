"""Refuse an ONNX input that is itself invalid, before grouping it.

``rewrite`` outlines what it is given: an input that breaks the ONNX rules (a node reading a
value nothing defines, nodes out of order, an unknown operator, a missing opset import...)
would come out as an invalid output. ``onnx.checker`` with ``full_check`` (types and shapes
too) says so first, and the message says the input is at fault. About 70 ms on a 5,800-node
model; the command line runs it on every ``.onnx`` it reads.
"""

from __future__ import annotations

from pathlib import Path

from rewrite.errors import InputError, causes

_UNREADABLE = ("Unable to parse proto", "Unable to open proto")


def check_onnx_input(path: str | Path) -> None:
    """Raise :class:`InputError` (``PATH: the input model is invalid: ...``) when the ONNX
    checker refuses the model at ``path`` (read from the path, so external data works)."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError, and a few others
        reason = _reason(e)
        if reason.startswith(_UNREADABLE):
            return  # not a model at all: the loader says so, with its own reason
        raise InputError(f"{path}: the input model is invalid: {reason}") from None


def _reason(e: BaseException) -> str:
    """The checker's message on one line (it spreads a node's description over several)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300] + ("..." if len(text) > 300 else "")


def unwritable_input(path: str | Path, error: BaseException) -> InputError | None:
    """The :class:`InputError` for an output that cannot be serialized because of what the
    input ``path`` holds, or None when ``error`` is not that (a bug in rewrite).

    The checker does not look at text: a corrupt file may hold names that are not UTF-8;
    ``onnx_ir`` reads them as bytes and fails to write them back (``SerdeError`` caused by a
    ``TypeError`` or ``UnicodeError``)."""
    root = causes(error)[-1]
    if not str(path).lower().endswith(".onnx") or not isinstance(root, (TypeError,
                                                                         UnicodeError)):
        return None
    return InputError(f"{path}: the input model is invalid: it holds text that is not UTF-8 "
                      f"(a corrupt file?), which ONNX cannot write back ({_reason(root)})")
