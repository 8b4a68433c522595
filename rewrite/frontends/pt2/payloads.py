"""The weights, constants and sample inputs of a ``.pt2`` archive, as data.

A program's tensors are described by two JSON configs (``data/weights/<model>_weights_config.json``,
``data/constants/<model>_constants_config.json``): per name, the entry holding the bytes and the
tensor's dtype, sizes, strides and storage offset. :func:`payloads` reads them into
:class:`Payload` records and checks them against the entries (a missing entry, sizes that do not
fit the entry's bytes). :func:`unsafe_entries` lists what only code execution could load (pickled
tensors, TorchBind and opaque objects, sample inputs that weights-only unpickling refuses);
:func:`tensors` makes every entry one storage over its bytes in the archive's mapping, never a
copy (a compressed entry, which cannot be mapped, is inflated into memory), and every tensor a
view of its entry's storage, as ``torch.export.load`` does: tensors saved as views of one
tensor share a storage, tensors of different entries do not.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable

import torch
from attrs import frozen

from rewrite._private.torch_programs import load_torchbind
from rewrite.errors import InputError
from rewrite.frontends.pt2.archive import Archive

WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"
SAMPLE_INPUTS = "data/sample_inputs/{}.pt"
_CONFIGS = {"weight": WEIGHTS_DIR + "{}_weights_config.json",
            "constant": CONSTANTS_DIR + "{}_constants_config.json"}
_CUSTOM_OBJECT, _OPAQUE_OBJECT = "custom_obj_", "opaque_obj_"


@frozen
class Payload:
    """One tensor (or object) of the program and the archive entry that holds it."""

    fqn: str
    """The program's name for it (``h.0.attn.c_attn.weight``)."""
    kind: str
    """``weight`` or ``constant``."""
    entry: str
    """The archive entry (``data/weights/weight_3``)."""
    is_param: bool
    pickled: str | None
    """What unpickling would load, for payloads stored with pickle (None: raw bytes)."""
    dtype: torch.dtype | None = None
    sizes: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    storage_offset: int = 0
    requires_grad: bool = False


def payloads(archive: Archive, model: str, dtype_of: Callable[[int], torch.dtype]
             ) -> list[Payload]:
    """Every payload of ``model``'s weights and constants, checked against the archive."""
    found: list[Payload] = []
    for kind, config_name in _CONFIGS.items():
        name = config_name.format(model)
        if name not in archive.entries:
            if kind == "weight" and f"{WEIGHTS_DIR}{model}.pt" in archive.entries:
                raise InputError(f"{archive.path}: weights in torch's legacy format "
                                 f"({archive.root}{WEIGHTS_DIR}{model}.pt): save the program "
                                 "again with a current torch.export.save")
            continue  # torch writes both configs; a program without constants may lack one
        config = _json(archive, name)
        folder = WEIGHTS_DIR if kind == "weight" else CONSTANTS_DIR
        for fqn, meta in config.get("config", {}).items():
            found.append(_payload(archive, kind, folder, fqn, meta, dtype_of))
    _check_inflatable(archive, found)
    return found


def _check_inflatable(archive: Archive, found: list[Payload]) -> None:
    """Refuse a compressed entry that claims more bytes than its tensors need: inflating
    it would fill memory for nothing (a zip bomb)."""
    needed: dict[str, int] = {}
    for p in found:
        if p.pickled is None and archive.entries[p.entry].compressed:
            needed[p.entry] = max(needed.get(p.entry, 0), _extent(p))
    for name, need in needed.items():
        claimed = archive.entries[name].size
        if claimed > need:
            raise InputError(f"{archive.path}: compressed archive entry {archive.root}{name} "
                             f"claims {claimed:,} bytes where its tensors need {need:,}: "
                             "refusing to inflate it (a zip bomb?)")


def _extent(p: Payload) -> int:
    """Bytes of the entry that ``p``'s sizes, strides and offset reach."""
    assert p.dtype is not None
    element = p.dtype.itemsize
    if 0 in p.sizes:
        return 0
    return (p.storage_offset + sum((n - 1) * s for n, s in zip(p.sizes, p.strides)) + 1) * element


def _json(archive: Archive, name: str) -> dict:
    try:
        data = json.loads(archive.read(name))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{archive.path}: corrupt .pt2 archive ({archive.root}{name} is not "
                         f"JSON: {e})") from e
    if not isinstance(data, dict):
        raise InputError(f"{archive.path}: corrupt .pt2 archive ({archive.root}{name})")
    return data


