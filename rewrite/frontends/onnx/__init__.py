"""The ONNX frontend: a ``torch.onnx``-exported (or other producer's) ``.onnx`` -> graph IR.

:mod:`graph` (module calls from torch.onnx's metadata), :mod:`check` (refusing invalid
files), :mod:`names` (module paths from node names), :mod:`weighted` (nodes without metadata
that apply a weight)."""
