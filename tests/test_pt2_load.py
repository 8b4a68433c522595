"""Loading a .pt2 with torch's deserializer's type hints memoized (rewrite/_torch_private.py)
gives the program torch.export.load gives, and leaves torch's module as it was."""

from __future__ import annotations

import typing

import pytest
import torch
from torch._export.serde import serialize

from rewrite.errors import InputError
from rewrite.frontends.pt2 import load_pt2


def _program(program: torch.export.ExportedProgram) -> tuple:
    return (program.graph_module.code, str(program.graph_signature),
            [(n.name, str(n.meta.get("val")), repr(n.meta.get("nn_module_stack")))
             for n in program.graph.nodes], sorted(program.state_dict))


def test_load_pt2_equals_torch_export_load(gpt2_pt2):
    ours = load_pt2(gpt2_pt2)
    theirs = torch.export.load(str(gpt2_pt2))
    assert serialize.typing is typing
    assert _program(ours) == _program(theirs)
    for name, value in theirs.state_dict.items():
        assert torch.equal(ours.state_dict[name], value)


def test_memoized_hints_are_undone_after_a_failed_load(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InputError):
        load_pt2(bad)
    assert serialize.typing is typing
