"""Programs with in-place state (caches): FX equal to ``ep.module()``, ONNX equal to
``torch.onnx.export``, the program left unchanged.

torch.export keeps in-place writes (``index_copy_``, ``copy_``, ``add_``) on buffers and on
lifted tensor constants in the graph. The lowered module must hold its own copies of that
state (running it must not change the program), keep tensors that alias each other aliased,
and detach constants that require grad, as ``ExportedProgram.module()`` does.
"""

from __future__ import annotations

import copy
import functools
import warnings

import numpy as np
import pytest
import torch

import rewrite
from rewrite.backends.onnx import lower
from tools import models
from tests.onnx_fixtures import (LLAMA_RULES, MODULARIZE, checked_proto, function_names,
                                 run_onnx)


class CachedAttention(torch.nn.Module):
    def __init__(self, store: torch.Tensor, constants: bool):
        super().__init__()
        self.q = torch.nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(8, 4), persistent=False)
        self.register_buffer("steps", torch.zeros(1))
        if constants:  # plain tensor attributes: lifted constants, one shared by both layers
            self.count, self.shared = torch.zeros(1), store
        else:
            self.register_buffer("count", torch.zeros(1))
            self.register_buffer("shared", store)

    def forward(self, x, pos):
        h = self.q(x)
        self.cache.index_copy_(0, pos, h)
        self.steps.add_(1)
        self.count.add_(1)
        self.shared[0].copy_(h[0])
        return self.cache.sum(0) + h * self.steps + self.count + self.shared.sum(0)


class Cached(torch.nn.Module):
    def __init__(self, constants: bool = True):
        super().__init__()
        store = torch.zeros(2, 4)
        self.layers = torch.nn.ModuleList([CachedAttention(store, constants) for _ in range(2)])

    def forward(self, x, pos):
        for layer in self.layers:
            x = layer(x, pos)
        return x


def state_of(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in {**program.state_dict, **program.constants}.items()
            if isinstance(v, torch.Tensor)}


def attribute(module: torch.nn.Module, fqn: str) -> torch.Tensor:
    return functools.reduce(getattr, fqn.split("."), module)