def _payload(archive: Archive, kind: str, folder: str, fqn: str, meta: Any,
             dtype_of: Callable[[int], torch.dtype]) -> Payload:
    where = f"{archive.path}: {kind} {fqn!r}"
    try:
        entry = folder + meta["path_name"]
        is_param = bool(meta.get("is_param", False))
        tensor_meta = meta.get("tensor_meta")
        pickled = _pickled(meta, meta["path_name"])
    except (KeyError, TypeError) as e:
        raise InputError(f"{where}: malformed entry in the archive's {kind} config") from e
    if entry not in archive.entries:
        raise InputError(f"{where}: its archive entry {archive.root}{entry} is missing")
    if pickled is not None:
        return Payload(fqn, kind, entry, is_param, pickled)
    try:
        dtype = dtype_of(tensor_meta["dtype"])
        sizes = tuple(_int(s) for s in tensor_meta["sizes"])
        strides = tuple(_int(s) for s in tensor_meta["strides"])
        offset = _int(tensor_meta["storage_offset"])
        grad = bool(tensor_meta.get("requires_grad", False))
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where}: malformed tensor metadata in the archive ({e})") from e
    payload = Payload(fqn, kind, entry, is_param, None, dtype, sizes, strides, offset, grad)
    _check_fits(archive, payload, where)
    return payload


def _pickled(meta: dict, path_name: str) -> str | None:
    if path_name.startswith(_CUSTOM_OBJECT):
        return "a TorchBind custom object (torch's object unpickler)"
    if path_name.startswith(_OPAQUE_OBJECT):
        return "an opaque object (full pickle)"
    if meta.get("use_pickle") or meta.get("tensor_meta") is None:
        return "a pickled tensor or object (full pickle)"
    return None


def _int(value: Any) -> int:
    """A ``SymInt`` of the schema that must be a plain integer here (``{"as_int": 3}``)."""
    if isinstance(value, dict) and isinstance(value.get("as_int"), int):
        return value["as_int"]
    raise ValueError(f"not a plain integer: {value!r}")


def _check_fits(archive: Archive, p: Payload, where: str) -> None:
    """Refuse metadata that reaches past the entry's bytes (or is malformed)."""
    assert p.dtype is not None
    element = p.dtype.itemsize
    size = archive.entries[p.entry].size
    if len(p.sizes) != len(p.strides) or any(s < 0 for s in (*p.sizes, *p.strides)) \
            or p.storage_offset < 0:
        raise InputError(f"{where}: malformed sizes or strides in the archive")
    if size % element:
        raise InputError(f"{where}: entry {archive.root}{p.entry} holds {size:,} bytes, not "
                         f"a whole number of {p.dtype} elements")
    if _extent(p) > size:
        raise InputError(f"{where}: its metadata ({p.dtype}, sizes {list(p.sizes)}) needs "
                         f"{_extent(p):,} bytes, its entry {archive.root}{p.entry} "
                         f"holds {size:,}")


@frozen
class SampleInputs:
    """The program's example inputs, as weights-only unpickling reads them (once)."""

    entry: str
    """The archive entry (``data/sample_inputs/model.pt``)."""
    value: Any = None
    """What weights-only unpickling read; None when there are none or it refused them."""
    refused: str | None = None
    """Why weights-only unpickling refused them (only full pickle could load them)."""


def read_sample_inputs(archive: Archive, model: str) -> SampleInputs:
    """The sample inputs of ``model``, read with weights-only unpickling (which runs no
    code from the file)."""
    entry = SAMPLE_INPUTS.format(model)
    data = archive.read(entry) if entry in archive.entries else b""
    if not data:
        return SampleInputs(entry)
    try:
        return SampleInputs(entry, torch.load(io.BytesIO(data), weights_only=True))
    except Exception as e:  # the weights-only unpickler raises several types
        text = str(e).strip().splitlines()
        detail = next((line.strip() for line in text if "GLOBAL" in line or "global" in line),
                      text[0] if text else type(e).__name__)
        return SampleInputs(entry, refused="sample inputs that only full pickle can load "
                            f"({detail[:200]})")


def unsafe_entries(found: list[Payload], inputs: SampleInputs) -> dict[str, str]:
    """Archive entry -> what loading it would run: what needs more than weights-only data."""
    unsafe = {p.entry: p.pickled for p in found if p.pickled is not None}
    if inputs.refused is not None:
        unsafe[inputs.entry] = inputs.refused
    return unsafe


