"""Parse rules text with the packaged Lark grammar into a :class:`RulesFile`.

The grammar is loaded once. Lark errors become :class:`RuleError` diagnostics with
``file:line:col``, the offending line and, where cheap, a "did you mean" hint.
"""

from __future__ import annotations

import ast as _pyast
import difflib
import functools
from importlib import resources

import lark
from lark import Lark, Token, Transformer, v_args

from rewrite.errors import Diagnostic, RuleError
from rewrite.lang import ast
from rewrite.lang.source import Source, Span

STATEMENT_KEYWORDS = ("include", "group", "flat", "tag", "split", "on")
SELECTOR_KEYWORDS = ("path", "class", "op", "has", "any", "not", "(")
OPTION_KEYWORDS = ("as", "domain", "priority", "with", "order", "by", "cycle")
ALL_KEYWORDS = STATEMENT_KEYWORDS + SELECTOR_KEYWORDS + OPTION_KEYWORDS + ("and", "or")

_TERMINAL_WORDS = {
    "STRING": 'a quoted string like "text"',
    "PATTERN": "a pattern like h.*",
    "NAME": "a name",
    "SIGNED_INT": "an integer",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "EQUAL": "'='",
    "$END": "end of file",
    "EQ": "'=='",
    "NE": "'!='",
    "LE": "'<='",
    "GE": "'>='",
    "LT": "'<'",
    "GT": "'>'",
    "NUMBER": "an integer",
}
_AFTER_NAME = {"EQ", "NE", "LE", "GE", "LT", "GT", "NUMBER"}
"""What may follow a name in a selector: a tag test or a comparison (``size >= 3``)."""


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
        raise RuleError([_syntax_diagnostic(e, source)]) from None
    _check_nesting(tree, source)
    try:
        statements = _ToAst(source).transform(tree)
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, RuleError):
            raise e.orig_exc from None
        raise
    return ast.RulesFile(tuple(statements), name)


# --- errors ----------------------------------------------------------------------------------


def _describe_expected(expected: set[str]) -> str:
    words = []
    for term in sorted(expected):
        if term in _TERMINAL_WORDS:
            words.append(_TERMINAL_WORDS[term])
        elif term.isupper():
            # anonymous keyword terminals are named after their text, e.g. GROUP, AND
            words.append(f"'{term.lower()}'")
        else:
            words.append(term)
    words = sorted(set(words))
    if len(words) > 6:
        return ", ".join(words[:6]) + ", ..."
    return ", ".join(words)


def _expected_keywords(expected: set[str]) -> list[str]:
    return [t.lower() for t in expected if t.isupper() and t.lower() in ALL_KEYWORDS]


def _suggest(word: str, candidates: list[str]) -> str | None:
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else None


def _syntax_diagnostic(e: lark.UnexpectedInput, source: Source) -> Diagnostic:
    line = getattr(e, "line", None) or 1
    column = getattr(e, "column", None) or 1
    if line < 1:  # end of input
        lines = source.text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    span = Span(source, line, column)
    if isinstance(e, lark.UnexpectedCharacters):
        char = source.text[e.pos_in_stream] if e.pos_in_stream < len(source.text) else "?"
        if char == '"':
            return Diagnostic("error", "unterminated string", span, 'close it with a " on the same line')
        return Diagnostic("error", f"unexpected character {char!r}", span)
    if isinstance(e, lark.UnexpectedEOF):
        expected = set(e.expected)
        return Diagnostic("error", f"unexpected end of file, expected {_describe_expected(expected)}", span)
    if isinstance(e, lark.UnexpectedToken):
        token: Token = e.token
        expected = set(e.expected) | set(getattr(e, "accepts", set()) or set())
        if expected and expected <= _AFTER_NAME and str(token) == "=":
            after = source.text[e.pos_in_stream + 1:e.pos_in_stream + 2]
            if after in ("<", ">"):
                return Diagnostic("error", f"unknown comparison '={after}'", span,
                                  f"did you mean '{after}='?")
            return Diagnostic(
                "error", "a tag test compares with '==' (or '!='); a single '=' sets a tag in a "
                "tag rule", span, "did you mean '=='?",
            )
        if expected == {"STRING"} and str(token) == "=":
            return Diagnostic(
                "error", "a tag rule sets a tag with a single '='", span,
                'write key = "value" (== is for tag tests in selectors)',
            )
        if expected and expected <= _AFTER_NAME and {"EQ", "NE"} <= expected:
            # `NAME` followed by something other than a comparison: almost always a misspelt
            # keyword
            end = len(source.text) if token.type == "$END" else e.pos_in_stream
            word, word_span = _previous_word(source, end)
            if word in ast.MEASURES:
                return _needs_comparison(word, word_span)
            return _unknown_selector(word, word_span)
        if expected == {"NAME"}:
            end = len(source.text) if token.type == "$END" else e.pos_in_stream
            if _previous_word(source, end)[0] == "cycle":
                return Diagnostic("error", "'on cycle' needs a policy: error or flatten",
                                  _end_span(source) if token.type == "$END" else span,
                                  "write 'on cycle flatten' or 'on cycle error'")
        if token.type == "$END":
            return Diagnostic(
                "error",
                f"unexpected end of file, expected {_describe_expected(expected)}",
                _end_span(source),
            )
        hint = None
        if token.type in ("NAME", "PATTERN"):
            hint = _suggest(str(token), _expected_keywords(expected) or list(ALL_KEYWORDS))
        return Diagnostic(
            "error",
            f"unexpected {str(token)!r}, expected {_describe_expected(expected)}",
            span,
            hint,
        )
    return Diagnostic("error", str(e).splitlines()[0], span)


