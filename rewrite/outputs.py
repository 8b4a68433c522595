"""Writing results safely: never a partial file, never over the input."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from rewrite.errors import InputError


def check_output_path(output: str | Path, inputs: Iterable[str | Path]) -> Path:
    """Raise :class:`InputError` when ``output`` is an input, a folder, or not writable."""
    out = Path(output)
    for given in inputs:
        given = Path(given)
        if given.exists() and out.exists() and out.resolve() == given.resolve():
            raise InputError(f"{out}: output path is the input; refusing to overwrite it")
        if out.resolve() == given.resolve():
            raise InputError(f"{out}: output path is the input; refusing to overwrite it")
    if out.is_dir():
        raise InputError(f"{out}: is a directory; give a file name like {out / 'model.onnx'}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{out}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise InputError(f"{out}: folder {parent} is not writable")
    return out


@contextlib.contextmanager
def atomic_path(output: str | Path):
    """Yield a temporary path beside ``output``; rename it over ``output`` only on success."""
    out = Path(output)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent or ".")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, out)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


def write_text_atomic(output: str | Path, text: str) -> None:
    with atomic_path(output) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_atomic(output: str | Path, writer: Callable[[Path], None]) -> None:
    with atomic_path(output) as tmp:
        writer(tmp)
