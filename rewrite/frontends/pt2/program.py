"""Load a ``.pt2`` file (``torch.export.save``) as data: weights mapped, no code run.

``torch.export.load`` copies every weight out of the zip into memory (a model's worth of
RAM) and unpickles the sample inputs with a silent full-pickle fallback: a crafted file runs
code. Here the archive is read once, as data (:mod:`~rewrite.frontends.pt2.archive`): its JSON
configs say which entry holds which tensor (:mod:`~rewrite.frontends.pt2.payloads`); every archive
entry becomes one storage over its bytes in a private read-only mapping of the file (its pages are
the file's, not the process's memory) and every parameter, buffer and constant a view of its entry's
storage, as ``torch.export.load`` makes them (tied weights share one, nothing else aliases), and
only the program's JSON is deserialized, by torch
(:func:`rewrite._private.torch_programs.deserialize_program`). :func:`read_pt2` returns the
program with the :class:`~rewrite.files.mapped.MappedFile` its weights are views of (which the
writer copies them from, file to file). The weights' checksums are verified on a thread started
by what is going to hand the weights on (the ONNX backend starts it when it begins lowering)
and waited for before they are (:func:`rewrite.files.mapped.verify`); what reads only shapes
(``explain``, ``suggest``) reads no weight.

What only code could load (pickled tensors or objects, TorchBind objects, sample inputs that
weights-only unpickling refuses) is refused: :class:`UnsafeModel` (exit 2) names the archive
entry, unless the caller trusts the file (``--trust-model``). Libraries are imported before
reading the program only where the archive's own metadata names them: transformers' and
diffusers' output classes (pytree types) and custom operator namespaces; anything else is
the user's ``--import``. torch's reasons for refusing a program become one
:class:`InputError` (what torch logs meanwhile goes where the process's logging sends it: the
CLI keeps it off stderr, :mod:`rewrite.cli.logs`).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import warnings
from pathlib import Path
import torch
from attrs import frozen

from rewrite._private.torch_programs import Unavailable, deserialize_program, pt2_dtype
from rewrite.errors import InputError, ModelWarning, causes, first_line
from rewrite.files.mapped import MappedFile
from rewrite.frontends.pt2.archive import Archive, checksums, open_archive
from rewrite.frontends.pt2.payloads import (
    payloads,
    read_sample_inputs,
    tensors,
    trusted_sample_inputs,
    unsafe_entries,
)

_UNREGISTERED = re.compile(r"Deserializing ([\w.]+) in pytree is not registered")
_IMPORTABLE_FOR_PYTREE = ("transformers.", "diffusers.")
"""Packages whose output classes are imported (to register them) when a program names them."""
_PYTREE_TYPE = re.compile(rb'\\"type\\":\s*\\"((?:transformers|diffusers)\.[\w.]+)\\"')
_OP_TARGET = re.compile(rb'"target":\s*"torch\.ops\.(\w+)\.')
_NODE_TARGET = re.compile(r"^Failed deserializing node Node\(target='([^']+)'")
_MAX_REASON = 300
_UNRESOLVED_OP = re.compile(r"failed to resolve torch\.ops\.([\w.]+) to an operator", re.I)
_OP_LIBRARIES = {
    "transformers": ("transformers.integrations.moe",),
    "transformers_msa": ("transformers.integrations.msa_attention",),
    "diffusers": ("diffusers",),
}
"""Custom operator namespaces of known libraries -> the modules that register their ops."""
MODELS_DIR = "models/"


class UnsafeModel(InputError):
    """Loading the file would run code from it (pickle), and the caller did not trust it."""

    def __init__(self, path: Path, unsafe: dict[str, str], root: str) -> None:
        self.entries = dict(unsafe)
        shown = "; ".join(f"{root}{name}: {what}" for name, what in list(unsafe.items())[:3])
        more = f" (and {len(unsafe) - 3} more)" if len(unsafe) > 3 else ""
        super().__init__(
            f"{path}: refusing to load: the archive holds data only code execution can "
            f"load ({shown}{more}). A model file can run any code this way; if you built "
            "this file yourself, pass --trust-model (rewrite.apply(..., trust_model=True))")


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


def _unresolved_op(error: BaseException) -> str | None:
    """The operator torch could not resolve, from the error and its causes."""
    for cause in causes(error):
        match = _UNRESOLVED_OP.search(str(cause))
        if match:
            return match.group(1)
    return None


def _import_quietly(module: str) -> None:
    """Import ``module``; if it is not installed or fails, the load reports the reason."""
    with contextlib.suppress(Exception):
        importlib.import_module(module)


def _import_named_libraries(program_json: bytes) -> None:
    """Import what the program names and a known library registers: transformers' and
    diffusers' output classes (pytree types of its inputs/outputs), their custom ops."""
    for module in sorted({m.decode().rsplit(".", 1)[0]
                          for m in _PYTREE_TYPE.findall(program_json)}):
        _import_quietly(module)
    for namespace in sorted({n.decode() for n in _OP_TARGET.findall(program_json)}):
        for module in _OP_LIBRARIES.get(namespace, ()):
            _import_quietly(module)


