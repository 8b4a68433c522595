"""Writing results safely: never a partial file, never over an input.

``check_output_path`` refuses, before any slow work, an output that is an input, a folder, a
special file, or in a folder that does not exist or cannot be written. ``atomic_path`` yields
a temporary file beside the output and renames it over the output only when the writer
finished; on any error (or Ctrl-C) the temporary file is removed and the output untouched.
``staging_folder`` and ``publish`` do the same for a model and its external data, which
belong together: killed at any instant (SIGKILL, power cut), the output's name resolves to a
complete pair, the old one or the new one, never a mix and never a model without its data.

How, when the model refers to its data by name (``OUT.onnx`` holds ``location:
OUT.onnx.data``) and users expect that name to stay: a single rename is the only atomic step,
so the model is renamed twice. The new pair is written in a hidden staging folder
``.OUT.onnx.XXXXXXXX/`` beside the output (model and data under their final names), plus a
first model whose locations point into that folder (``.OUT.onnx.XXXXXXXX/OUT.onnx.data``).
Everything is fsynced (``staged``), then, under the output folder's lock (``locked``):

1. ``committed``: the first model renamed over ``OUT.onnx`` (and the folder fsynced): the new
   pair is visible, its data still in the staging folder; the old data is now unreferenced;
2. ``linked``: each data file hard-linked to its final name (``OUT.onnx.data``, replacing the
   old one by a rename), the folder fsynced: the model in place still reads the staging names,
   which are the same files;
3. ``published``: the final model renamed over ``OUT.onnx``;
4. ``cleaned``: the staging folder, stale data (``OUT.onnx.data`` or chunks of an earlier
   run that the new model does not use) and leftovers of killed runs removed.

Several models reading one data file (``OUT.onnx`` and ``OUT_seq1.onnx``, one per static
size: ``Staged.siblings``) are published together: in step 1 each further model's first copy
is renamed over its name, then the output's; models of an earlier run that the set does not
rewrite and that read the old data (``retire``) are removed right after, before step 2
replaces that data; step 3 renames each final model. Each file is always a whole model
with its data; killed between two renames of step 1, one model is the new run's and
another the old run's until the next run (one rename per name: no atomic switch of two).

Files that belong with the model (:class:`Beside`: ``genai_config.json``, tokenizer files)
are written in the staging folder too and moved to their names beside the output in step 2,
with the data (without data files: just before the model's rename). Each is whole, old or
new; a run killed between steps 1 and 2 leaves the new pair beside the old companions (a
``genai_config.json`` of the model before), until the next run.

A run killed before 1 leaves the old pair and its staging folder; killed after 1, a
complete new pair (reading the staging folder until 3). Leftovers are recognised by name
(``.OUT.onnx.XXXXXXXX``, and ``.OUT.onnx.old.XXXXXXXX`` of the rename-aside scheme before
this one) and removed by the next run's step 4, after its own commit (until then the output
may still read them); a live writer's staging folder is skipped, as each writer holds a
``flock`` on its own until it ends (the kernel releases it when the writer dies). The folder
lock serializes writers of one folder, so two runs never interleave these steps. Without the
two renames, the data's name would have to change with every run. Killed between steps 2
and 4, the data has two names until the next run: onnxruntime loads the pair, but
``onnx.checker`` refuses a data file with more than one link (it suspects a hard-link attack).
On a filesystem without hard links step 2 renames instead: killed between 2 and 3, the model
then lacks its data (an error on load, never wrong numbers) until the next run.

Readers are not locked out: a reader that opened the old model before step 1 and opens its
data after step 2 finds the new data.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from attrs import frozen

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
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from e
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _new_file_mode(out))
        os.replace(tmp_path, out)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise InputError(f"{out}: cannot write ({e.strerror or e})") from e
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


def write_text_atomic(output: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``output`` whole or not at all."""
    with atomic_path(output) as tmp:
        tmp.write_text(text, encoding="utf-8")


PUBLISH_STEPS = ("staged", "locked", "committed", "linked", "published", "cleaned")
"""The steps of :func:`publish`, in order (each reported to :func:`_reached` when done)."""


def _reached(step: str) -> None:
    """Called after each step of :func:`publish` (a no-op: tests replace it to hold or
    kill a writer there)."""


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold ``flock(LOCK_EX)`` on the file or folder ``path``; yields False when ``wait`` is
    off and another process holds it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _folder_locked(folder: Path) -> contextlib.AbstractContextManager[bool]:
    """Exclusive among rewrite processes publishing into ``folder`` (two runs writing the
    same output never interleave their steps)."""
    return _locked(folder)


