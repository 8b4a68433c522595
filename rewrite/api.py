"""The library entry points: ``load_rules``, ``parse_rules``, ``apply`` and :class:`Result`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

from rewrite.compile import RuleSet, load_rules, parse_rules
from rewrite.grouping import Grouped, group_graph

if TYPE_CHECKING:
    import onnx_ir
    import torch


@frozen
class Result(Grouped):
    """Groups of one model under one rule set (``rules``, ``tree``, ``model``: see
    :class:`~rewrite.grouping.Grouped`), ready to lower to ONNX or FX. A value: lowering it
    never changes it, and lowering it twice gives equal models."""

    def explain(self) -> dict:
        """The group tree as plain data (what ``rewrite explain --json`` prints)."""
        from rewrite.grouping.report import tree_to_dict

        return tree_to_dict(self.tree)

    def to_onnx(self, **options: Any) -> "onnx_ir.Model":
        """An ONNX model whose groups are nested, deduplicated model-local functions."""
        from rewrite.backends.onnx import to_onnx

        return to_onnx(self, **options)

    def to_fx(self) -> "torch.fx.GraphModule":
        """A hierarchical GraphModule (one submodule per group), or a split one."""
        from rewrite.backends.fx import to_fx

        return to_fx(self)


def as_ruleset(rules: RuleSet | str | Path) -> RuleSet:
    """``rules`` as a :class:`RuleSet`: given, or loaded by :func:`load_rules`."""
    if isinstance(rules, RuleSet):
        return rules
    return load_rules(rules)


def apply(rules: RuleSet | str | Path, model: Any, *, trust_model: bool = False) -> Result:
    """Group ``model`` (ExportedProgram, GraphModule, onnx_ir.Model, or a path) by ``rules``.

    A ``.pt2`` path is read as data: its weights are views of the file, and what only code
    execution could load (pickled objects) is refused with :class:`InputError` unless
    ``trust_model`` (for files you built yourself: unpickling runs code from the file)."""
    ruleset = as_ruleset(rules)
    from rewrite.frontends import load_graph  # imports torch: only when a model is read

    graph = load_graph(model, trust_model=trust_model)
    return Result(ruleset, group_graph(ruleset, graph), model)


__all__ = ["Result", "apply", "load_rules", "parse_rules"]
