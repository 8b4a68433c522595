"""rewrite: declarative, rule-based grouping of PyTorch export graphs.

>>> import rewrite
>>> rules = rewrite.load_rules("rules/gpt2.rules")
>>> result = rewrite.apply(rules, "model.pt2")
>>> result.to_onnx()   # onnx_ir.Model with nested, deduplicated local functions
>>> result.to_fx()     # hierarchical torch.fx.GraphModule
>>> rewrite.export(model, args, rules="gpt2")   # nn.Module -> grouped onnx_ir.Model
>>> rewrite.export("checkpoint/", output="model.onnx")   # a Hugging Face folder, decode-ready
>>> rewrite.RewritePass(rules)(onnx_program.model)   # an onnx_ir pass, for exporters
"""

from rewrite.api import Result, apply
from rewrite.compile import Rule, RuleSet, load_rules, parse_rules
from rewrite.errors import (
    Diagnostic,
    GroupingError,
    InputError,
    LibraryError,
    RewriteError,
    RuleError,
    VerificationError,
)
from rewrite.exporting import export
from rewrite.grouping import Group, GroupTree

__version__ = "0.1.0"


def __getattr__(name: str):
    """``RewritePass`` is loaded on first use (it imports onnx_ir, slow to import)."""
    if name == "RewritePass":
        from rewrite.passes import RewritePass

        return RewritePass
    raise AttributeError(f"module 'rewrite' has no attribute {name!r}")


__all__ = [
    # entry points
    "apply",
    "export",
    "load_rules",
    "parse_rules",
    # exporters
    "RewritePass",
    # results
    "Group",
    "GroupTree",
    "Result",
    "Rule",
    "RuleSet",
    # errors
    "Diagnostic",
    "GroupingError",
    "InputError",
    "LibraryError",
    "RewriteError",
    "RuleError",
    "VerificationError",
    "__version__",
]