def _model_name(archive: Archive) -> str:
    """The program to load: ``model`` (what torch.export.save writes), else the only one."""
    names = [n[len(MODELS_DIR):-len(".json")] for n in archive.entries
             if n.startswith(MODELS_DIR) and n.endswith(".json") and n.count("/") == 1]
    if "model" in names:
        return "model"
    if len(names) == 1:
        return names[0]
    if not names:
        raise InputError(f"{archive.path}: torch.export.load cannot read it (the archive "
                         "holds no program)")
    raise InputError(f"{archive.path}: the archive holds {len(names)} programs "
                     f"({', '.join(sorted(names))}) and none is named 'model'")


def _check_version(archive: Archive) -> None:
    name = "archive_version"
    if name in archive.entries:
        version = archive.read(name, limit=64).decode("utf-8", "replace").strip()
        if version != "0":
            raise InputError(f"{archive.path}: archive version {version!r}; this torch reads "
                             "version '0' .pt2 files")


def _refusal(path: Path, error: BaseException) -> InputError:
    """The :class:`InputError` for torch refusing the program."""
    reason = _reason(error)
    op = _unresolved_op(error)
    if op is not None:
        library = op.split(".")[0]
        return InputError(
            f"{path}: the program uses the custom operator torch.ops.{op}, which is not "
            f"registered: import the library that defines it (the '{library}' namespace) "
            "before loading (rewrite --import MODULE, or import it in Python)")
    if _UNREGISTERED.search(reason):
        return InputError(
            f"{path}: torch.export.load cannot read this program ({reason}); its inputs or "
            "outputs use a type not registered for deserialization: import the module that "
            "registers it, or re-export with plain tensors/tuples as outputs (for transformers "
            "models: return_dict=False, use_cache=False)")
    return InputError(f"{path}: torch.export.load cannot read it ({reason})")


@frozen(eq=False)
class Pt2:
    """A loaded ``.pt2``: its program, and the file its weights are views of."""

    program: torch.export.ExportedProgram
    mapped: tuple[MappedFile, ...]
    """The mapped file (none when torch's loader copied the weights, or the file holds no
    bytes to map); the ONNX writer copies the weights from it."""


def load_pt2(path: str | Path, *, trust_model: bool = False) -> torch.export.ExportedProgram:
    """The program of the ``.pt2`` at ``path``, its tensors views of the file (see
    :func:`read_pt2`)."""
    return read_pt2(path, trust_model=trust_model).program


def read_pt2(path: str | Path, *, trust_model: bool = False) -> Pt2:
    """The program of the ``.pt2`` at ``path``, its tensors views of the file, with that
    file's mapping.

    Raises :class:`InputError` for every way the file can be unusable, :class:`UnsafeModel`
    when it would need code execution and ``trust_model`` is False. Notes (a slower path
    taken) are :class:`ModelWarning` warnings."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, expected a .pt2 file")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: not a .pt2 archive (empty file)")
    archive = open_archive(path)
    _check_version(archive)
    model = _model_name(archive)
    try:
        found = payloads(archive, model, pt2_dtype)
    except Unavailable as e:
        return Pt2(_load_with_torch(archive, model, trust_model, str(e)), ())
    inputs = read_sample_inputs(archive, model)
    unsafe = unsafe_entries(found, inputs)
    if unsafe and not trust_model:
        raise UnsafeModel(path, unsafe, archive.root)
    verifier = checksums(archive, sorted({p.entry for p in found if not p.pickled}))
    program_json = archive.read(f"{MODELS_DIR}{model}.json")
    _import_named_libraries(program_json)
    state, constants, inflated = tensors(archive, found, trust_model)
    if inflated:
        name, why = inflated[0]
        warnings.warn(ModelWarning(
            f"{path}: {len(inflated)} weight entries cannot be mapped (e.g. "
            f"{archive.root}{name}: {why}): they were copied into memory, which is slower "
            "and uses RAM; torch.export.save writes them uncompressed and aligned"),
            stacklevel=2)
    example = trusted_sample_inputs(archive, inputs) if trust_model else inputs.value
    try:
        program = deserialize_program(program_json, state, constants, example)
    except Unavailable as e:
        return Pt2(_load_with_torch(archive, model, trust_model, str(e)), ())
    except Exception as e:  # torch raises many types here; all mean "unreadable"
        raise _refusal(path, e) from e
    mapped = archive.mapping and MappedFile.of(archive.mapping, archive.path, verifier)
    return Pt2(program, (mapped,) if mapped else ())


def _load_with_torch(archive: Archive, model: str, trust_model: bool, why: str
                     ) -> torch.export.ExportedProgram:
    """``torch.export.load``, once nothing in the file needs pickle (or it is trusted):
    the fallback when torch's serialization API is not the one rewrite was checked with."""
    if not trust_model:
        unsafe = unsafe_entries(payloads(archive, model, _dtype_by_name),
                                read_sample_inputs(archive, model))
        if unsafe:
            raise UnsafeModel(archive.path, unsafe, archive.root)
    warnings.warn(ModelWarning(
        f"{archive.path}: loaded with torch.export.load, which copies every weight into "
        f"memory (this torch's serialization differs from the one rewrite maps: {why})"),
        stacklevel=3)
    _import_named_libraries(archive.read(f"{MODELS_DIR}{model}.json"))
    try:
        return torch.export.load(str(archive.path))
    except Exception as e:  # torch raises many types here; all mean "unreadable"
        raise _refusal(archive.path, e) from e


def _dtype_by_name(code: int) -> torch.dtype:
    """Any dtype: the fallback's safety check reads only which entries are pickled."""
    return torch.uint8