def _end_span(source: Source) -> Span:
    text = source.text.rstrip()
    line = text.count("\n") + 1
    column = len(text) - (text.rfind("\n") + 1) + 1
    return Span(source, line, column)


def _previous_word(source: Source, pos: int) -> tuple[str, Span]:
    """The identifier that ends before ``pos`` (comments skipped), with its span."""
    try:
        tokens = list(_parser().lex(source.text[:pos]))
    except lark.LarkError:  # pragma: no cover - the text before pos lexed when parsing
        tokens = []
    if tokens:
        last = tokens[-1]
        return str(last), Span(source, last.line or 1, last.column or 1)
    text = source.text[:pos].rstrip()
    start = len(text)
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    line = text.count("\n", 0, start) + 1
    column = start - (text.rfind("\n", 0, start) + 1) + 1
    return text[start:], Span(source, line, column)


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


# --- tree -> AST -----------------------------------------------------------------------------


def _unquote(token: Token, span: Span) -> str:
    try:
        return _pyast.literal_eval(str(token))
    except (ValueError, SyntaxError):
        raise RuleError([Diagnostic("error", f"invalid string {token}", span)]) from None


def _unknown_selector(word: str, span: Span) -> Diagnostic:
    return Diagnostic(
        "error",
        f"unknown selector {word!r}; a selector is path, class, op, a tag test "
        f'(key == "value", key != "value", has key), any, not, or (...)',
        span,
        _suggest(word, list(SELECTOR_KEYWORDS[:-1]) + list(ast.MEASURES)),
    )


def _needs_comparison(word: str, span: Span) -> Diagnostic:
    return Diagnostic(
        "error", f"{word} needs a comparison with an integer: {word} >= N, {word} == N, ... "
        "(only call takes a bare number: call 0)", span)


def _measure(key: Token, op: str | None, span: Span) -> str:
    """The name of a comparison (``size >= 3``, ``call 0``), checked; ``op`` None: the bare
    ``call N`` form."""
    name = str(key)
    measures = ", ".join(ast.MEASURES[:-1]) + f" or {ast.MEASURES[-1]}"
    if op is None and name != "call":
        if name in ast.MEASURES:
            raise RuleError([_needs_comparison(name, span)])
        raise RuleError([_unknown_selector(name, span)])
    if key.type == "STRING" or name not in ast.MEASURES:
        shown = name if key.type == "STRING" else repr(name)
        raise RuleError([Diagnostic(
            "error", f"unknown comparison {shown}; {measures} compare with an integer "
            '(a tag test compares with a string: key == "value")', span,
            _suggest(name.strip('"'), list(ast.MEASURES)))])
    return name


def _integer(token: Token, name: str, span: Span) -> int:
    """A comparison's value, which must be an integer."""
    try:
        return int(str(token))
    except ValueError:
        raise RuleError([Diagnostic(
            "error", f"{name} compares with an integer, not {str(token)!r}", span)]) from None


class _ToAst(Transformer):
    """One method per grammar rule; every AST record gets the span of its first token."""

    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    def _span(self, item) -> Span:
        if isinstance(item, Token):
            return Span(self.source, item.line or 1, item.column or 1)
        meta = item
        if getattr(meta, "empty", False):
            return Span(self.source, 1, 1)
        return Span(self.source, meta.line, meta.column)

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
                raise RuleError(
                    [Diagnostic("error", f"value {value!r} listed twice in the order", self._span(token))]
                )
            seen.add(value)
        return ast.SplitRule(key, order, self._span(meta))

    @v_args(meta=True)
    def cycle_policy(self, meta, items):
        action = str(items[0])
        if action not in ast.CYCLE_POLICIES:
            raise RuleError([Diagnostic(
                "error", f"unknown cycle policy {action!r}; write 'on cycle error' (stop) or "
                "'on cycle flatten' (flatten the group, with a warning)", self._span(items[0]),
                _suggest(action, list(ast.CYCLE_POLICIES)),
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
