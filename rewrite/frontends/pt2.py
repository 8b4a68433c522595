"""Load a ``.pt2`` file (``torch.export.save``) with errors a user can act on.

``torch.export.load`` logs the real reason of a failure as a warning with a traceback (on
stderr) and raises a generic error; here the log is captured and its reason becomes the
message of one :class:`InputError`. The archive's checksums are verified first, so a file
corrupted inside its weights is refused instead of loading garbage.

Programs that use another library's classes or custom operators load once that library is
imported: for transformers and diffusers this module imports it and retries; for others the
error names the operator and asks for the import (``rewrite --import MODULE``).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import zipfile
import zlib
from pathlib import Path
from typing import Iterator

import torch

from rewrite._torch_private import fast_pt2_decoding, lazy_program_graph_modules
from rewrite.errors import InputError, causes, first_line

_TORCH_LOGGERS = ("torch.export", "torch._export")
_UNREGISTERED = re.compile(r"Deserializing ([\w.]+) in pytree is not registered")
_IMPORTABLE_FOR_PYTREE = ("transformers.", "diffusers.")
"""Packages whose output classes may be imported to register them for deserialization."""
_NODE_TARGET = re.compile(r"^Failed deserializing node Node\(target='([^']+)'")
_MAX_REASON = 300
_UNRESOLVED_OP = re.compile(r"failed to resolve torch\.ops\.([\w.]+) to an operator", re.I)
_OP_LIBRARIES = {
    "transformers": ("transformers.integrations.moe",),
    "transformers_msa": ("transformers.integrations.msa_attention",),
    "diffusers": ("diffusers",),
}
"""Custom operator namespaces of known libraries -> the modules that register their ops."""


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.reasons.append(_reason(record.exc_info[1]))
            self.errors.append(record.exc_info[1])


@contextlib.contextmanager
def _captured_torch_logs() -> Iterator[_Capture]:
    """Route torch.export's log records to a capture instead of stderr."""
    capture = _Capture()
    saved = []
    for name in _TORCH_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers[:] = [capture]
        logger.propagate = False
    try:
        yield capture
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers[:] = handlers
            logger.propagate = propagate


def _first_line(e: BaseException) -> str:
    return first_line(e) or type(e).__name__


def _reason(e: BaseException) -> str:
    """What went wrong, short: the first line of the innermost cause of ``e`` (torch wraps it
    in "Failed deserializing node Node(<the whole node>)"), with the node's operator."""
    root = causes(e)[-1]
    reason = _first_line(root)
    if root is not e:
        target = _NODE_TARGET.search(_first_line(e))
        if target:
            reason = f"a node of {target.group(1)}: {reason}"
    return reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 3] + "..."


def _check_archive(path: Path) -> None:
    """Raise :class:`InputError` for a file that is not a complete, intact zip archive."""
    if not zipfile.is_zipfile(path):
        raise InputError(
            f"{path}: not a .pt2 archive (truncated, or not written by torch.export.save)"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            names = archive.namelist()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as e:
        raise InputError(f"{path}: corrupt .pt2 archive ({_first_line(e)})") from None
    if bad is not None:
        raise InputError(f"{path}: corrupt .pt2 archive (checksum mismatch in {bad})")
    if any(n.endswith("/data.pkl") for n in names) and not any(
        n.endswith("/archive_format") for n in names
    ):
        raise InputError(
            f"{path}: a torch.save file, not a torch.export.save program; export the model "
            "with torch.export.export and save it with torch.export.save"
        )


def _load(path: Path) -> tuple[torch.export.ExportedProgram | None, str | None, str | None]:
    """The program, or None, the reason torch gave and the custom operator it could not
    resolve (``namespace.name.overload``), if that was the reason."""
    with (_captured_torch_logs() as capture, fast_pt2_decoding(),
          lazy_program_graph_modules()):
        try:
            return torch.export.load(str(path)), None, None
        except Exception as e:  # torch raises many types here; all mean "unreadable"
            reasons = capture.reasons or [_first_line(e)]
            return None, reasons[0], _unresolved_op([*capture.errors, e])


def _unresolved_op(errors: list[BaseException]) -> str | None:
    """The operator torch could not resolve, from the errors and their causes."""
    for error in errors:
        for cause in causes(error):
            match = _UNRESOLVED_OP.search(str(cause))
            if match:
                return match.group(1)
    return None


def _import_quietly(module: str) -> bool:
    """Import ``module``; False if it is not installed or fails to import."""
    try:
        importlib.import_module(module)
    except Exception:  # not installed, or broken: the caller reports the original reason
        return False
    return True


def _register_output_types(reason: str) -> bool:
    """Import the module of an unregistered output class (transformers...); True if done."""
    match = _UNREGISTERED.search(reason)
    if not match or not match.group(1).startswith(_IMPORTABLE_FOR_PYTREE):
        return False
    return _import_quietly(match.group(1).rsplit(".", 1)[0])


def _register_op(op: str) -> bool:
    """Import the modules of a known library that register ``op``'s namespace; True if any."""
    modules = _OP_LIBRARIES.get(op.split(".")[0], ())
    return any([_import_quietly(m) for m in modules])


def load_pt2(path: str | Path) -> torch.export.ExportedProgram:
    """``torch.export.load`` with a clear :class:`InputError` for every way it can fail."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a .pt2 file")
    _check_archive(path)
    program, reason, op = _load(path)
    if program is None and (
        (reason and _register_output_types(reason)) or (op and _register_op(op))
    ):
        program, reason, op = _load(path)
    if program is not None:
        return program
    assert reason is not None
    if op is not None:
        library = op.split(".")[0]
        raise InputError(
            f"{path}: the program uses the custom operator torch.ops.{op}, which is not "
            f"registered: import the library that defines it (the '{library}' namespace) "
            "before loading (rewrite --import MODULE, or import it in Python)"
        )
    if _UNREGISTERED.search(reason):
        raise InputError(
            f"{path}: torch.export.load cannot read this program ({reason}); its inputs or "
            "outputs use a type not registered for deserialization: import the module that "
            "registers it, or re-export with plain tensors/tuples as outputs (for transformers "
            "models: return_dict=False, use_cache=False)"
        )
    raise InputError(f"{path}: torch.export.load cannot read it ({reason})")
