"""Two locks compared: sections added, removed, changed (key by key, histograms item by
item), and, for a class the new side lowered to more than one function, the first
difference that kept each new function apart (``backends/onnx/distinct.py``, worded by
``cli/variants.py``: the same line ``explain --onnx`` prints)."""

from __future__ import annotations

from attrs import frozen

from rewrite.backends.onnx import label
from rewrite.structure._lock import HISTOGRAMS, Lock, Section, parse_histogram


@frozen
class Change:
    """One section that differs: ``added``, ``removed`` or ``changed``, and how."""

    title: str
    """``main``, ``function pkg.x::Block``, ``rule group class *Block``."""
    what: str
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
        elif a.fields != b.fields:
            changes.append(Change(title, "changed", _fields(a, b)))
    return tuple(changes)


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
        elif key == "digest" and old.get("ops") == new.get("ops"):
            out.append(f"digest: {x} -> {y} (the same ops: how they connect, an attribute "
                       "or a constant changed)")
        else:
            out.append(f"{key}: {x or '(none)'} -> {y or '(none)'}")
    return tuple(out)


def _why(title: str, new: Lock) -> tuple[str, ...]:
    """For a function ``new``'s lowering kept apart from its class's first function, why."""
    from rewrite.cli.variants import reason

    return tuple(f"why distinct: {reason(v)}" for v in new.variants
                 if f"function {label(v.function)}" == title)


def render(changes: tuple[Change, ...], old_name: str, new_name: str) -> str:
    """The diff as people read it (one block per section)."""
    lines = [f"structure of {new_name} differs from {old_name} "
             f"({len(changes)} section{'s' if len(changes) != 1 else ''}):"]
    for change in changes:
        lines.append(f"  {change.title}: {change.what}")
        lines.extend(f"      {detail}" for detail in change.details)
    return "\n".join(lines)
