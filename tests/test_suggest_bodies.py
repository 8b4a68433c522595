"""``rewrite suggest`` counts distinct bodies by the backends' own body keys: the same count
for a model's ``.pt2`` and its torch.onnx export, and as many functions as the ONNX backend
makes when it keeps every constant inside the functions (``constants="embed"``)."""

from __future__ import annotations

import re

import pytest
import torch

import rewrite
from tools import models
from tests.onnx_fixtures import runs
from tests.test_suggest import block_lines, reference_counts


@pytest.mark.parametrize("name, cls, bodies", [
    ("settings", "NormBlock", 4),  # four blocks that differ only in eps and scale
    ("two_factors", "Scaled", 2),  # three blocks, two scale factors
])
def test_pt2_and_onnx_count_alike_and_as_the_backend_makes(name, cls, bodies, run_cli,
                                                            tmp_path):
    model, args, kwargs = getattr(models, name)()
    pt2, onnx = tmp_path / f"{name}.pt2", tmp_path / f"{name}.onnx"
    torch.export.save(models.export((model, args, kwargs)), str(pt2))
    torch.onnx.export(model, args, dynamo=True, verbose=False).save(str(onnx))
    rules = rewrite.parse_rules(f"group class {cls}")
    for path in (pt2, onnx):
        r = run_cli("suggest", path)
        assert r.code == 0, r
        calls, counted = block_lines(r.out)[cls]
        assert (calls, counted) == reference_counts(model, cls) == (calls, bodies), path
        made = rewrite.apply(rules, path).to_onnx(constants="embed")
        functions = {f: n for f, n in runs(made).items() if re.fullmatch(rf"{cls}(_\d+)?", f)}
        assert len(functions) == bodies and sum(functions.values()) == calls, (path, functions)
