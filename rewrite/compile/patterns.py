"""Glob patterns of the rules language, compiled to regular expressions.

* ``*`` any characters inside one dotted segment, ``?`` one such character;
* ``**`` any number of segments (also none): ``h.**`` matches ``h`` and ``h.0.attn``,
  ``**.attn`` matches ``attn`` and ``h.0.attn``, ``**`` matches everything;
* ``[0-3]`` a decimal number in a range, ``[1,3,5]`` one of a list, ``[ab]`` a character class.

Class patterns without a dot match the class name alone (``*GPT2Block``); with a dot, the
qualified name (``transformers.**.LlamaDecoderLayer``). Op patterns also match the target
without its overload: ``aten.mm`` matches ``aten.mm.default``.
"""

from __future__ import annotations

import functools
import re

_MAX_RANGE = 100_000


class PatternError(ValueError):
    """A malformed pattern; the message says what is wrong."""


def _bracket(body: str) -> str:
    numbers = re.fullmatch(r"(\d+)-(\d+)", body)
    if numbers:
        low, high = int(numbers.group(1)), int(numbers.group(2))
        if low > high:
            raise PatternError(f"empty range [{body}]: {low} is greater than {high}")
        if high - low > _MAX_RANGE:
            raise PatternError(f"range [{body}] is too large")
        return "(?:" + "|".join(str(n) for n in range(low, high + 1)) + ")"
    if re.fullmatch(r"\d+(,\d+)*", body):
        return "(?:" + "|".join(body.split(",")) + ")"
    if not body:
        raise PatternError("empty brackets []")
    return "[" + re.escape(body).replace(r"\-", "-") + "]"


@functools.lru_cache(maxsize=None)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """The anchored regex of a dotted glob; raises :class:`PatternError`."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**.", i) and (i == 0 or pattern[i - 1] == "."):
            out.append(r"(?:.*\.)?")
            i += 3
        elif pattern.startswith(".**", i) and i + 3 == n:
            out.append(r"(?:\..*)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append(r"[^.]*")
            i += 1
        elif c == "?":
            out.append(r"[^.]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i)
            if end < 0:
                raise PatternError(f"unclosed '[' in {pattern!r}")
            out.append(_bracket(pattern[i + 1 : end]))
            i = end + 1
        elif c == "]":
            raise PatternError(f"unmatched ']' in {pattern!r}")
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


class Glob:
    """A compiled pattern with a memo of the strings it was asked about."""

    __slots__ = ("pattern", "_regex", "_memo")

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._regex = glob_regex(pattern)
        self._memo: dict[str, bool] = {}

    def __call__(self, text: str) -> bool:
        hit = self._memo.get(text)
        if hit is None:
            hit = self._memo[text] = self._regex.match(text) is not None
        return hit


class ClassGlob(Glob):
    """Matches the class name alone when the pattern has no dot, else the qualified name."""

    __slots__ = ("_short",)

    def __init__(self, pattern: str):
        super().__init__(pattern)
        self._short = "." not in pattern

    def __call__(self, text: str) -> bool:
        hit = self._memo.get(text)
        if hit is None:
            subject = text.rsplit(".", 1)[-1] if self._short else text
            hit = self._memo[text] = self._regex.match(subject) is not None
        return hit


class OpGlob(Glob):
    """Matches an op target, or the target without its overload name."""

    __slots__ = ()

    def __call__(self, text: str) -> bool:
        hit = self._memo.get(text)
        if hit is None:
            hit = self._regex.match(text) is not None
            if not hit and "." in text:
                hit = self._regex.match(text.rsplit(".", 1)[0]) is not None
            self._memo[text] = hit
        return hit
