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
from typing import Mapping, Sequence

import numpy as np

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
        return _number_range(low, high)
    if re.fullmatch(r"\d+(,\d+)*", body):
        return "(?:" + "|".join(body.split(",")) + ")"
    if not body:
        raise PatternError("empty brackets []")
    return "[" + re.escape(body).replace(r"\-", "-") + "]"


def _number_range(low: int, high: int) -> str:
    """A compact regex for the decimal numbers low..high (no leading zeros).

    Same language as the alternation of every number, but its size grows with the number of
    digits, not with the width of the range (``[0-99999]`` compiles in microseconds).
    """
    parts = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        last = min(high, 10**digits - 1)
        if first <= last:
            parts.extend(_same_length_range(str(first), str(last)))
    return "(?:" + "|".join(parts) + ")"


def _same_length_range(a: str, b: str) -> list[str]:
    """Regexes for the digit strings from ``a`` to ``b`` (same length, ``a <= b``)."""
    if a == b:
        return [a]
    i = 0
    while a[i] == b[i]:
        i += 1
    prefix, a, b = a[:i], a[i:], b[i:]
    rest = len(a) - 1
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return [f"{prefix}[{a[0]}-{b[0]}]" + "[0-9]" * rest]
    out = [prefix + a[0] + p for p in _same_length_range(a[1:], "9" * rest)]
    if int(b[0]) - int(a[0]) > 1:
        out.append(f"{prefix}[{int(a[0]) + 1}-{int(b[0]) - 1}]" + "[0-9]" * rest)
    out.extend(prefix + b[0] + p for p in _same_length_range("0" * rest, b[1:]))
    return out


@functools.lru_cache(maxsize=None)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """The anchored regex of a dotted glob; raises :class:`PatternError`."""
    return _compile(_glob_body(pattern, r"[^.]") + r"\Z", pattern)


@functools.lru_cache(maxsize=None)
def _lines_regex(pattern: str) -> re.Pattern[str]:
    """The regex of a dotted glob matching whole lines of a newline-joined text."""
    return _compile(r"(?m)^(?:" + _glob_body(pattern, r"[^.\n]") + r")$", pattern)


def _compile(regex: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(regex)
    except re.error as e:  # e.g. a reversed character range [z-a]
        raise PatternError(f"{e.msg} in {pattern!r}") from None


def _glob_body(pattern: str, segment_char: str) -> str:
    """The regex of a glob, unanchored; ``segment_char`` is what ``*`` and ``?`` match."""
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
            out.append(segment_char + "*")
            i += 1
        elif c == "?":
            out.append(segment_char)
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
    return "".join(out)


class TextColumn:
    """Many texts (module paths) to match patterns against, all at once.

    Kept as the distinct texts (``distinct``: each text and its id, in id order) and per item
    the id of its text (``ids``), as frontends number call paths; derived from ``texts`` when
    not given. Equality is a dict lookup and an array comparison; a pattern is matched once
    per distinct text, by a single scan in C over the distinct texts joined one per line."""

    __slots__ = ("texts", "_ids", "_distinct", "_layout")

    def __init__(self, texts: Sequence[str], ids: np.ndarray | None = None,
                 distinct: Mapping[str, int] | None = None) -> None:
        if ids is None or distinct is None:
            distinct = {}
            ids = np.fromiter((distinct.setdefault(t, len(distinct)) for t in texts),
                              dtype=np.int64, count=len(texts))
        self._ids, self._distinct = ids, distinct
        self.texts = tuple(distinct)
        """The distinct texts, by id."""
        self._layout: tuple[str, np.ndarray] | None | bool = False

    def layout(self) -> tuple[str, np.ndarray] | None:
        """``"\\n" + texts joined by "\\n" + "\\n"`` and where each text starts in it;
        None if some text has a newline of its own."""
        if self._layout is False:
            joined = "\n" + "\n".join(self.texts) + "\n"
            if joined.count("\n") != len(self.texts) + 1:
                self._layout = None
            else:
                step = np.fromiter(map(len, self.texts), dtype=np.int64,
                                   count=len(self.texts)) + 1
                self._layout = joined, np.cumsum(step) - step + 1
        return self._layout  # type: ignore[return-value]

    def equal(self, text: str) -> np.ndarray:
        """Whether each item equals ``text``."""
        found = self._distinct.get(text)
        return self._ids == found if found is not None else np.zeros(len(self), dtype=bool)

    def per_text(self, matches: np.ndarray) -> np.ndarray:
        """Per item, the answer ``matches`` gives for its text (one bool per distinct text)."""
        return matches[self._ids]

    def search(self, regex: re.Pattern[str]) -> np.ndarray | None:
        """Whether each item is a whole-line match of a ``(?m)^...$`` regex; None if the
        texts cannot be joined."""
        layout = self.layout()
        if layout is None:
            return None
        joined, starts = layout
        hits = [m.start() for m in regex.finditer(joined)]
        out = np.zeros(len(self.texts), dtype=bool)
        if hits:
            at = np.asarray(hits, dtype=np.int64)
            k = np.searchsorted(starts, at, side="right") - 1
            ok = (k >= 0) & (starts[np.maximum(k, 0)] == at)  # not the empty sentinel lines
            out[k[ok]] = True
        return self.per_text(out)

    def __len__(self) -> int:
        """The number of items."""
        return len(self._ids)


class Glob:
    """A compiled pattern with a memo of the strings it was asked about."""

    __slots__ = ("pattern", "_regex", "_memo", "matches_all", "literal")
    _whole_text = True
    """The regex is matched against the whole text (subclasses that match a part of it, or
    try more than one form, say False: :meth:`mask` then asks :meth:`__call__` per text)."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._regex = glob_regex(pattern)
        self._memo: dict[str, bool] = {}
        self.matches_all = len(pattern) >= 2 and set(pattern) == {"*"}
        """``**``: true for every text."""
        self.literal = not any(c in "*?[]" for c in pattern)
        """No wildcard: matches exactly the text ``pattern`` (see the subclasses)."""

    def __call__(self, text: str) -> bool:
        hit = self._memo.get(text)
        if hit is None:
            hit = self._memo[text] = self._regex.match(text) is not None
        return hit

    def mask(self, column: TextColumn) -> np.ndarray:
        """Whether each text of ``column`` matches, as a bool array (no memo)."""
        if self.matches_all:
            return np.ones(len(column), dtype=bool)
        if not self._whole_text:
            return column.per_text(np.array(self.test_all(column.texts), dtype=bool))
        if self.literal:
            return column.equal(self.pattern)
        found = column.search(_lines_regex(self.pattern))
        if found is None:  # a text with a newline: one at a time
            found = column.per_text(np.array(self.test_all(column.texts), dtype=bool))
        return found

    def test_all(self, texts: Sequence[str]) -> list[bool]:
        """Whether each text matches, without the memo (for texts that rarely repeat)."""
        if self.matches_all:
            return [True] * len(texts)
        if not self._whole_text:
            return [self(t) for t in texts]
        match = self._regex.match
        return [match(t) is not None for t in texts]


class ClassGlob(Glob):
    """Matches the class name alone when the pattern has no dot, else the qualified name."""

    __slots__ = ("_short",)
    _whole_text = False

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
    _whole_text = False

    def __call__(self, text: str) -> bool:
        hit = self._memo.get(text)
        if hit is None:
            hit = self._regex.match(text) is not None
            if not hit and "." in text:
                hit = self._regex.match(text.rsplit(".", 1)[0]) is not None
            self._memo[text] = hit
        return hit
