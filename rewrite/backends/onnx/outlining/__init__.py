"""Stage 2 of the ONNX backend: groups -> nested, deduplicated model-local functions.

:func:`outline` outlines every group of a tree, bottom-up, in place (``_outline``: the walk),
with ``_functions`` (what a group's function is), ``_call_sites`` (how a call site is
rewritten) and ``_standin_calls`` (how a stand-in calls its first call's function), from:

* ``_membership``: the direct ONNX members of each group (a stand-in: the one member);
* ``_boundary``: a group's inputs and outputs, and rewiring readers to a call's outputs;
* ``_body_keys``: the structural key of a body (equal keys share one function);
* ``_repeats``: repeated blocks matched node by node against an earlier body;
* ``_constants``: the constant policy (small constants embedded, the rest inputs);
* ``_recompute``: cheap nodes shared between groups recomputed in each;
* ``_naming``: function names, input names, call metadata.

Finishing merges with :class:`Keyer` (body keys: :class:`BodyKey`, :class:`NodeKey`),
:class:`FunctionNames` and :func:`function_name`; :mod:`distinct` reads the keys.
Reading ONNX models without torch (``rewrite suggest``) uses :class:`Keyer`,
:func:`boundary`, :func:`owners`, :class:`ConstantPolicy` and :func:`weight_names` from here.
"""

from rewrite.backends.onnx.outlining._body_keys import (
    BodyKey,
    Key,
    Keyer,
    NodeKey,
    Refs,
    canonical_order,
)
from rewrite.backends.onnx.outlining._boundary import boundary, owners
from rewrite.backends.onnx.outlining._constants import ConstantPolicy, weight_names
from rewrite.backends.onnx.outlining._naming import (
    FunctionNames,
    check_identity,
    drop_node_names,
    function_name,
)
from rewrite.backends.onnx.outlining._outline import Outlined, outline

__all__ = ["BodyKey", "ConstantPolicy", "FunctionNames", "Key", "Keyer", "NodeKey", "Outlined",
           "Refs", "boundary", "canonical_order",
           "check_identity", "drop_node_names", "function_name", "outline", "owners",
           "weight_names"]