def _fsync(path: Path) -> None:
    """Flush a file's or folder's bytes (a folder: its entries) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@frozen
class Staged:
    """A new model and its data, written completely in a staging folder beside the output."""

    folder: Path
    """The hidden staging folder (``.OUT.onnx.XXXXXXXX`` in the output's folder)."""
    model: Path
    """The model as it is published: its data named as beside the output."""
    first: Path | None
    """The same model with its data read in the staging folder (None: no data files)."""
    data: tuple[str, ...]
    """The data files' names, in ``folder`` and beside the output alike."""
    companions: tuple[str, ...] = ()
    """Files in ``folder`` moved beside the output with the data (:class:`Beside`)."""
    siblings: tuple[str, ...] = ()
    """Further models in ``folder`` reading the same data (one per static size), published
    beside the output under these names with it; each with its :func:`reading_copy` when
    there are data files."""


def reading_copy(model: Path) -> Path:
    """Where the staged ``model``'s copy reading its data in the staging folder is (the
    model published first: the module docstring's step 1)."""
    return model.with_name(f"{model.name}.first")


@frozen
class Companion:
    """A file published with a model, beside it (``genai_config.json``, a tokenizer file)."""

    name: str
    """Its name beside the model (a plain file name)."""
    text: str | None = None
    """Its content (written as UTF-8), or None: a copy of ``source``."""
    source: Path | None = None
    """The file it copies, when ``text`` is None."""

    def write(self, folder: Path) -> None:
        """Write it into ``folder`` under its name."""
        if Path(self.name).name != self.name or self.name in ("", ".", ".."):
            raise ValueError(f"{self.name!r}: a companion file is a plain file name")
        target = folder / self.name
        if self.text is not None:
            target.write_text(self.text, encoding="utf-8")
        elif self.source is not None:
            shutil.copyfile(self.source, target)
        else:
            raise ValueError(f"{self.name}: a companion file needs a text or a source")


@frozen
class Beside:
    """What is published beside a model, with it (:func:`publish`)."""

    files: tuple[Companion, ...] = ()
    """Written in the staging folder, moved beside the model with its data."""
    stale: tuple[str, ...] = ()
    """Files of an earlier run beside the model that no longer belong with it: removed
    once the new model is in place."""


@contextlib.contextmanager
def staging_folder(output: Path) -> Iterator[Path]:
    """A new hidden folder beside ``output``, locked by this process while the block runs
    (how the next run tells a live writer's folder from a killed one's), removed after."""
    try:
        folder = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    except OSError as e:
        raise InputError(f"{output}: cannot write ({e.strerror or e})") from e
    try:
        with _locked(folder):
            yield folder
    finally:
        if not (folder / _IN_USE).exists():
            shutil.rmtree(folder, ignore_errors=True)


_IN_USE = "in-use"
"""Marks a staging folder the published model reads (a publish failed between its steps 1
and 3): kept for the next run to clean."""


def publish(output: Path, staged: Staged, *, stale: Iterable[str] = (),
            retire: Iterable[str] = ()) -> None:
    """Make ``staged`` the models and data at ``output``, crash-safe (the module
    docstring's steps); ``stale`` names data files of earlier runs to remove once the new
    models are in place, ``retire`` models of earlier runs beside the output that read the
    old data (removed in step 1, before the data they read is replaced)."""
    folder = output.parent
    models = [(staged.folder / name, folder / name) for name in staged.siblings]
    models.append((staged.model, output))
    firsts = [*(reading_copy(model) for model, _ in models[:-1]), staged.first] \
        if staged.first else []
    for path in (*(staged.folder / name for name in (*staged.data, *staged.companions)),
                 *(model for model, _ in models), *firsts, staged.folder):
        _fsync(path)
    _reached("staged")
    modes = [_new_file_mode(target) for _, target in models]
    with _folder_locked(folder):
        _reached("locked")
        if firsts:
            for first, (_, target), mode in zip(firsts, models, modes):
                _replace(first, target, mode)
            _retire(folder, retire)
            _reached("committed")
            try:
                _place_data(staged)
                _place_companions(staged)
                _fsync(folder)
                _reached("linked")
                for (model, target), mode in zip(models, modes):
                    _replace(model, target, mode)
            except BaseException:
                (staged.folder / _IN_USE).touch()
                raise
        else:
            _place_companions(staged)
            for (model, target), mode in zip(models, modes):
                _replace(model, target, mode)
            _retire(folder, retire)
        _reached("published")
        shutil.rmtree(staged.folder, ignore_errors=True)
        _clean(output, staged, stale)
        _fsync(folder)
        _reached("cleaned")


def _retire(folder: Path, names: Iterable[str]) -> None:
    """Remove the models ``names`` beside the output (an earlier run's, not rewritten)."""
    names = list(names)
    for name in names:
        with contextlib.suppress(OSError):
            (folder / name).unlink()
    if names:
        _fsync(folder)


def _replace(new: Path, output: Path, mode: int) -> None:
    """Rename ``new`` over ``output`` (with ``mode``), durably."""
    os.chmod(new, mode)
    os.replace(new, output)
    _fsync(output.parent)


def _place_data(staged: Staged) -> None:
    """Each data file also under its final name beside the output (a hard link: the model
    in place still reads the staging folder's names)."""
    folder = staged.folder.parent
    for name in staged.data:
        source, target = staged.folder / name, folder / name
        link = folder / f"{staged.folder.name}.{name}.link"
        try:
            os.link(source, link)
        except OSError:  # no hard links on this filesystem
            os.replace(source, target)
            continue
        os.replace(link, target)


def _place_companions(staged: Staged) -> None:
    """Each companion file moved to its name beside the output (nothing reads it in the
    staging folder)."""
    folder = staged.folder.parent
    for name in staged.companions:
        os.replace(staged.folder / name, folder / name)


def _clean(output: Path, staged: Staged, stale: Iterable[str]) -> None:
    """Remove stale data of earlier runs and the staging folders of killed ones."""
    folder = output.parent
    for name in dict.fromkeys(stale):
        if name not in staged.data and name not in staged.companions:
            with contextlib.suppress(OSError):
                (folder / name).unlink()
    ours = re.compile(rf"\.{re.escape(output.name)}\.(old\.)?[a-z0-9_]{{8}}(\..+\.link)?")
    for entry in folder.iterdir():
        found = ours.fullmatch(entry.name)
        if entry == staged.folder or not found:
            continue
        if found.group(2):  # a hard link of step 2 (made under the folder lock: not live)
            with contextlib.suppress(OSError):
                entry.unlink()
        elif entry.is_dir():
            with contextlib.suppress(OSError), _locked(entry, wait=False) as dead:
                if dead:
                    shutil.rmtree(entry)
