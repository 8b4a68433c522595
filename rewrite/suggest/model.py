"""A suggested rules file as data, and its text.

A :class:`Suggestion` lists the lines of a starter rules file, each with what it gives on the
model it was made for; :func:`render` writes it as a rules file with those counts as comments.
"""

from __future__ import annotations

import re

from attrs import frozen

_PLAIN = re.compile(r"[A-Za-z0-9_.\-<>:]+")
"""What the rules grammar accepts as an unquoted pattern (without globs, ranges or ``@``)."""


@frozen
class Line:
    """One rule of the suggestion."""

    kind: str
    """``group`` or ``flat``."""
    selector: str
    """``class GPT2Block``, ``path wte``."""
    comment: str
    """What the rule gives on the model: ``2 calls, 1 distinct body``."""
    name: str | None = None
    """An ``as`` template, or None for the default (the class name)."""

    @property
    def text(self) -> str:
        rule = f"{self.kind} {self.selector}"
        return rule + (f' as "{self.name}"' if self.name else "")


@frozen
class Section:
    """A titled run of lines."""

    title: str
    lines: tuple[Line, ...]


@frozen
class Suggestion:
    """A starter rules file for one model."""

    model: str
    """What the rules were made for (as given)."""
    summary: str
    """One line about the model: ``GPT2Model: 162 nodes, 28 module calls``."""
    sections: tuple[Section, ...]
    warnings: tuple = ()
    """Diagnostics about the model (no module structure)."""


def pattern(text: str) -> str:
    """``text`` as a pattern that matches it literally (quoted when the grammar needs it)."""
    if _PLAIN.fullmatch(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def render(suggestion: Suggestion, rules: str | None = None) -> str:
    """The rules file (``rules``: where it goes, for the header's ``explain`` command): a
    header, then each section's lines with their counts as comments."""
    out = [f"# Starter rules for {suggestion.model} ({suggestion.summary}), by rewrite suggest.",
           "# Counts are for this model; distinct bodies are estimated from the exported graph",
           "# (same ops, constants and input shapes). See what the rules group with:",
           f"#   rewrite explain {rules or 'RULES'} {suggestion.model}"]
    sections = [s for s in suggestion.sections if s.lines]
    if not sections:
        out += ["", "# no repeated blocks or weighted top-level modules found: nothing to group"]
    for section in sections:
        out += ["", f"# {section.title}"]
        width = max(len(line.text) for line in section.lines)
        out += [f"{line.text.ljust(width)}  # {line.comment}" for line in section.lines]
    return "\n".join(out) + "\n"
