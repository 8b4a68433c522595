"""Diagnostics for rules text that does not parse: Lark's errors as ``file:line:col`` messages
in the words of the rules language, with a "did you mean" hint where one is cheap; and the
diagnostics the AST transformer raises for words the grammar accepts but the language does
not (an unknown selector or comparison)."""

from __future__ import annotations

import difflib

import lark
from lark import Lark, Token

from rewrite.errors import Diagnostic
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


def did_you_mean(word: str, candidates: list[str]) -> str | None:
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"did you mean '{match[0]}'?" if match else None


def syntax_diagnostic(e: lark.UnexpectedInput, source: Source, parser: Lark) -> Diagnostic:
    """The diagnostic for a Lark parse failure (``parser``: the one that failed, to re-lex
    the text before the error)."""
    line = getattr(e, "line", None) or 1
    column = getattr(e, "column", None) or 1
    if line < 1:  # end of input
        lines = source.text.splitlines() or [""]
        line, column = len(lines), len(lines[-1]) + 1
    span = Span(source, line, column)
    if isinstance(e, lark.UnexpectedCharacters):
        char = source.text[e.pos_in_stream] if e.pos_in_stream < len(source.text) else "?"
        if char == '"':
            return Diagnostic("error", "unterminated string", span,
                              'close it with a " on the same line')
        return Diagnostic("error", f"unexpected character {char!r}", span)
    if isinstance(e, lark.UnexpectedEOF):
        expected = set(e.expected)
        return Diagnostic(
            "error", f"unexpected end of file, expected {_describe_expected(expected)}", span)
    if isinstance(e, lark.UnexpectedToken):
        return _unexpected_token(e, source, parser, span)
    return Diagnostic("error", str(e).splitlines()[0], span)


def _unexpected_token(e: lark.UnexpectedToken, source: Source, parser: Lark, span: Span
                      ) -> Diagnostic:
    """The diagnostic for an unexpected token at ``span``."""
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
        word, word_span = _previous_word(source, end, parser)
        if word in ast.MEASURES:
            return needs_comparison(word, word_span)
        return unknown_selector(word, word_span)
    if expected == {"NAME"}:
        end = len(source.text) if token.type == "$END" else e.pos_in_stream
        if _previous_word(source, end, parser)[0] == "cycle":
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
        hint = did_you_mean(str(token), _expected_keywords(expected) or list(ALL_KEYWORDS))
    return Diagnostic(
        "error",
        f"unexpected {str(token)!r}, expected {_describe_expected(expected)}",
        span,
        hint,
    )


def _end_span(source: Source) -> Span:
    text = source.text.rstrip()
    line = text.count("\n") + 1
    column = len(text) - (text.rfind("\n") + 1) + 1
    return Span(source, line, column)


def _previous_word(source: Source, pos: int, parser: Lark) -> tuple[str, Span]:
    """The identifier that ends before ``pos`` (comments skipped), with its span."""
    try:
        tokens = list(parser.lex(source.text[:pos]))
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


def unknown_selector(word: str, span: Span) -> Diagnostic:
    return Diagnostic(
        "error",
        f"unknown selector {word!r}; a selector is path, class, op, a tag test "
        f'(key == "value", key != "value", has key), any, not, or (...)',
        span,
        did_you_mean(word, list(SELECTOR_KEYWORDS[:-1]) + list(ast.MEASURES)),
    )


def needs_comparison(word: str, span: Span) -> Diagnostic:
    return Diagnostic(
        "error", f"{word} needs a comparison with an integer: {word} >= N, {word} == N, ... "
        "(only call takes a bare number: call 0)", span)
