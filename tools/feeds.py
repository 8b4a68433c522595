"""Inputs for an ONNX model in onnxruntime: ``{input name: array}``, the one way the tools and
the benchmarks make them (the zoo, the model fuzzer, ``bench.ort_latency``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _inputs(model: Any) -> list[tuple[str, np.dtype, list]]:
    """(name, dtype, shape) of each input of ``model``: an ``onnxruntime.InferenceSession``, or
    an ONNX file (read without its external data; initializers are not inputs)."""
    if not isinstance(model, (str, Path)):
        kinds = {"tensor(int64)": np.int64, "tensor(int32)": np.int32,
                 "tensor(float)": np.float32, "tensor(bool)": np.bool_}
        return [(i.name, np.dtype(kinds.get(i.type, np.float32)), list(i.shape))
                for i in model.get_inputs()]
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    return [(i.name, tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type),
             [d.dim_value if d.HasField("dim_value") else None
              for d in i.type.tensor_type.shape.dim])
            for i in graph.input if i.name not in weights]


def feeds(model: Any, values: Any = None) -> dict[str, np.ndarray]:
    """The inputs of ``model`` (a session or an ONNX file) by name: the tensors (or arrays) of
    ``values`` in input order (any nesting of tuples, lists and dicts, as the model's
    ``args, kwargs`` are), or zeros (symbolic dimensions 1) when ``values`` is None.
    ``ValueError`` when the counts differ."""
    inputs = _inputs(model)
    if values is None:
        return {name: np.zeros([d if isinstance(d, int) else 1 for d in shape], dtype)
                for name, dtype, shape in inputs}
    from torch.utils import _pytree as pytree

    leaves = [v.detach().numpy() if hasattr(v, "detach") else np.asarray(v)
              for v in pytree.tree_leaves(values)
              if hasattr(v, "detach") or isinstance(v, np.ndarray)]
    if len(leaves) != len(inputs):
        raise ValueError(f"{len(inputs)} ONNX inputs for {len(leaves)} tensors")
    return {name: value for (name, _, _), value in zip(inputs, leaves)}
