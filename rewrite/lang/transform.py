"""The Lark parse tree -> the AST (:mod:`rewrite.lang.ast`): one transformer method per grammar
rule, each AST record with the span from its first token to its last. Values the grammar
accepts but the language does not (a rule option given twice, an unknown comparison) are
:class:`RuleError` diagnostics, raised from inside the transform (Lark wraps them in
``VisitError``)."""

from __future__ import annotations

import ast as _pyast

from lark import Token, Transformer, v_args

from rewrite.errors import Diagnostic, RuleError
from rewrite.lang import ast
from rewrite.lang.source import Source, Span
from rewrite.lang.syntax_errors import did_you_mean, needs_comparison, unknown_selector


def _unquote(token: Token, span: Span) -> str:
    try:
        return _pyast.literal_eval(str(token))
    except (ValueError, SyntaxError):
        raise RuleError([Diagnostic("error", f"invalid string {token}", span)]) from None


def _measure(key: Token, op: str | None, span: Span) -> str:
    """The name of a comparison (``size >= 3``, ``call 0``), checked; ``op`` None: the bare
    ``call N`` form."""
    name = str(key)
    measures = ", ".join(ast.MEASURES[:-1]) + f" or {ast.MEASURES[-1]}"
    if op is None and name != "call":
        if name in ast.MEASURES:
            raise RuleError([needs_comparison(name, span)])
        raise RuleError([unknown_selector(name, span)])
    if key.type == "STRING" or name not in ast.MEASURES:
        shown = name if key.type == "STRING" else repr(name)
        raise RuleError([Diagnostic(
            "error", f"unknown comparison {shown}; {measures} compare with an integer "
            '(a tag test compares with a string: key == "value")', span,
            did_you_mean(name.strip('"'), list(ast.MEASURES)))])
    return name


def _integer(token: Token, name: str, span: Span) -> int:
    """A comparison's value, which must be an integer."""
    try:
        return int(str(token))
    except ValueError:
        raise RuleError([Diagnostic(
            "error", f"{name} compares with an integer, not {str(token)!r}", span)]) from None


class ToAst(Transformer):
    """One method per grammar rule; every AST record gets the span from its first token to
    its last."""

    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    def _span(self, item) -> Span:
        if isinstance(item, Token):
            return Span(self.source, item.line or 1, item.column or 1, item.end_line,
                        item.end_column)
        meta = item
        if getattr(meta, "empty", False):
            return Span(self.source, 1, 1)
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    def _text(self, token: Token) -> str:
        if token.type == "STRING":
            return _unquote(token, self._span(token))
        return str(token)

    # statements
    def start(self, items):
        return list(items)

    @v_args(meta=True)
    def include(self, meta, items):
        return ast.Include(self._text(items[0]), self._span(meta))

    @v_args(meta=True)
    def group_rule(self, meta, items):
        selector, options = items[0], items[1:]
        fields: dict = {}
        for kind, value, span in options:
            if kind in fields:
                keyword = {"name": "as"}.get(kind, kind)
                raise RuleError([Diagnostic("error", f"'{keyword}' given twice in one rule", span)])
            fields[kind] = value
            if kind in ("name", "domain"):
                fields[f"{kind}_span"] = span
        return ast.GroupRule(selector, self._span(meta), **fields)

    def name_option(self, items):
        return ("name", self._text(items[0]), self._span(items[0]))

    def domain_option(self, items):
        return ("domain", self._text(items[0]), self._span(items[0]))

    def priority(self, items):
        return ("priority", int(items[0]), self._span(items[0]))

    @v_args(meta=True)
    def flat_rule(self, meta, items):
        priority = items[1][1] if len(items) > 1 else 0
        return ast.FlatRule(items[0], self._span(meta), priority)

    @v_args(meta=True)
    def tag_rule(self, meta, items):
        selector = items[0]
        assignments = tuple(i for i in items[1:] if isinstance(i, ast.Assignment))
        priority = next((i[1] for i in items[1:] if isinstance(i, tuple)), 0)
        return ast.TagRule(selector, assignments, self._span(meta), priority)

    @v_args(meta=True)
    def assignment(self, meta, items):
        return ast.Assignment(self._text(items[0]), self._text(items[1]), self._span(meta))

    @v_args(meta=True)
    def split_rule(self, meta, items):
        key = self._text(items[0])
        order = tuple(self._text(t) for t in items[1:])
        seen = set()
        for token, value in zip(items[1:], order):
            if value in seen:
                raise RuleError([Diagnostic(
                    "error", f"value {value!r} listed twice in the order", self._span(token))])
            seen.add(value)
        return ast.SplitRule(key, order, self._span(meta))

    @v_args(meta=True)
    def cycle_policy(self, meta, items):
        action = str(items[0])
        if action not in ast.CYCLE_POLICIES:
            raise RuleError([Diagnostic(
                "error", f"unknown cycle policy {action!r}; write 'on cycle error' (stop) or "
                "'on cycle flatten' (flatten the group, with a warning)", self._span(items[0]),
                did_you_mean(action, list(ast.CYCLE_POLICIES)),
            )])
        return ast.CyclePolicy(action, self._span(meta))

    # selectors
    @v_args(meta=True)
    def or_selector(self, meta, items):
        return ast.BoolSelector("or", tuple(items), self._span(meta))

    @v_args(meta=True)
    def and_selector(self, meta, items):
        return ast.BoolSelector("and", tuple(items), self._span(meta))

    @v_args(meta=True)
    def not_selector(self, meta, items):
        return ast.NotSelector(items[0], self._span(meta))

    @v_args(meta=True)
    def path_selector(self, meta, items):
        return ast.PathSelector(self._text(items[0]), self._span(meta))

    @v_args(meta=True)
    def class_selector(self, meta, items):
        return ast.ClassSelector(self._text(items[0]), self._span(meta))

    @v_args(meta=True)
    def op_selector(self, meta, items):
        return ast.OpSelector(self._text(items[0]), self._span(meta))

    @v_args(meta=True)
    def tag_equals(self, meta, items):
        key, _, value = items  # the == token is kept: EQ is a named terminal
        return ast.TagSelector(self._text(key), self._text(value), False, self._span(meta))

    @v_args(meta=True)
    def tag_not_equals(self, meta, items):
        key, _, value = items
        return ast.TagSelector(self._text(key), self._text(value), True, self._span(meta))

    @v_args(meta=True)
    def tag_present(self, meta, items):
        return ast.TagSelector(self._text(items[0]), None, False, self._span(meta))

    def compare(self, items):
        return items[0]

    @v_args(meta=True)
    def measure_selector(self, meta, items):
        key, value = items[0], items[-1]
        op = str(items[1]) if len(items) == 3 else None
        return ast.MeasureSelector(_measure(key, op, self._span(key)), op or "==",
                                   _integer(value, str(key), self._span(value)), self._span(meta))

    @v_args(meta=True)
    def any_selector(self, meta, items):
        return ast.AnySelector(self._span(meta))
