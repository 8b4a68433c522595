"""Bad rules: generated and mutated rule texts never raise anything but RuleError.

The full run (10,000+ cases) is ``python -m tools.fuzz_rules``; this runs the same property on a
few hundred, plus the cases earlier fuzz runs found, as regression tests.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings

import rewrite
from tools.fuzz_rules import check_text, include_folder, rule_texts


@pytest.fixture(scope="module")
def base():
    with include_folder() as folder:
        yield folder


@pytest.mark.slow  # a fuzzer: hypothesis, 200 rule texts
@settings(max_examples=200, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(text=rule_texts())
def test_only_rule_errors_escape(text, base):
    check_text(text, base)


@pytest.mark.parametrize(
    "text",
    [
        "group any\rgroup path h.[ ",  # lone \r: the parser and the display disagreed on lines
        "group any\fgroup path h.[ ",  # form feed, same
        "\x1e0",  # a control character before the error
        "group path h.[5-1x]",  # reversed character range escaped as re.error
        'include "binary.rules"',  # non-UTF-8 include had no file:line:col
        "group " + "not " * 3000 + "any",  # RecursionError
        "group " + "(any or " * 500 + "any" + ")" * 500,
        "group\tpath\th.[",  # tabs before the caret
        "group 名前",  # wide characters before the caret
    ],
)
def test_found_by_fuzzing(text, base):
    assert check_text(text, base) == "error"


def test_caret_sits_under_the_error_after_tabs():
    with pytest.raises(rewrite.RuleError) as e:
        rewrite.parse_rules("group\tbogus\n", "x.rules")
    first, line, caret = str(e.value).splitlines()[:3]
    assert first.startswith("x.rules:1:7: error: unknown selector 'bogus'")
    assert line == "    group\tbogus"
    assert caret == "    " + " " * 5 + "\t^"


def test_reversed_range_is_a_rule_error_at_the_pattern():
    with pytest.raises(rewrite.RuleError) as e:
        rewrite.parse_rules("flat class *X\ngroup path h.[5-1x]\n", "x.rules")
    assert str(e.value).startswith("x.rules:2:7: error: bad pattern: bad character range 5-1")


def test_deep_nesting_is_refused_with_a_location():
    with pytest.raises(rewrite.RuleError) as e:
        rewrite.parse_rules("flat any\ngroup " + "not " * 500 + "any", "x.rules")
    assert "x.rules:2:" in str(e.value)
    assert "nested too deeply" in str(e.value)
    rewrite.parse_rules("group " + "not " * 50 + "any")  # reasonable nesting still works


def test_wide_numeric_ranges_match_exactly():
    rules = rewrite.parse_rules("group path layers.[7-99999]")
    from rewrite.compile.selectors import Facts

    pred = rules.rules[0].predicate
    hits = [n for n in ["6", "7", "07", "100", "99999", "100000", "5000"]
            if pred(Facts((f"layers.{n}",), (), (), {}))]
    assert hits == ["7", "100", "99999", "5000"]


def test_unknown_selector_at_end_of_file_names_the_word():
    with pytest.raises(rewrite.RuleError) as e:
        rewrite.parse_rules("group any or\n  stge  # a comment\n", "x.rules")
    assert str(e.value).startswith("x.rules:2:3: error: unknown selector 'stge'")


def test_include_of_a_binary_file_points_at_its_first_bad_byte(base):
    with pytest.raises(rewrite.RuleError) as e:
        rewrite.parse_rules('flat any\ninclude "binary.rules"\n', "x.rules", base=base)
    [diagnostic] = e.value.diagnostics
    assert diagnostic.span.source.name.endswith("binary.rules")
    assert "not UTF-8 text: invalid start byte" in diagnostic.message


def test_load_rules_reports_the_first_bad_byte_with_its_line(tmp_path):
    rules = tmp_path / "x.rules"
    rules.write_bytes(b"flat any\n  group path \xe2\x82 h.0\n")  # a cut 3-byte character
    with pytest.raises(rewrite.RuleError) as e:
        rewrite.load_rules(rules)
    [diagnostic] = e.value.diagnostics
    assert (diagnostic.span.line, diagnostic.span.column) == (2, 14)
    assert diagnostic.render().splitlines()[1:3] == ["      group path ", "                 ^"]
