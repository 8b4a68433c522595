"""The library's steps as the commands run them: rules loaded, a model grouped, a grouping
lowered, each printing its warnings on the CLI's consoles."""

from __future__ import annotations

import warnings

import rewrite
from rewrite.cli.console import Consoles
from rewrite.cli.render import summary_line
from rewrite.cli.steps import Steps
from rewrite.errors import InputError, ModelWarning, RuleError
from rewrite.frontends.onnx.check import check_onnx_input
from rewrite.grouping.build import NO_STRUCTURE
from rewrite.grouping.classless import NO_CLASSES


def load_rules(arg: str) -> rewrite.RuleSet:
    """``rewrite.load_rules``; a RULES argument that is no readable file is an input error
    (exit 2, like a missing model), while errors inside the rules keep exit 1."""
    try:
        return rewrite.load_rules(arg)
    except RuleError as e:
        if all(d.span is None for d in e.diagnostics):  # about the file, not its text
            raise InputError("\n".join(d.message for d in e.diagnostics)) from None
        raise


def group_model(rules: rewrite.RuleSet, model: str, io: Consoles, steps: Steps,
                trust_model: bool = False) -> rewrite.Result:
    """Load and group ``model`` (already checked), printing the warnings."""
    with steps.step(f"reading {model} and grouping it"), \
            warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", ModelWarning)
        if model.lower().endswith(".onnx"):
            check_onnx_input(model)
        result = rewrite.apply(rules, model, trust_model=trust_model)
    for note in notes:
        if issubclass(note.category, ModelWarning):
            io.warning(str(note.message))
    io.detail(summary_line(result.tree))
    for warning in result.warnings:
        if warning.span is None and warning.message.startswith((NO_STRUCTURE, NO_CLASSES)):
            io.warning(f"{model}: {warning.message}")  # about the model: name it
        else:
            io.warning(warning)
    return result


def lower_model(result: rewrite.Result, io: Consoles, **options):
    """Lower to ONNX (no file written; ``options``: ``OnnxOptions`` fields): the backend's
    ``Lowering``."""
    from rewrite.backends.onnx import OnnxOptions, lower

    lowering = lower(result, OnnxOptions(**options), Steps.backend(io))
    for warning in lowering.warnings:
        io.warning(warning)
    return lowering
