"""Programs with state and control flow, read back from a ``.pt2`` (issue 29): they lower as
they do in memory and equal eager PyTorch in onnxruntime; rewrite's loader gives them the
aliasing and the tensor metadata ``torch.export.load`` gives them.

Before, every archive entry was a slice of one storage over the whole file: to torch every
weight aliased every other one, so ``torch.cond``'s aliasing check and the functionalization of
a static KV cache's in-place updates refused programs that convert in memory.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from torch.utils import _pytree as pytree

import rewrite
from rewrite.backends.onnx import OnnxOptions, lower
from rewrite.frontends.pt2.program import load_pt2
from tests.onnx_fixtures import LLAMA_RULES, MODULARIZE, checked_proto, run_eager, run_onnx
from tests.pt2_roundtrip import (LOWERINGS, SOURCES, as_source, export, object_classes,
                                 programs, signature_facts, storage_classes, tensor_facts)

BLOCK_RULES = {"cond": "group class Linear", "cond-strict": "group class Linear",
               "regions": "group class *Block", "cache-buffers": "group class *CachedAttention",
               "layouts": "group class Linear", "static-cache": LLAMA_RULES}
"""A block rule per program lowered below."""


@pytest.fixture(scope="module")
def built():
    """Name -> (model, args, kwargs, program), each exported once."""
    cache = {}

    def get(name):
        if name not in cache:
            model, args, kwargs, strict = programs()[name]()
            cache[name] = (model, args, kwargs, export(model, args, kwargs, strict=strict))
        return cache[name]

    return get


@pytest.fixture(scope="module")
def saved(built, tmp_path_factory, request):
    """Name -> the ``.pt2`` its program is saved to (GPT-2's: the session's)."""
    cache = {}

    def get(name):
        if name == "gpt2":
            return request.getfixturevalue("gpt2_pt2")
        if name not in cache:
            cache[name] = as_source(built(name)[3], "file", tmp_path_factory.mktemp(name))
        return cache[name]

    return get


def assert_equals_eager(onnx_model, model, args, kwargs) -> None:
    """The program's outputs (its first ones: mutated state follows them) equal a fresh
    copy of the eager model's on the same inputs, within 1e-4."""
    want = run_eager((copy.deepcopy(model), args, kwargs))
    got = run_onnx(onnx_model, (*args, *kwargs.values()))
    assert len(got) >= len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["cond-strict", "cond", "static-cache"])
@pytest.mark.parametrize("rules", ["modularize", pytest.param("block", marks=pytest.mark.slow)])
def test_the_issues_programs_convert_from_a_file(run_cli, saved, built, tmp_path, name, rules):
    """``rewrite apply RULES FILE -o out.onnx``, as the issue ran it."""
    model, args, kwargs, _ = built(name)
    text = BLOCK_RULES[name]
    path = tmp_path / "block.rules"
    path.write_text(text if isinstance(text, str) else text.read_text())
    out = tmp_path / "out.onnx"
    r = run_cli("apply", "-q", MODULARIZE if rules == "modularize" else path, saved(name),
                "-o", out)
    assert r.code == 0, r.err
    onnx.checker.check_model(str(out), full_check=True)
    assert_equals_eager(str(out), model, args, kwargs)
    if name.startswith("cond"):  # the other branch
        assert_equals_eager(str(out), model, (-args[0].abs(),), kwargs)


LOWERED = [(name, rules, source) if source == "file" else
           pytest.param(name, rules, source, marks=pytest.mark.slow)  # the reference
           for name, rules in
           [("cond", "modularize"), ("cond-strict", "block"), ("regions", "modularize"),
            ("cache-buffers", "block"), ("layouts", "modularize"),
            ("static-cache", "modularize")] for source in SOURCES]
LOWERED.append(("static-cache", "block", "file"))  # test_state.py lowers it in memory


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize(("name", "rules", "source"), LOWERED)
def test_file_lowers_as_memory(built, saved, name, rules, source, lowering):
    """Each lowering of the program read from its file equals eager, as it does in memory;
    where a lowering refuses the program (per body: ``cond``), it refuses it from both."""
    model, args, kwargs, program = built(name)
    given = program if source == "memory" else saved(name)
    text = MODULARIZE if rules == "modularize" else BLOCK_RULES[name]
    result = rewrite.apply(text if not isinstance(text, str) else rewrite.parse_rules(text),
                           given)
    if name.startswith("cond") and lowering == "per-body":
        with pytest.raises(rewrite.InputError, match=r"higher-order op \(cond\)"):
            lower(result, OnnxOptions(lowering=lowering))
        return
    lowered = lower(result, OnnxOptions(lowering=lowering))
    assert lowered.path == lowering
    checked_proto(lowered.model)
    assert_equals_eager(lowered.model, model, args, kwargs)
    if name.startswith("cond"):
        assert_equals_eager(lowered.model, model, (-args[0].abs(),), kwargs)


