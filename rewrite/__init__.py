"""rewrite: declarative, rule-based grouping of PyTorch export graphs.

>>> import rewrite
>>> rules = rewrite.load_rules("rules/gpt2.rules")
>>> result = rewrite.apply(rules, "model.pt2")
>>> result.to_onnx()   # onnx_ir.Model with nested, deduplicated local functions
>>> result.to_fx()     # hierarchical torch.fx.GraphModule
"""

from rewrite.api import Result, apply
from rewrite.compile import Rule, RuleSet, load_rules, parse_rules
from rewrite.errors import Diagnostic, GroupingError, InputError, RewriteError, RuleError
from rewrite.grouping import Group, GroupTree

__version__ = "0.1.0"

__all__ = [
    # entry points
    "apply",
    "load_rules",
    "parse_rules",
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
    "RewriteError",
    "RuleError",
    "__version__",
]
