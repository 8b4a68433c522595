"""torch's fake-tensor dispatch cache, off while rewrite traces
(``rewrite/_private/torch_fake_cache.py``): torch.export gives the same program without it,
and where its private APIs are gone the block runs with the cache on. The decomposition's
side is compared with torch's plain passes in test_onnx_decompose.py."""

from __future__ import annotations

import re

import torch
from torch._guards import detect_fake_mode

import rewrite
from rewrite._private import torch_fake_cache
from tests.onnx_fixtures import GPT2_RULES, Called, assert_matches_eager


def _exported(model_args_kwargs) -> torch.export.ExportedProgram:
    """The model exported with its sequence length dynamic."""
    model, (ids,), kwargs = model_args_kwargs
    return torch.export.export(Called(model, kwargs or {}), (ids,),
                               dynamic_shapes=({1: torch.export.Dim.AUTO},), strict=False)


def _listing(program: torch.export.ExportedProgram) -> list[tuple[str, str, str, str]]:
    """Each node's target, operands and value; nodes named by their place in the graph (the
    names' numbers differ: torch numbers the size computations it drops too, which a cache
    hit does not make)."""
    nodes = list(program.graph_module.graph.nodes)
    place = {node: f"%{i}" for i, node in enumerate(nodes)}
    return [(str(n.target), str(torch.fx.node.map_arg(n.args, place.__getitem__)),
             str(torch.fx.node.map_arg(n.kwargs, place.__getitem__)), str(n.meta.get("val")))
            for n in nodes]


def _fake_mode(program: torch.export.ExportedProgram):
    return detect_fake_mode([n.meta["val"] for n in program.graph_module.graph.nodes
                             if n.op == "placeholder"])


def test_torch_export_without_the_cache_gives_the_same_program(llama_model):
    with torch_fake_cache.new_modes_uncached():
        without = _exported(llama_model)
    cached = _exported(llama_model)
    assert not _fake_mode(without).cache_enabled and _fake_mode(cached).cache_enabled
    assert any(re.search(r"\bs\d+\b", val) for *_, val in _listing(without))  # a symbol
    assert _listing(without) == _listing(cached)


def test_without_the_private_apis_the_cache_stays_on_and_lowering_runs(
        gpt2_model, gpt2_program, monkeypatch):
    from torch._dynamo import config
    from torch._subclasses import fake_tensor

    patch = type(config).patch

    def gone(self, *args, **changes):  # as torch says of a key it does not have
        if "fake_tensor_cache_enabled" in changes:
            raise AttributeError("torch._dynamo.config.fake_tensor_cache_enabled does not exist")
        return patch(self, *args, **changes)

    with monkeypatch.context() as patched:
        patched.setattr(type(config), "patch", gone)
        with torch_fake_cache.new_modes_uncached():
            program = _exported(gpt2_model)
    assert _fake_mode(program).cache_enabled
    monkeypatch.delattr(fake_tensor, "disable_fake_tensor_cache")
    assert_matches_eager(rewrite.apply(GPT2_RULES, gpt2_program).to_onnx(), gpt2_model)
