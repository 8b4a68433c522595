"""Dispatch any supported model object or path to its frontend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from attrs import evolve

from rewrite.errors import InputError
from rewrite.frontends.fx.graph import from_exported_program, from_graph_module
from rewrite.frontends.pt2.program import read_pt2
from rewrite.frontends.fx.regions import readable_program
from rewrite.ir import Graph

MODEL_SUFFIXES = (".pt2", ".onnx")


def load_graph(model: Any, *, trust_model: bool = False) -> Graph:
    """The IR of an ExportedProgram, GraphModule, onnx_ir.Model, or a ``.pt2``/``.onnx`` path
    (``trust_model``: see :func:`rewrite.frontends.pt2.program.load_pt2`)."""
    if isinstance(model, (str, Path)):
        path = Path(model)
        suffix = path.suffix.lower()
        if suffix == ".pt2":
            loaded = read_pt2(path, trust_model=trust_model)
            graph = from_exported_program(readable_program(loaded.program))
            return evolve(graph, mapped=loaded.mapped)
        if suffix == ".onnx":
            from rewrite.frontends.onnx.graph import load_onnx_graph

            return load_onnx_graph(path)
        raise InputError(
            f"{path}: unknown model type {suffix or '(no extension)'!r}; expected .pt2 or .onnx"
        )
    if isinstance(model, torch.export.ExportedProgram):
        return from_exported_program(readable_program(model))
    if isinstance(model, torch.fx.GraphModule):
        return from_graph_module(model)
    try:
        import onnx_ir

        if isinstance(model, onnx_ir.Model):
            from rewrite.frontends.onnx.graph import from_onnx_model

            return from_onnx_model(model)
    except ImportError:  # pragma: no cover - onnx_ir is a dependency
        pass
    raise InputError(
        f"cannot read a model of type {type(model).__name__}; expected an ExportedProgram, "
        "a GraphModule, an onnx_ir.Model, or a .pt2/.onnx path"
    )
