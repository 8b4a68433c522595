"""Stage 3 of the ONNX backend: finishing the outlined model (:func:`finish`).

Scalar variants of one body merged into one function with attributes and equal functions
merged (``_merge``), onnxscript's optimizer run once per distinct function body and over the
main graph (``_optimize``), opset imports fixed (``backends.onnx._opsets``), initializers in
first-use order, stack traces' source paths made relative (``_portable``: also
:func:`make_portable`, for a model made elsewhere), body node names dropped if asked: each an
onnx_ir pass (``_passes``) that checks the invariant it ensures, run in one ``Sequential``
(``_finish``).
"""

from rewrite.backends.onnx.finishing._finish import finish
from rewrite.backends.onnx.finishing._portable import make_portable

__all__ = ["finish", "make_portable"]
