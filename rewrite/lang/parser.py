"""Parse rules text with the packaged Lark grammar into a :class:`RulesFile`.

The grammar is loaded once (:func:`_parser`). Lark errors become :class:`RuleError`
diagnostics with ``file:line:col``, the offending line and, where cheap, a "did you mean"
hint (:mod:`syntax_errors`); the tree becomes the AST in :mod:`transform`.
"""

from __future__ import annotations

import functools
from importlib import resources

import lark
from lark import Lark

from rewrite.errors import Diagnostic, RuleError
from rewrite.lang import ast
from rewrite.lang.source import Source, Span
from rewrite.lang.syntax_errors import (
    ALL_KEYWORDS,
    OPTION_KEYWORDS,
    SELECTOR_KEYWORDS,
    STATEMENT_KEYWORDS,
    syntax_diagnostic,
)
from rewrite.lang.transform import ToAst

__all__ = ["ALL_KEYWORDS", "MAX_NESTING", "OPTION_KEYWORDS", "SELECTOR_KEYWORDS",
           "STATEMENT_KEYWORDS", "parse_text"]


@functools.cache
def _parser() -> Lark:
    grammar = resources.files("rewrite.grammar").joinpath("rules.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def parse_text(text: str, name: str = "<string>") -> ast.RulesFile:
    """Parse one rules text; raise :class:`RuleError` on any syntax error."""
    source = Source(text, name)
    try:
        tree = _parser().parse(text)
    except lark.UnexpectedInput as e:
        raise RuleError([syntax_diagnostic(e, source, _parser())]) from None
    _check_nesting(tree, source)
    try:
        statements = ToAst(source).transform(tree)
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, RuleError):
            raise e.orig_exc from None
        raise
    return ast.RulesFile(tuple(statements), name)


MAX_NESTING = 100
"""Deepest selector nesting accepted (``not``/``and``/``or`` levels); deeper would hit
Python's recursion limit in the AST transformer, the compiler and the predicates."""


def _check_nesting(tree: lark.Tree, source: Source) -> None:
    """Raise :class:`RuleError` at the first subtree nested deeper than :data:`MAX_NESTING`."""
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            meta = node.meta
            span = Span(source, getattr(meta, "line", 1), getattr(meta, "column", 1))
            raise RuleError([Diagnostic(
                "error", f"selector nested too deeply (more than {MAX_NESTING} levels)", span,
                "split it into several rules",
            )])
        stack.extend((c, depth + 1) for c in node.children if isinstance(c, lark.Tree))
