"""Two locks compared: sections added, removed, changed (key by key, histograms item by
item), and, for a class the new side lowered to more than one function, the first
difference that kept each new function apart (``backends/onnx/distinct.py``: its
:meth:`~rewrite.backends.onnx.distinct.Variant.reason`, the line ``explain --onnx`` prints)."""

from __future__ import annotations

import re

from attrs import frozen

from rewrite.backends.onnx import label
from rewrite.structure._lock import HISTOGRAMS, Lock, Section, parse_histogram


@frozen
class Change:
    """One section that differs: ``added``, ``removed`` or ``changed``, and how."""

    title: str
    """``main``, ``function pkg.x::Block``, ``rule group class *Block``, ``class pkg.x::MLP``."""
    what: str
    """``added``, ``removed``, ``changed``; for a class, its function counts."""
    details: tuple[str, ...]


def compare(old: Lock, new: Lock) -> tuple[Change, ...]:
    """What differs from ``old`` to ``new`` (empty: the same structure). Rule sections are
    compared only when both sides know their rules."""
    def kept(lock: Lock) -> dict[str, Section]:
        rules = old.has_rules and new.has_rules
        return {t: s for t, s in lock.by_title().items() if rules or s.kind != "rule"}

    before, after = kept(old), kept(new)
    changes = []
    for title in [*before, *(t for t in after if t not in before)]:
        a, b = before.get(title), after.get(title)
        if b is None:
            changes.append(Change(title, "removed", _lines(a, "-")))
        elif a is None:
            changes.append(Change(title, "added", _lines(b, "+") + _why(title, new)))
        elif dict(a.fields) != dict(b.fields):
            changes.append(Change(title, "changed", _fields(a, b)))
    changes.extend(_classes(before, after, new))
    return tuple(sorted(changes, key=lambda c: (_ORDER.index(c.title.split(" ")[0]), c.title)))


_ORDER = ("class", "function", "main", "rule")
"""Changes are listed classes first (one more function), then functions (what moved), the
main graph, the rules."""


def _classes(before: dict[str, Section], after: dict[str, Section], new: Lock
             ) -> list[Change]:
    """``class D::Name: 1 function -> 2 (Name x3, Name_1 x1)`` for each class the new side's
    lowering kept apart in more functions than the old side has of that class."""
    found = []
    for identity in dict.fromkeys(v.identity for v in new.variants):
        domain, base = identity
        mine = re.compile(re.escape(f"function {domain}::{base}") + r"(_\d+)?")
        olds = [t for t in before if mine.fullmatch(t)]
        news = [t for t in after if mine.fullmatch(t)]
        if len(news) > len(olds):
            runs = ", ".join(f"{t.split('::', 1)[1]} x{after[t].get('runs')}" for t in news)
            found.append(Change(f"class {domain}::{base}", f"{_count(olds)} -> {len(news)} "
                                f"({runs})", ()))
    return found


def _count(titles: list[str]) -> str:
    return f"{len(titles)} function{'s' if len(titles) != 1 else ''}"


def _lines(section: Section, sign: str) -> tuple[str, ...]:
    return tuple(f"{sign} {key} = {value}" for key, value in section.fields)


def _fields(a: Section, b: Section) -> tuple[str, ...]:
    old, new = dict(a.fields), dict(b.fields)
    out = []
    for key in [*old, *(k for k in new if k not in old)]:
        x, y = old.get(key), new.get(key)
        if x == y:
            continue
        if key in HISTOGRAMS and x is not None and y is not None:
            hx, hy = parse_histogram(x), parse_histogram(y)
            items = [f"{name} {hx.get(name, 0)} -> {hy.get(name, 0)}"
                     for name in sorted(hx.keys() | hy.keys()) if hx.get(name) != hy.get(name)]
            out.append(f"{key}: {', '.join(items)}")
        elif key == "groups" and x is not None and y is not None:
            out.append(f"groups: {_members(x, y)}")
        elif key in _SIGNATURES and x is not None and y is not None:
            out.append(f"{key}: {_signature(key[:-1], x, y)}")
        elif key == "digest" and old.get("ops") == new.get("ops"):
            out.append(f"digest: {x} -> {y} (the same ops: how they connect, an attribute "
                       "or a constant changed)")
        else:
            out.append(f"{key}: {x or '(none)'} -> {y or '(none)'}")
    return tuple(out)


_SIGNATURES = ("inputs", "outputs")
_SHOWN = 3


def _signature(word: str, x: str, y: str) -> str:
    """``7 -> 8, input 7: float:r1 added``: the count, then the first positions that differ."""
    a, b = _types(x), _types(y)
    parts = [f"{len(a)} -> {len(b)}"] if len(a) != len(b) else []
    differ = []
    for k in range(max(len(a), len(b))):
        u, v = (a[k] if k < len(a) else None), (b[k] if k < len(b) else None)
        if u != v:
            differ.append(f"{word} {k}: {v} added" if u is None else
                          f"{word} {k}: {u} removed" if v is None else f"{word} {k}: {u} -> {v}")
    more = [f"{len(differ) - _SHOWN} more"] if len(differ) > _SHOWN else []
    return ", ".join(parts + differ[:_SHOWN] + more)


def _members(x: str, y: str) -> str:
    """``12 -> 13, added h.12``: a rule's groups, as the ids that came and went."""
    a, b = _types(x), _types(y)
    added, removed = [i for i in b if i not in set(a)], [i for i in a if i not in set(b)]
    parts = [f"{len(a)} -> {len(b)}"] if len(a) != len(b) else []
    parts += [f"added {', '.join(added)}"] if added else []
    parts += [f"removed {', '.join(removed)}"] if removed else []
    return "; ".join(parts)


def _types(text: str) -> list[str]:
    """The types of an ``inputs`` / ``outputs`` line (``2: float:r2, int64:r1``)."""
    _, _, types = text.partition(": ")
    return types.split(", ") if types else []


def _why(title: str, new: Lock) -> tuple[str, ...]:
    """For a function ``new``'s lowering kept apart from its class's first function, why."""
    return tuple(f"why distinct: {v.reason()}" for v in new.variants
                 if f"function {label(v.function)}" == title)


def render(changes: tuple[Change, ...], old_name: str, new_name: str) -> str:
    """The diff as people read it (one block per class, section)."""
    lines = [f"structure of {new_name} differs from {old_name} "
             f"({len(changes)} change{'s' if len(changes) != 1 else ''}):"]
    for change in changes:
        lines.append(f"  {change.title}: {change.what}")
        lines.extend(f"      {detail}" for detail in change.details)
    return "\n".join(lines)
