"""The lock as data: sections of ``key = value`` lines, in the order the file lists them.

A :class:`Lock` is what a lock file says and what a model's structure is (one
representation: :mod:`_build` makes one from a model, :mod:`_text` reads and writes one,
:mod:`_compare` compares two). Values are the texts the file holds; histograms
(``Add 2, Relu 1``) are compared item by item.
"""

from __future__ import annotations

from attrs import field, frozen

KINDS = ("main", "function", "rule")
"""Section kinds, in file order."""

HISTOGRAMS = ("ops", "calls", "functions")
"""Keys whose values are ``name count`` items joined by ``, ``."""


@frozen
class Section:
    """``[kind name]`` and its lines."""

    kind: str
    name: str
    fields: tuple[tuple[str, str], ...]

    @property
    def title(self) -> str:
        return f"{self.kind} {self.name}" if self.name else self.kind

    def get(self, key: str) -> str | None:
        return dict(self.fields).get(key)


@frozen
class Lock:
    """A model's structure: the main graph, every function, every rule that made groups."""

    sections: tuple[Section, ...]
    has_rules: bool = True
    """False for an ``.onnx`` read as it is: it records rule positions, not rule texts, so
    its ``rule`` sections are unknown (not compared)."""
    variants: tuple = field(default=(), eq=False)
    """The lowering's why-distinct records (``backends.onnx.Variant``), when a lowering made
    it: the diff explains a class that got another function with them."""

    def by_title(self) -> dict[str, Section]:
        return {s.title: s for s in self.sections}


def histogram_text(counts: dict[str, int]) -> str:
    """``Add 2, Relu 1`` (sorted by name), ``-`` when empty."""
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items()) if n) or "-"


def parse_histogram(text: str) -> dict[str, int]:
    """The inverse of :func:`histogram_text` (``ValueError`` on a malformed item)."""
    if text == "-":
        return {}
    found: dict[str, int] = {}
    for item in text.split(", "):
        name, _, count = item.rpartition(" ")
        if not name or not count.isdigit():
            raise ValueError(f"not 'name count': {item!r}")
        found[name] = int(count)
    return found
