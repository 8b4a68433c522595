"""Loading a .pt2 with the per-type planned JSON decoder (rewrite/_private/_pt2_decode.py, installed
by rewrite/_private/torch_programs.py) gives the program torch.export.load gives, decodes to the
objects torch's decoder makes, and leaves torch's module as it was."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from torch._export.serde import schema, serialize, union

from rewrite._private._pt2_decode import SchemaDecoder
from rewrite.errors import InputError
from rewrite.frontends.pt2.program import load_pt2

TORCH_DECODE = serialize._dict_to_dataclass


def _program(program: torch.export.ExportedProgram) -> tuple:
    return (program.graph_module.code, str(program.graph_signature),
            [(n.name, str(n.meta.get("val")), repr(n.meta.get("nn_module_stack")))
             for n in program.graph.nodes], sorted(program.state_dict))


def _tree(value) -> object:
    """A decoded value as nested plain data: class, every attribute (union tags too)."""
    if isinstance(value, list):
        return [_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _tree(v) for k, v in value.items()}
    if hasattr(value, "__dict__"):
        return (type(value), {k: (type(v), _tree(v)) for k, v in vars(value).items()})
    return type(value), value


def _json(pt2) -> dict:
    with zipfile.ZipFile(pt2) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("models/model.json")]
        return json.loads(archive.read(name))


def test_load_pt2_equals_torch_export_load(gpt2_pt2):
    ours = load_pt2(gpt2_pt2)
    theirs = torch.export.load(str(gpt2_pt2))
    assert serialize._dict_to_dataclass is TORCH_DECODE
    assert _program(ours) == _program(theirs)
    for name, value in theirs.state_dict.items():
        assert torch.equal(ours.state_dict[name], value)


def test_decoder_makes_torchs_objects(gpt2_pt2):
    data = _json(gpt2_pt2)
    want = TORCH_DECODE(schema.ExportedProgram, data)
    got = SchemaDecoder(schema, union)(schema.ExportedProgram, data)
    assert _tree(got) == _tree(want)
    assert got == want


@pytest.mark.parametrize("cls, data", [
    (schema.Argument, ["not", "a dict"]),
    (schema.Argument, {"as_int": 1, "as_float": 2.0}),
    (schema.Argument, {"no_such_tag": 1}),
    ("NoSuchClass", {}),
])
def test_decoder_fails_as_torchs(cls, data):
    with pytest.raises(Exception) as want:
        TORCH_DECODE(cls, data)
    with pytest.raises(want.type) as got:
        SchemaDecoder(schema, union)(cls, data)
    if str(want.value):  # torch 2.9 asserts without a message; the decoder says what failed
        assert str(got.value) == str(want.value)


def test_decoder_is_undone_after_a_failed_load(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError):
        load_pt2(bad)
    assert serialize._dict_to_dataclass is TORCH_DECODE
