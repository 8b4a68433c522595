"""Stage 1 of the ONNX backend: ONNX ops for the model, grouped like the FX program.

Two strategies for an ExportedProgram (:mod:`rewrite.backends.onnx.pipeline` tries them in
order; a strategy that does not apply raises one of :data:`NOT_HERE`, which the pipeline
turns into a :class:`~rewrite.backends.onnx.pipeline.NotHere`):

* per body (``_perbody``): the program rebuilt around one ``invoke_subgraph`` per repeated
  group (``_invoke_subgraph``), decomposed and translated by torch.onnx once per distinct
  body, the first call of each body inlined and the others left standing in
  (``backends.onnx._standins``);
* the flat program (``_flat``): ``torch.onnx.export`` (its failures explained by
  ``_torch_failure``).

``_regroup`` groups the ONNX nodes with the same rules (an ``.onnx`` input is outlined as it
is, never lowered).
"""

from rewrite.backends.onnx.lowering._flat import export_program
from rewrite.backends.onnx.lowering._invoke_subgraph import Unsupported
from rewrite.backends.onnx.lowering._perbody import (
    Translation,
    DecomposedProgram,
    check,
    functional,
    in_place,
)
from rewrite.backends.onnx.lowering._regroup import regroup, regroup_with
from rewrite._private.errors import TorchFailed, Unavailable

NOT_HERE = (Unsupported, Unavailable, TorchFailed)
"""What the per-body strategy raises when it does not apply to a program: the program's
shape (:class:`Unsupported`), torch's private APIs missing (:class:`Unavailable`), torch's
own code failing on it (:class:`TorchFailed`)."""

__all__ = ["NOT_HERE", "Translation", "DecomposedProgram", "TorchFailed", "Unavailable",
           "Unsupported", "check", "export_program", "functional", "in_place",
           "regroup", "regroup_with"]
