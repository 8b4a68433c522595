"""Helpers for the ONNX backend tests: the rule files, the checker, onnxruntime vs eager, who
calls which function. (The models lowered once per session, ``gpt2_lowered`` and the like, are
fixtures of ``conftest.py``.)"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import torch
from torch.utils import _pytree as pytree

from rewrite.backends.onnx import summarize

ROOT = Path(__file__).resolve().parents[1]
GPT2_RULES = ROOT / "rules" / "gpt2.rules"
MODULARIZE = ROOT / "rules" / "modularize.rules"

LLAMA_RULES = ROOT / "rules" / "llama.rules"
BERT_RULES = ROOT / "rules" / "bert.rules"


class Called(torch.nn.Module):
    """``model(x, **kwargs)`` with ``kwargs`` fixed (``return_dict=False`` and the like): a
    module of one tensor input, whose sizes an export can make dynamic."""

    def __init__(self, model: torch.nn.Module, kwargs: dict) -> None:
        super().__init__()
        self.model, self.kwargs = model, kwargs

    def forward(self, ids: torch.Tensor):
        return self.model(ids, **self.kwargs)


def checked_proto(model: ir.Model) -> onnx.ModelProto:
    """The model as a proto that passed the full ONNX checker."""
    proto = ir.to_proto(model)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def session(model: ir.Model | onnx.ModelProto | str | Path) -> ort.InferenceSession:
    if isinstance(model, ir.Model):
        model = ir.to_proto(model)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # no "removing unused initializer" chatter
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), options,
                                providers=["CPUExecutionProvider"])


def run_onnx(model, args: tuple) -> list[np.ndarray]:
    sess = session(model)
    feeds = {i.name: a.detach().numpy() for i, a in zip(sess.get_inputs(), args)}
    return sess.run(None, feeds)


def run_eager(triple, args: tuple | None = None) -> list[np.ndarray]:
    model, example, kwargs = triple
    with torch.no_grad():
        out = model(*(args if args is not None else example), **kwargs)
    return [t.detach().numpy() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def assert_matches_eager(model, triple, args: tuple | None = None, atol: float = 1e-4) -> None:
    args = args if args is not None else triple[1]
    got = run_onnx(model, args)
    want = run_eager(triple, args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=atol, rtol=1e-4)


def top_calls(model: ir.Model) -> Counter:
    """Function name -> call sites in the main graph."""
    return Counter(
        n.op_type for n in model.graph if (n.domain, n.op_type, n.overload) in model.functions
    )


def callees(model: ir.Model, name: str) -> Counter:
    """Function name -> call sites in the body of the function called ``name``."""
    (fid,) = [f for f in model.functions if f[1] == name]
    return Counter({callee[1]: n for callee, n in summarize(model)[fid].calls.items()})


def function_names(model: ir.Model) -> Counter:
    """Function name -> how many functions have that name (always 1: ids are unique)."""
    return Counter(name for _, name, _ in model.functions)


def runs(model: ir.Model) -> dict[str, int]:
    """Function name -> how often it runs per model run."""
    return {fid[1]: s.instances for fid, s in summarize(model).items()}