def trusted_sample_inputs(archive: Archive, inputs: SampleInputs) -> Any:
    """The sample inputs of a file the user trusts: with full pickle where weights-only
    unpickling refused them (it runs code from the file)."""
    if inputs.refused is None:
        return inputs.value
    return torch.load(io.BytesIO(archive.read(inputs.entry)), weights_only=False)


def tensors(archive: Archive, found: list[Payload], trusted: bool
            ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The state dict and the constants, every tensor a view of the archive's mapping (its
    parameters ``nn.Parameter``s); and the entries that had to be copied into memory, each
    with why (``compressed``, ``not aligned``).

    Each entry is one storage, as ``torch.export.load`` makes it: tensors saved as views of
    one tensor (tied weights, a buffer and its slices) share it, tensors of different
    entries do not (torch would see every weight alias every other one). Names saved as the
    same view of an entry (tied weights) are one tensor object, as in the exported program
    (``torch.export.load`` makes one per name)."""
    element = _widest_element(found)
    storages: dict[str, torch.UntypedStorage] = {}
    views: dict[tuple, torch.Tensor] = {}
    inflated: list[tuple[str, str]] = []
    state: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for p in found:
        if p.pickled is not None:
            value = _unpickle(archive, p) if trusted else None
            if value is None:
                continue
        else:
            if p.entry not in storages:
                storages[p.entry] = _storage(archive, p.entry, element[p.entry], inflated)
            key = (p.entry, p.dtype, p.sizes, p.strides, p.storage_offset, p.is_param,
                   p.requires_grad)
            if key not in views:
                views[key] = _strided(storages[p.entry], p)
            value = views[key]
        (state if p.kind == "weight" else constants)[p.fqn] = value
    return state, constants, inflated


def _widest_element(found: list[Payload]) -> dict[str, int]:
    """Entry -> the largest element size of the tensors in it (what its bytes must be
    aligned to)."""
    widest: dict[str, int] = {}
    for p in found:
        if p.dtype is not None:
            widest[p.entry] = max(widest.get(p.entry, 1), p.dtype.itemsize)
    return widest


def _storage(archive: Archive, name: str, element: int, inflated: list[tuple[str, str]]
             ) -> torch.UntypedStorage:
    """Entry ``name`` as one storage of its bytes: over the mapping when stored and aligned
    to ``element`` bytes, else a copy in memory."""
    entry = archive.entries[name]
    if entry.size == 0:
        return torch.UntypedStorage(0)
    if archive.mapping is not None and not entry.compressed and entry.offset % element == 0:
        storage = torch.frombuffer(archive.view(name), dtype=torch.uint8)
    else:
        inflated.append((name, "compressed" if entry.compressed else "not aligned"))
        storage = torch.frombuffer(bytearray(archive.read(name, limit=entry.size)),
                                   dtype=torch.uint8)
    return storage.untyped_storage()


def _strided(storage: torch.UntypedStorage, p: Payload) -> torch.Tensor:
    """``p``'s tensor over its entry's storage, as ``torch.export.load`` makes it: a view of
    the whole entry (a non-leaf view when a buffer or constant requires grad)."""
    assert p.dtype is not None
    if storage.nbytes() == 0:
        flat = torch.zeros(p.sizes, dtype=p.dtype)
    else:
        flat = torch.empty(0, dtype=p.dtype).set_(
            storage, 0, (storage.nbytes() // p.dtype.itemsize,), (1,))
    if p.is_param:
        return torch.nn.Parameter(flat.as_strided(p.sizes, p.strides, p.storage_offset),
                                  requires_grad=p.requires_grad)
    return flat.requires_grad_(p.requires_grad).as_strided(p.sizes, p.strides, p.storage_offset)


def _unpickle(archive: Archive, p: Payload) -> Any:
    """A pickled payload, loaded as torch's loader does: only for a trusted file."""
    import pickle

    data = archive.read(p.entry)
    if p.entry.rsplit("/", 1)[-1].startswith(_CUSTOM_OBJECT):
        return load_torchbind(data)
    if p.entry.rsplit("/", 1)[-1].startswith(_OPAQUE_OBJECT):
        return pickle.loads(data)  # noqa: S301 - only with --trust-model
    return torch.load(io.BytesIO(data), weights_only=False)
