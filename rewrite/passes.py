"""``RewritePass``: a rule set as an ``onnx_ir`` pass, for exporter pipelines.

>>> onnx_program = torch.onnx.export(model, args, dynamo=True)
>>> onnx_program.model = rewrite.RewritePass("rules/gpt2.rules")(onnx_program.model).model

The model must carry the node metadata ``torch.onnx`` writes (``pkg.torch.onnx.name_scopes``,
``pkg.torch.onnx.class_hierarchy``); :mod:`rewrite.frontends.onnx.graph` rebuilds the module calls
from it and says where nodes without metadata go. The pass groups the main graph exactly like
``rewrite.apply(rules, model).to_onnx()`` and outlines the groups into nested, deduplicated
model-local functions. Run it after torch.onnx's optimizer (``optimize=True``, the default):
``onnxscript.optimizer.optimize`` inlines functions unless given ``inline=False``.

Rule warnings (a rule that matches nothing) go to the ``rewrite`` logger; user mistakes raise
:class:`rewrite.RewriteError` subclasses.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx_ir as ir
import onnx_ir.passes

from rewrite.api import apply
from rewrite.backends.onnx.options import OnnxOptions
from rewrite.backends.onnx.outlining import check_identity
from rewrite.backends.onnx.pipeline import lower, outline_in_place
from rewrite.compile import RuleSet, load_rules

logger = logging.getLogger("rewrite")


class RewritePass(onnx_ir.passes.PassBase):
    """Group a ``torch.onnx``-exported model by ``rules`` into model-local functions.

    ``in_place=True`` (default) outlines the given model and returns it; ``in_place=False``
    returns an outlined copy and leaves the input unchanged. ``constants``,
    ``constant_limit`` and ``recompute`` are the :class:`OnnxOptions` of the ONNX backend
    (None: its default). ``PassResult.modified`` is True when at least one group became a
    function call (or outlining dropped nodes left unused). Inside an
    ``onnx_ir.passes.PassManager`` errors come wrapped in ``PassError`` (the
    :class:`rewrite.RewriteError` is at the end of the ``__cause__`` chain).
    """

    def __init__(
        self,
        rules: RuleSet | str | Path,
        *,
        in_place: bool = True,
        constants: str | None = None,
        constant_limit: int | None = None,
        recompute: bool | None = None,
    ) -> None:
        self.rules = rules if isinstance(rules, RuleSet) else load_rules(rules)
        given = {"constants": constants, "constant_limit": constant_limit,
                 "recompute": recompute}
        self.options = OnnxOptions(**{k: v for k, v in given.items() if v is not None})
        self._in_place = in_place

    @property
    def in_place(self) -> bool:
        return self._in_place

    @property
    def changes_input(self) -> bool:
        return self._in_place

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        result = apply(self.rules, model)
        for warning in result.warnings:
            logger.warning("%s", warning.render())
        groups = list(result.tree.groups())
        if not groups:
            return ir.passes.PassResult(model if self._in_place else model.clone(), False)
        for group in groups:  # user mistakes surface before the model is touched
            check_identity(group)
        before = (len(model.graph), len(model.graph.initializers))
        if self._in_place:
            out = model
            outlined = outline_in_place(model, result.tree, self.options).outlined
        else:
            lowering = lower(result, self.options)
            out, outlined = lowering.model, lowering.outlined
        after = (len(out.graph), len(out.graph.initializers))
        return ir.passes.PassResult(out, bool(outlined.calls) or before != after)

    def __repr__(self) -> str:
        source = self.rules.files[0] if self.rules.files else "<rules>"
        return f"RewritePass({source!r}, in_place={self._in_place})"


__all__ = ["RewritePass"]
