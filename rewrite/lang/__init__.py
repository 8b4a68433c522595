"""Stage 1: rules text -> AST (Lark grammar in ``grammar/``, positions kept for diagnostics)."""

from rewrite.lang.ast import (
    AnySelector,
    Assignment,
    BoolSelector,
    ClassSelector,
    FlatRule,
    GroupRule,
    Include,
    NotSelector,
    OpSelector,
    PathSelector,
    RulesFile,
    Selector,
    SplitRule,
    TagRule,
    TagSelector,
)
from rewrite.lang.parser import parse_text
from rewrite.lang.source import Source, Span

__all__ = [
    "AnySelector",
    "Assignment",
    "BoolSelector",
    "ClassSelector",
    "FlatRule",
    "GroupRule",
    "Include",
    "NotSelector",
    "OpSelector",
    "PathSelector",
    "RulesFile",
    "Selector",
    "Source",
    "Span",
    "SplitRule",
    "TagRule",
    "TagSelector",
    "parse_text",
]
