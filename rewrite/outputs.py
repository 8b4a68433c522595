"""Writing results safely: never a partial file, never over an input.

``check_output_path`` refuses, before any slow work, an output that is an input, a folder, a
special file, or in a folder that does not exist or cannot be written. ``atomic_path`` yields
a temporary file beside the output and renames it over the output only when the writer
finished; on any error (or Ctrl-C) the temporary file is removed and the output untouched.
``publish`` does the same for a set of files that belong together (a model and its external
data): they replace the old set as one, in an order that never pairs a new model with old data
or an old model with new data.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from rewrite.errors import InputError


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (symlinks, ``..`` and hard links included)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _missing_folder(folder: Path) -> str:
    """Why ``folder`` cannot hold files: the first part of it that is a file, or missing."""
    for part in [*reversed(folder.parents), folder]:
        if part.exists() and not part.is_dir():
            return f"{part} is a file, not a folder"
    return f"folder {folder} does not exist"


def check_output_path(output: str | Path, inputs: Iterable[str | Path]) -> Path:
    """Raise :class:`InputError` when ``output`` cannot safely be written; return it.

    Refused: an output that is one of ``inputs``, a folder, an existing non-regular file
    (``/dev/null`` would be replaced, not written to), or whose folder is missing, is a file,
    or is not writable.
    """
    out = Path(output)
    if str(output) == "" or out.name in ("", ".", ".."):
        raise InputError(f"{str(output)!r}: not a file name")
    for given in inputs:
        if _same_file(out, Path(given)):
            raise InputError(f"{out}: output path is the input {given}; refusing to overwrite it")
    if out.is_dir():
        raise InputError(f"{out}: is a directory; give a file name like {out / 'model.onnx'}")
    if out.exists() and not out.is_file():
        raise InputError(f"{out}: exists and is not a regular file; refusing to replace it")
    parent = out.parent
    if not parent.is_dir():
        raise InputError(f"{out}: cannot write there: {_missing_folder(parent)}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: folder {parent} is not writable")
    return out


def _new_file_mode(existing: Path) -> int:
    """The mode the output should get: the replaced file's, else what ``open`` would give."""
    try:
        return stat.S_IMODE(existing.stat().st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_path(output: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``output``; rename it over ``output`` only on success.

    ``OSError`` (no space, no permission...) becomes :class:`InputError` naming ``output``.
    """
    out = Path(output)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        os.close(fd)
    except OSError as e:
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from None
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _new_file_mode(out))
        os.replace(tmp_path, out)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


def write_text_atomic(output: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``output`` whole or not at all."""
    with atomic_path(output) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """Exclusive among rewrite processes publishing into ``folder`` (two runs writing the
    same output never interleave their renames)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def publish(staged: dict[Path, Path], *, replaces: Iterable[Path] = ()) -> None:
    """Move each staged file (written completely, in the destinations' folder) to its
    destination, as one change: the first entry is the file that refers to the others (the
    model), published last; old destinations and the stale files ``replaces`` names are
    moved away first, so that at no moment does an old model sit beside new data or a new
    model beside old data. On an error the old files are put back."""
    items = list(staged.items())
    model_tmp, model_out = items[0]
    folder = model_out.parent
    aside = Path(tempfile.mkdtemp(prefix=f".{model_out.name}.old.", dir=folder))
    moved: list[tuple[Path, Path]] = []  # (where it is now, where it was)
    placed: list[Path] = []
    olds = [model_out, *(dst for _, dst in items[1:]), *replaces]
    try:
        with _folder_locked(folder):
            try:
                for k, old in enumerate(dict.fromkeys(olds)):  # the old model first
                    if old.is_file():
                        kept = aside / f"{k}"
                        os.replace(old, kept)
                        moved.append((kept, old))
                for tmp, dst in [*items[1:], items[0]]:  # the new model last
                    was = next((k for k, o in moved if o == dst), dst)
                    os.chmod(tmp, _new_file_mode(was))
                    os.replace(tmp, dst)
                    placed.append(dst)
            except BaseException:
                for dst in placed:
                    with contextlib.suppress(OSError):
                        dst.unlink()
                for kept, old in moved:
                    with contextlib.suppress(OSError):
                        os.replace(kept, old)
                raise
    finally:
        for kept, _ in moved:
            with contextlib.suppress(OSError):
                kept.unlink()
        with contextlib.suppress(OSError):
            aside.rmdir()
