"""One way to replace a private function of another library while a block runs.

The replacement is process-wide while the block runs: swapped blocks run one at a time
(:func:`rewrite._private.exclusive.exclusive`), so that two threads never restore each
other's swap."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from rewrite._private.exclusive import exclusive

_MISSING = object()


@contextlib.contextmanager
def swapped(owner: Any, name: str, replacement: Any, *, expected: Any = _MISSING
            ) -> Iterator[bool]:
    """Within the block, ``owner.name`` is ``replacement``; restored afterwards, also on an
    error. Yields whether it was swapped: not when ``owner`` is None, has no ``name``, or (if
    given) its ``name`` is not ``expected`` (the library changed: callers then run as they
    would without the swap). The block holds :func:`exclusive`."""
    with exclusive():
        original = getattr(owner, name, _MISSING) if owner is not None else _MISSING
        if original is _MISSING or (expected is not _MISSING and original is not expected):
            yield False
            return
        setattr(owner, name, replacement)
        try:
            yield True
        finally:
            setattr(owner, name, original)
