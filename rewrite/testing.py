"""Structure locks in your own test suite: :func:`assert_structure`.

>>> from rewrite.testing import assert_structure
>>> assert_structure(rewrite.apply("gpt2", program), "tests/gpt2.lock")

It fails (``AssertionError``, the message the diff ``rewrite verify`` prints) when the
model's functions, calls or rules moved from what the lock file says. After a reviewed
change, rewrite the lock: ``update=True``, ``REWRITE_UPDATE_LOCKS=1`` in the environment, or
``rewrite verify ... --update``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rewrite.structure import Lock, compare, loads, of_lowering, of_model, read_onnx, render, write

UPDATE_VARIABLE = "REWRITE_UPDATE_LOCKS"


def structure_of(model: Any, rules: Any = None) -> Lock:
    """The :class:`Lock` of ``model``: a :class:`rewrite.Result` or a backend ``Lowering``
    (lowered as ``rewrite lock`` lowers: no weight read); with ``rules``, anything
    :func:`rewrite.apply` takes; without, an ``onnx_ir.Model`` or an ``.onnx`` path as it
    is."""
    import onnx_ir as ir

    from rewrite.api import Result, apply

    if isinstance(model, Lock):
        return model
    if rules is not None:
        model = apply(rules, model)
    if isinstance(model, Result):
        from rewrite.backends.onnx import OnnxOptions, lower

        return of_lowering(lower(model, OnnxOptions(check_weights=False)))
    if hasattr(model, "outlined") and hasattr(model, "tree"):  # a Lowering
        return of_lowering(model)
    if isinstance(model, ir.Model):
        return of_model(model)
    if isinstance(model, (str, Path)) and str(model).lower().endswith(".onnx"):
        return of_model(read_onnx(model))
    raise TypeError(f"assert_structure: give rules= to read {type(model).__name__} "
                    f"{model if isinstance(model, (str, Path)) else ''}".rstrip())


def assert_structure(model: Any, lock_path: str | Path, *, rules: Any = None,
                     update: bool = False) -> None:
    """Raise ``AssertionError`` with the readable diff when ``model``'s structure (see
    :func:`structure_of`) is not the one the lock file at ``lock_path`` holds. With
    ``update`` (or ``REWRITE_UPDATE_LOCKS=1``), write the lock instead (atomically)."""
    __tracebackhide__ = True  # pytest shows the assertion, not this frame
    found = structure_of(model, rules)
    path = Path(lock_path)
    if update or os.environ.get(UPDATE_VARIABLE) == "1":
        write(path, found)
        return
    if not path.exists():
        raise AssertionError(f"{path}: no lock file; write it with assert_structure(..., "
                             f"update=True), {UPDATE_VARIABLE}=1 or `rewrite lock`")
    changes = compare(loads(path.read_text(encoding="utf-8"), str(path)), found)
    if changes:
        name = getattr(model, "name", None) or (model if isinstance(model, (str, Path))
                                                else type(model).__name__)
        raise AssertionError(render(changes, str(path), str(name)))


__all__ = ["assert_structure", "structure_of"]
