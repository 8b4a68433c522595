"""Giving the memory a process freed back to the system before a step that needs much more
(onnxruntime opening a model to check it).

glibc keeps most of what is freed (a weight's temporaries, a serialized model's pieces) in
its heap for later allocations: the process's resident memory stays at its high-water mark,
and a step that maps or allocates its own (onnxruntime's session) adds to it. ``malloc_trim``
returns the heap's free pages (measured on the 187M int4 export: ~150 MB before its check
opens onnxruntime).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Callable


def give_back_freed() -> None:
    """Return the heap's free pages to the system (glibc's ``malloc_trim``); nothing where
    the C library has none."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim") if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None