@pytest.mark.slow  # torch.onnx.export failing twice
def test_nonstrict_static_cache_fails_from_a_file_as_in_memory(built, saved):
    """torch.onnx.export crashes decomposing the non-strict static-cache program (a torch
    assertion: exit 3, torch named), in memory or
    from torch.export.load's program; from rewrite's loader it fails the same way (before:
    with an assertion about the size of one storage over the whole file)."""
    program = built("static-cache-nonstrict")[3]
    failed = (rewrite.LibraryError, rewrite.InputError)  # torch's crash or verdict, by release
    with pytest.raises(failed) as memory:
        rewrite.apply(MODULARIZE, program).to_onnx()
    with pytest.raises(failed) as file:
        rewrite.apply(MODULARIZE, saved("static-cache-nonstrict")).to_onnx()
    assert "torch.onnx" in str(memory.value) and "cause: " in str(memory.value)
    assert type(file.value) is type(memory.value) and str(file.value) == str(memory.value)


TORCH_LOADER_UNFREEZES = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 10)
"""torch 2.9's ``torch.export.load`` gives a frozen parameter (``requires_grad=False``)
``requires_grad=True``; rewrite's loader keeps what was saved, as later releases do."""


@pytest.mark.parametrize("name", [*programs(), "gpt2"])
def test_loaded_aliasing_and_metadata_equal_torchs(saved, built, request, name):
    """Which tensors share a storage, and each tensor's type, dtype, shape, strides, storage
    offset and requires_grad, as ``torch.export.load`` has them; parameters, persistent and
    non-persistent buffers and constants as its signature and ``module()`` have them. Names
    of one tensor object in the exported program (tied weights) are one object again
    (``torch.export.load`` makes one per name)."""
    path = saved(name)
    ours, theirs = load_pt2(path), torch.export.load(str(path))
    exported = request.getfixturevalue("gpt2_program") if name == "gpt2" else built(name)[3]
    assert object_classes(ours) == object_classes(exported)
    assert storage_classes(ours) == storage_classes(theirs)
    assert len(storage_classes(ours)) > 1
    tensors = {**ours.state_dict, **ours.constants}
    want = {**theirs.state_dict, **theirs.constants}
    assert list(tensors) == list(want)
    truth = {**exported.state_dict, **exported.constants}
    for key, tensor in want.items():
        expected = tensor_facts(tensor)
        if TORCH_LOADER_UNFREEZES and isinstance(truth.get(key), torch.nn.Parameter):
            requires_grad = truth[key].requires_grad  # as saved, not as torch 2.9 loads it
            expected = (*expected[:6], requires_grad, *expected[7:])
        assert tensor_facts(tensors[key]) == expected, key
        assert torch.equal(tensors[key], tensor), key
    if TORCH_LOADER_UNFREEZES:  # module()'s parameters' requires_grad as saved
        assert signature_facts(ours)[4] == signature_facts(exported)[4]
        assert signature_facts(ours)[:4] + signature_facts(ours)[5:] == \
            signature_facts(theirs)[:4] + signature_facts(theirs)[5:]
    else:
        assert signature_facts(ours) == signature_facts(theirs)


@pytest.mark.parametrize("name", ["cache-buffers", "static-cache", "cond-strict", "layouts"])
def test_fx_of_a_file_equals_eager_and_leaves_the_loaded_state_alone(built, saved, name):
    """The FX module of a program read from its file equals eager over two calls (the
    second sees the state the first updated); the loaded program's state is unchanged."""
    model, args, kwargs, _ = built(name)
    program = load_pt2(saved(name))
    state = {k: v.detach().clone() for k, v in {**program.state_dict, **program.constants}.items()
             if isinstance(v, torch.Tensor)}
    gm = rewrite.apply(MODULARIZE, program).to_fx()
    eager = copy.deepcopy(model)
    for _ in range(2):
        with torch.no_grad():
            got, want = gm(*args, **kwargs), eager(*args, **kwargs)
        torch.testing.assert_close(pytree.tree_leaves(got), pytree.tree_leaves(want),
                                   atol=1e-5, rtol=1e-5)
    loaded = {**program.state_dict, **program.constants}
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
