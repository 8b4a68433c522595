"""The rules language: what parses, into what, and the diagnostics for what does not."""

from __future__ import annotations

import pytest

import rewrite
from rewrite.lang import ast, parse_text


def only_rule(text: str):
    statements = parse_text(text, "t.rules").statements
    assert len(statements) == 1, statements
    return statements[0]


def error_of(text: str, name: str = "t.rules") -> rewrite.RuleError:
    with pytest.raises(rewrite.RuleError) as info:
        rewrite.parse_rules(text, name)
    return info.value


# --- valid texts -----------------------------------------------------------------------------


def test_every_statement_kind_with_comments_and_line_breaks():
    text = """# a comment line
include "common.rules"          # trailing comment
group class *GPT2Block
    as "Block_{index}"          # options may continue on the next lines
    domain "my.{package}"
    priority 2
flat class *Dropout priority -1
tag path h.[0-5] or op aten.mm.* with stage = "encode", device = "0"
split by stage order "encode", "decode"
"""
    statements = parse_text(text, "t.rules").statements
    assert [type(s).__name__ for s in statements] == [
        "Include", "GroupRule", "FlatRule", "TagRule", "SplitRule"]
    include, group, flat, tag, split = statements
    assert include.path == "common.rules" and include.span.line == 2
    assert group == ast.GroupRule(ast.ClassSelector("*GPT2Block", None), None, "Block_{index}",
                                  None, "my.{package}", None, 2)
    assert (group.span.line, group.span.column) == (3, 1)
    assert flat.priority == -1
    assert tag.assignments == (ast.Assignment("stage", "encode", None),
                               ast.Assignment("device", "0", None))
    assert isinstance(tag.selector, ast.BoolSelector) and tag.selector.op == "or"
    assert split == ast.SplitRule("stage", ("encode", "decode"), None)


@pytest.mark.parametrize("text, expected", [
    ("group path h.*", ast.PathSelector("h.*", None)),
    ("group path **", ast.PathSelector("**", None)),
    ("group path h.[0-3].attn", ast.PathSelector("h.[0-3].attn", None)),
    ("group path h.[1,3,5]", ast.PathSelector("h.[1,3,5]", None)),
    ("group path shared@1", ast.PathSelector("shared@1", None)),
    ('group path "odd name"', ast.PathSelector("odd name", None)),
    ("group class transformers.**.LlamaDecoderLayer",
     ast.ClassSelector("transformers.**.LlamaDecoderLayer", None)),
    ("group op aten.mm.*", ast.OpSelector("aten.mm.*", None)),
    ('group stage == "encode"', ast.TagSelector("stage", "encode", False, None)),
    ('group stage != "encode"', ast.TagSelector("stage", "encode", True, None)),
    ("group has stage", ast.TagSelector("stage", None, False, None)),
    ('group "my key" == "v"', ast.TagSelector("my key", "v", False, None)),
    ('group tag == "x"', ast.TagSelector("tag", "x", False, None)),  # node.tag's key
    ("group any", ast.AnySelector(None)),
    ("group path group", ast.PathSelector("group", None)),  # keywords are fine as patterns
])
def test_each_selector(text, expected):
    assert only_rule(text).selector == expected


def test_not_binds_tighter_than_and_tighter_than_or():
    rule = only_rule("group path a or not path b and class C")
    a, b, c = ast.PathSelector("a", None), ast.PathSelector("b", None), ast.ClassSelector("C", None)
    assert rule.selector == ast.BoolSelector(
        "or", (a, ast.BoolSelector("and", (ast.NotSelector(b, None), c), None)), None)
    rule = only_rule("group (path a or path b) and class C")
    assert rule.selector == ast.BoolSelector(
        "and", (ast.BoolSelector("or", (a, b), None), c), None)


def test_spans_point_at_each_part():
    rule = only_rule('\n  group path a or class B as "n"')
    assert (rule.span.line, rule.span.column) == (2, 3)
    left, right = rule.selector.operands
    assert (left.span.line, left.span.column) == (2, 9)
    assert (right.span.line, right.span.column) == (2, 19)
    assert (rule.name_span.line, rule.name_span.column) == (2, 30)


def test_empty_and_comment_only_texts_are_valid():
    assert rewrite.parse_rules("").rules == ()
    assert rewrite.parse_rules("# nothing\n\n   # here\n").rules == ()


# --- invalid texts: location, message, hint ---------------------------------------------------


@pytest.mark.parametrize("text, location, message, hint", [
    ("grop path h", "1:1", "unexpected 'grop'", "did you mean 'group'?"),
    ("group pth h", "1:7", "unknown selector 'pth'", "did you mean 'path'?"),
    ("group clas X", "1:7", "unknown selector 'clas'", "did you mean 'class'?"),
    ("group path", "1:11", "unexpected end of file, expected a pattern", None),
    ('group path h as "x', "1:17", "unterminated string", 'close it with a " on the same line'),
    ('group class X as "{clas}"', "1:18", "unknown template field {clas}",
     "did you mean '{class}'?"),
    ("group path h.[3-1]", "1:7", "bad pattern: empty range [3-1]", None),
    ("group path h.[0", "1:7", "bad pattern: unclosed '['", None),
    ("group path a@1@2", "1:7", "more than one '@'", None),
    ('group stage = "x"', "1:13", "a tag test compares with '=='", "did you mean '=='?"),
    ('tag path a with stage == "x"', "1:24", "a tag rule sets a tag with a single '='",
     'write key = "value" (== is for tag tests in selectors)'),
    ('group path a as "x" as "y"', "1:24", "'as' given twice in one rule", None),
    ('split by stage order "a", "a"', "1:27", "value 'a' listed twice in the order", None),
    ("group path a $", "1:14", "unexpected character '$'", None),
    ("group path a priority x", "1:23", "unexpected 'x', expected an integer", None),
    ("flat path a as \"x\"", "1:13", "unexpected 'as'", None),
    ("group path a\nsplit by x\nsplit by y", "3:1", "a rule set has at most one split",
     "the first split is at t.rules:2:1"),
    ("group path a or\n\n", "1:16", "unexpected end of file", None),
])
def test_errors_have_exact_positions_and_hints(text, location, message, hint):
    error = error_of(text)
    (diagnostic,) = error.diagnostics
    assert diagnostic.span.location == f"t.rules:{location}"
    assert message in diagnostic.message
    assert diagnostic.hint == hint


def test_rendered_diagnostic_shows_the_line_and_a_caret():
    text = "group class *Block\n\n   group pth h.0\n"
    rendered = str(error_of(text, "my.rules"))
    first, line, caret, hint = rendered.splitlines()
    assert first.startswith("my.rules:3:10: error: unknown selector 'pth'")
    assert line == "       group pth h.0"
    assert caret == "    " + " " * 9 + "^"
    assert hint.strip() == "did you mean 'path'?"


def test_errors_are_rule_errors_with_exit_code_1():
    error = error_of("group")
    assert isinstance(error, rewrite.RewriteError) and error.exit_code == 1