def assert_fx_equals_module(rules, make, calls) -> None:
    """``make()`` exports the same program anew; the lowered module and ``module()`` of a
    second export agree on every call's output and on the state after it; the lowered
    program is unchanged."""
    program, reference = make(), make().module()
    before = state_of(program)
    gm = rewrite.apply(rules, program).to_fx()
    for args, kwargs in calls:
        with torch.no_grad():
            want, got = reference(*args, **kwargs), gm(*args, **kwargs)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for name in before:
            torch.testing.assert_close(attribute(gm, name), attribute(reference, name))
    after = state_of(program)
    assert all(torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.parametrize("strict", [False, True])
def test_cache_model_fx_equals_module(strict):
    torch.manual_seed(0)
    model = models.perturb(Cached().eval())
    x, pos = torch.randn(2, 4), torch.tensor([1, 3])

    def make():
        copied = copy.deepcopy(model)
        # torch 2.14's strict export refuses a lifted constant that a grad-requiring value is
        # copied into ("node requires_grad True does not match constant requires_grad False");
        # the non-strict case keeps such a constant (and its detaching in the lowered module)
        if strict:
            copied.requires_grad_(False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(copied, (x, pos), strict=strict)

    program = make()
    mutating = {str(n.target) for n in program.graph.nodes if str(n.target).endswith("_.default")}
    assert {"aten.index_copy_.default", "aten.copy_.default"} <= mutating
    calls = [((x, pos), {}), ((x * 2, torch.tensor([0, 3])), {})]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_fx_equals_module(MODULARIZE, make, calls)
        assert_fx_equals_module(rewrite.parse_rules("group class *CachedAttention"), make, calls)
    gm = rewrite.apply(MODULARIZE, program).to_fx()
    # one tensor under three names (store, layers.0.shared, layers.1.shared) stays one
    names = [n for n, v in program.constants.items() if n.endswith("shared")]
    assert len({attribute(gm, n).data_ptr() for n in names}) == 1


@pytest.mark.slow  # torch.onnx.export too, for the comparison
def test_cache_model_onnx_equals_torch_onnx_export():
    """Strict export: torch.onnx.export cannot decompose this non-strict program (nor the
    non-strict static-cache decoder below)."""
    torch.manual_seed(0)
    model = models.perturb(Cached(constants=False).eval())
    x, pos = torch.randn(2, 4), torch.tensor([1, 3])
    program = torch.export.export(copy.deepcopy(model), (x, pos), strict=True)
    flat = torch.onnx.export(torch.export.export(copy.deepcopy(model), (x, pos), strict=True),
                             dynamo=True, verbose=False).model
    result = rewrite.apply(rewrite.parse_rules("group class *CachedAttention"), program)
    onnx_model = result.to_onnx()
    checked_proto(onnx_model)
    want, got = run_onnx(flat, (x, pos)), run_onnx(onnx_model, (x, pos))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)
    # layer 0 writes the shared buffer that layer 1 reads: its call returns the new value
    calls = [n for n in onnx_model.graph if n.op_type.startswith("CachedAttention")]
    assert len(calls) == 2
    assert len(calls[0].outputs) == 2 and calls[0].outputs[1] in list(calls[1].inputs)


@pytest.fixture(scope="module")
def static_cache_llama():
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model, _, _ = models.llama(head=True)
    model.config.use_cache = True
    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": 16})
    ids, pos = torch.randint(0, 100, (1, 4)), torch.arange(4)

    def make(strict: bool):
        wrapper = TorchExportableModuleForDecoderOnlyLM(copy.deepcopy(model), batch_size=1,
                                                        max_cache_len=16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return wrapper.export(input_ids=ids, cache_position=pos, strict=strict)

    return make, ids


@pytest.mark.slow  # transformers' static-cache Llama, exported strict and not
@pytest.mark.parametrize("strict", [False, True])
def test_static_cache_decoder_fx_equals_module(static_cache_llama, strict):
    make, ids = static_cache_llama
    calls = [((), {"input_ids": ids, "cache_position": torch.arange(4)}),
             ((), {"input_ids": ids.flip(1), "cache_position": torch.arange(4, 8)})]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_fx_equals_module(MODULARIZE, lambda: make(strict), calls)
        program = make(strict)
        assert not rewrite.apply(MODULARIZE, program).tree.flattened
        assert not rewrite.apply(LLAMA_RULES, program).tree.flattened


@pytest.mark.slow
def test_static_cache_decoder_onnx(static_cache_llama):
    """Strict: lowered per body (the in-place cache updates in torch's functional form),
    equal to torch.onnx.export (which keeps the cache as initializers, as torch does);
    non-strict: torch.onnx.export itself crashes on it (an assertion in its decomposition),
    and the error says so, naming torch and its version."""
    make, ids = static_cache_llama
    pos = torch.arange(4)
    program = make(True)
    flat = torch.onnx.export(program, dynamo=True, verbose=False).model
    lowering = lower(rewrite.apply(LLAMA_RULES, program))
    assert lowering.path == "per-body"  # in-place cache updates: in functional form
    assert lowering.inlined == 1  # the second decoder layer is a call of the first's body
    onnx_model = lowering.model
    checked_proto(onnx_model)
    names = function_names(onnx_model)
    assert names["LlamaDecoderLayer"] == 1 and names["LlamaAttention"] == 1, names
    assert names["LlamaRotaryEmbedding"] == 1, names  # its no-grad region keeps its module
    np.testing.assert_allclose(run_onnx(onnx_model, (ids, pos))[0],
                               run_onnx(flat, (ids, pos))[0], atol=1e-5)
    # torch 2.13: an assertion inside its decomposition (torch's crash: exit 3, torch named);
    # torch 2.9: "duplicated inputs that are mutated" (its verdict on the program: exit 2)
    with pytest.raises((rewrite.LibraryError, rewrite.InputError),
                       match=r"torch\.onnx.*(failed converting the program|cannot convert)"):
        rewrite.apply(LLAMA_RULES, make(False)).to_onnx()
