"""Fuzz the rules front end: nothing but ``RuleError`` escapes ``rewrite.parse_rules``.

    .venv/bin/python -m tools.fuzz_rules --cases 10000 --seed 0

Rule texts come from the grammar's vocabulary (well-formed statements with random selectors,
token soup, deep nesting), from mutations of the shipped rule files, and from arbitrary text.
Every case must either compile to a ``RuleSet`` or raise ``RuleError`` whose diagnostics each
carry ``file:line:col`` inside the text they point into (the fuzzed text, or an included file),
show that line, and have a one-line message. Prints the case count and the outcome; exits 1 on
the first violation (hypothesis shrinks it and prints the falsifying text first).
``tests/test_fuzz_rules.py`` runs the same property on a few hundred cases.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Iterator

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from rewrite import RuleError, RuleSet, parse_rules
from rewrite.errors import Diagnostic

NAME = "fuzz.rules"

# --- vocabulary --------------------------------------------------------------------------

KEYWORDS = ["include", "group", "flat", "tag", "split", "by", "order", "as", "domain",
            "priority", "with", "path", "class", "op", "has", "any", "not", "and", "or"]
PUNCTUATION = ["(", ")", ",", "=", "==", "!=", "#", '"', "{", "}", "[", "]", "@", ";", "\\"]
PATTERNS = ["h.*", "**", "h.[0-3].attn", "*GPT2Block", "transformers.**.LlamaDecoderLayer",
            "aten.mm.*", "aten.mm", "layers.[0,2,4]", "h.[ab]", "h.[5-1x]", "h.[9-0]", "h.[]",
            "h.[", "h.]", "h.[0-99999]", "h.[0-100001]", "**.attn", "a.**", "?", "***", "<lambda>",
            "a:b", "-", ".", "..", "*.*", "[0-3][4-5]", "shared@1", "h.[#x]", "h.[(,)]",
            "h.[0-3", "h.[a-z]", "h.[z-a]", "[^a]", "h.[\\d]", "@", "h.[0-007]"]
TEMPLATES = ["{class}", "pkg.{package}", "{clas}", "{", "}", "{class!r}", "{0}", "{}",
             "{class:>3}", "{name}_{index}", "{value}", "{{literal}}", "{qualname.x}",
             "{class[0]}", "{path}", "{module}", "", "pkg.rewrite"]
STRINGS = ['"encode"', '"decode"', '""', '"a b"', '"\\n"', '"\\x41"', '"\\x"', '"\\N"',
           '"\\N{DASH}"', '"\\777"', '"\\u00e9"', '"é"', '"unterminated', '"tab\there"']
TAG_NAMES = ["stage", "role", "tag", "x", "_k1", "Stage9"]
QUOTED_TAG_NAMES = ['"stage"', '"my key"', '""', '"a.b"', '"\\x"', '"é"']
INTEGERS = ["0", "1", "-3", "+5", "99999999999999999999", "-0", "07"]
INCLUDES = ["ok.rules", "broken.rules", "cycle.rules", "binary.rules", "folder.rules",
            "gpt2.rules", "modularize.rules", "split_by_tags.rules", "nope.rules", "", "/", ".."]
WHITESPACE = [" ", "  ", "\n", "\t", "\r\n", "\r", "\f", "\v", "\n\n", " # comment\n",
              "\u2028", "\u00a0", "\x00"]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _shipped_rules() -> list[str]:
    folder = resources.files("rewrite.library")
    return [f.read_text(encoding="utf-8") for f in folder.iterdir() if f.name.endswith(".rules")]


# --- strategies --------------------------------------------------------------------------

ws = st.sampled_from(WHITESPACE[:6]) | st.sampled_from(WHITESPACE)
pattern_text = st.sampled_from(PATTERNS) | st.text(
    alphabet="ab01*?.[]-<>:_,", min_size=1, max_size=12
)
pattern = pattern_text | pattern_text.map(_quote)
string = st.sampled_from(STRINGS) | st.sampled_from(TEMPLATES).map(_quote)
tag_name = st.sampled_from(TAG_NAMES) | st.sampled_from(KEYWORDS) | st.sampled_from(
    QUOTED_TAG_NAMES
)

atom = st.one_of(
    st.tuples(st.sampled_from(["path", "class", "op"]), pattern).map(" ".join),
    st.tuples(tag_name, st.sampled_from(["==", "!="]), string).map(" ".join),
    tag_name.map(lambda n: f"has {n}"),
    st.just("any"),
)


def _combine(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(["and", "or"]), inner).map(" ".join),
        inner.map(lambda s: f"not {s}"),
        inner.map(lambda s: f"({s})"),
    )


selector = st.recursive(atom, _combine, max_leaves=8)
option = st.one_of(
    string.map(lambda s: f"as {s}"),
    string.map(lambda s: f"domain {s}"),
    st.sampled_from(INTEGERS).map(lambda n: f"priority {n}"),
)
assignment = st.tuples(tag_name, string).map(lambda kv: f"{kv[0]} = {kv[1]}")

statement = st.one_of(
    st.tuples(selector, st.lists(option, max_size=3)).map(
        lambda t: " ".join(["group", t[0], *t[1]])
    ),
    st.tuples(selector, st.lists(option, max_size=1)).map(
        lambda t: " ".join(["flat", t[0], *t[1]])
    ),
    st.tuples(selector, st.lists(assignment, min_size=1, max_size=3)).map(
        lambda t: f"tag {t[0]} with {', '.join(t[1])}"
    ),
    st.tuples(tag_name, st.lists(string, max_size=4)).map(
        lambda t: f"split by {t[0]}" + (f" order {', '.join(t[1])}" if t[1] else "")
    ),
    st.sampled_from(INCLUDES).map(lambda p: f"include {_quote(p)}"),
    st.just("# just a comment"),
)


@st.composite
def rule_file(draw) -> str:
    """A sequence of statements from the grammar, mostly well-formed."""
    parts = draw(st.lists(statement, max_size=6))
    out = []
    for part in parts:
        out.append(part)
        out.append(draw(ws))
    return "".join(out)


token = st.one_of(
    st.sampled_from(KEYWORDS), st.sampled_from(PUNCTUATION), st.sampled_from(PATTERNS),
    st.sampled_from(STRINGS), st.sampled_from(INTEGERS), st.sampled_from(TAG_NAMES),
)


@st.composite
def token_soup(draw) -> str:
    """Vocabulary tokens in any order."""
    tokens = draw(st.lists(token, max_size=20))
    return "".join(t + draw(ws) for t in tokens)


@st.composite
def deep_nesting(draw) -> str:
    """Selectors nested far deeper than anyone writes (recursion limits)."""
    depth = draw(st.integers(min_value=1, max_value=3000))
    shape = draw(st.sampled_from(["not", "paren", "and", "or-not"]))
    if shape == "not":
        body = "not " * depth + "any"
    elif shape == "paren":
        body = "(" * depth + "any" + ")" * depth
    elif shape == "and":
        body = "(any and " * depth + "any" + ")" * depth
    else:
        body = "(any or not " * depth + "any" + ")" * depth
    return draw(st.sampled_from(["group ", "flat ", "tag "])) + body + draw(
        st.sampled_from(["", " with x = \"1\"", " priority 1"])
    )


@st.composite
def mutated(draw, sources: list[str]) -> str:
    """A shipped or generated rules text with a few random edits."""
    text = draw(st.sampled_from(sources) | rule_file())
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        n = len(text)
        i = draw(st.integers(min_value=0, max_value=n))
        j = draw(st.integers(min_value=i, max_value=min(n, i + 20)))
        edit = draw(st.sampled_from(["insert", "delete", "replace", "duplicate", "truncate"]))
        if edit == "insert":
            text = text[:i] + draw(token | ws) + text[i:]
        elif edit == "delete":
            text = text[:i] + text[j:]
        elif edit == "replace":
            text = text[:i] + draw(st.characters(codec="utf-8")) + text[i + 1:]
        elif edit == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i]
    return text


def rule_texts() -> st.SearchStrategy[str]:
    """Every kind of rules text the fuzzer tries."""
    return st.one_of(
        rule_file(),
        mutated(_shipped_rules()),
        token_soup(),
        deep_nesting(),
        st.text(max_size=80),
        st.binary(max_size=80).map(lambda b: b.decode("latin-1")),
    )


# --- the property --------------------------------------------------------------------------


@contextlib.contextmanager
def include_folder() -> Iterator[Path]:
    """A folder of include targets: valid, broken, cyclic, binary, and a directory."""
    with tempfile.TemporaryDirectory(prefix="fuzz-rules-") as tmp:
        base = Path(tmp)
        (base / "ok.rules").write_text("group any\n")
        (base / "broken.rules").write_text("group path\nflat class *X\n")
        (base / "cycle.rules").write_text('# includes itself\ninclude "cycle.rules"\n')
        (base / "binary.rules").write_bytes(b"\xff\xfe\x00group any\n")
        (base / "folder.rules").mkdir()
        yield base


def _visible(text: str) -> str:
    return "".join(c for c in text if c.isprintable() and not c.isspace())


def check_diagnostic(d: Diagnostic, text: str) -> None:
    """A diagnostic names ``file:line:col`` inside the text it is about and shows that line."""
    assert d.severity == "error", d
    assert "\n" not in d.message, f"message spans lines: {d.message!r}"
    assert d.span is not None, f"diagnostic without file:line:col: {d.render()}"
    source = d.span.source
    if source.name == NAME:
        assert source.text == text, "diagnostic points into another text under the same name"
    lines = source.text.split("\n")
    assert 1 <= d.span.line <= len(lines), f"line {d.span.line} outside 1..{len(lines)}"
    line = lines[d.span.line - 1]
    assert 1 <= d.span.column <= len(line) + 1, (
        f"column {d.span.column} outside 1..{len(line) + 1} of {line!r}"
    )
    rendered = d.render().split("\n")
    assert rendered[0].startswith(f"{source.name}:{d.span.line}:{d.span.column}: error: "), rendered
    if _visible(line):
        assert len(rendered) >= 3, f"source line not shown: {rendered}"
        assert _visible(rendered[1]) == _visible(line), f"shows {rendered[1]!r}, not {line!r}"
        assert rendered[2].strip() == "^", f"caret line is {rendered[2]!r}"


def check_text(text: str, base: Path) -> str:
    """Parse one text; return ``valid`` or ``error``; AssertionError if the contract breaks."""
    try:
        rules = parse_rules(text, NAME, base=base)
    except RuleError as e:
        assert e.diagnostics, "RuleError without diagnostics"
        for d in e.diagnostics:
            check_diagnostic(d, text)
        return "error"
    assert isinstance(rules, RuleSet)
    return "valid"


# --- the run ----------------------------------------------------------------------------------


def run(cases: int, random_seed: int) -> int:
    counts: collections.Counter[str] = collections.Counter()
    slowest = (0.0, "")
    with include_folder() as base:

        @seed(random_seed)
        @settings(max_examples=cases, database=None, deadline=None, derandomize=False,
                  suppress_health_check=list(HealthCheck), print_blob=False)
        @given(rule_texts())
        def fuzz(text: str) -> None:
            nonlocal slowest
            start = time.perf_counter()
            outcome = check_text(text, base)
            elapsed = time.perf_counter() - start
            counts[outcome] += 1
            if elapsed > slowest[0]:
                slowest = (elapsed, text)

        start = time.perf_counter()
        failed = None
        try:
            fuzz()
        except Exception as e:  # hypothesis has printed the shrunk falsifying example
            failed = e
        total = sum(counts.values())
        print(f"cases: {total} (valid {counts['valid']}, RuleError {counts['error']}) "
              f"in {time.perf_counter() - start:.1f} s; slowest {slowest[0] * 1000:.0f} ms: "
              f"{slowest[1][:60]!r}")
        if failed is not None:
            _report(failed)
            return 1
        print("outcome: ok, nothing but RuleError escaped, every diagnostic had file:line:col")
        return 0


def _report(failed: BaseException) -> None:
    errors = list(failed.exceptions) if isinstance(failed, BaseExceptionGroup) else [failed]
    print(f"outcome: FAILED, {len(errors)} distinct failure(s):")
    for error in errors:
        example = next((n for n in getattr(error, "__notes__", ()) if "fuzz(" in n), "")
        text = example.strip().removeprefix("fuzz(").removesuffix(")").strip().rstrip(",")
        print(f"  {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        print(f"    {text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run(args.cases, args.seed)


if __name__ == "__main__":
    sys.exit(main())
