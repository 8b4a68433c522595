"""Say why ``torch.onnx.export`` failed: its step, and the causes it wrapped, without traces.

The exporter raises a ``ConversionError`` whose first line is only the step that failed
("Failed to decompose the FX graph ... This is step 2/3"), followed by advice, and chains the
real causes (``Cannot view a tensor with shape ...``, ``No ONNX function found for ...``) as
``__cause__``. Keeping the first line alone hid them; this keeps the first line of each.
"""

from __future__ import annotations

import re

from rewrite.errors import InputError, causes

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"This is step (\d)/(\d)")
_NOISE = re.compile(r"\s*See the stack trace for more information\.?\s*$")
_MAX_CAUSES = 4
_MAX_LINE = 400


def torch_onnx_failure(error: BaseException) -> InputError:
    """The :class:`InputError` for a program ``torch.onnx.export`` rejects (an op it cannot
    translate, a shape it cannot decompose): which step of torch's exporter failed (not the
    rules), then one line per cause, the root cause last."""
    chain = causes(error)
    head = _first_line(chain[0])
    step = _STEP.search(head)
    what = head.split(". ")[0].rstrip(".").removeprefix("Failed to ") if step else ""
    where = f" at step {step.group(1)}/{step.group(2)} ({what})" if step else ""
    lines = [
        "torch.onnx.export cannot convert this program: torch's ONNX exporter, not the rules, "
        f"failed{where}"
    ]
    said = [_describe(e) for e in (chain[1:] if step else chain)]
    said = [c for i, c in enumerate(said) if c and c not in said[:i]]
    if len(said) > _MAX_CAUSES:  # the outermost wrappers say least; keep the root causes
        said = said[-_MAX_CAUSES:]
    lines += [f"  cause: {c}" for c in said]
    return InputError("\n".join(lines))


def _first_line(error: BaseException) -> str:
    text = _ANSI.sub("", str(error)).strip()
    return text.splitlines()[0].strip() if text else ""


def _describe(error: BaseException) -> str:
    """``Type: first line`` (no stack trace, no advice), shortened if very long."""
    line = _NOISE.sub("", _first_line(error))
    if not line:
        return type(error).__name__
    if len(line) > _MAX_LINE:
        line = line[: _MAX_LINE - 3] + "..."
    return f"{type(error).__name__}: {line}"
