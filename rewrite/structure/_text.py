"""The lock file: a comment header, then ``[kind name]`` sections of ``key = value`` lines.

::

    # rewrite structure lock, format 1 ...
    [main]
    ops = Add 1, Gather 2

    [function pkg.transformers::GPT2Block]
    call_sites = 12
    ...

    [rule group class *GPT2Block]
    groups = 12: h.0, h.1, ...

One line per fact, sections in a fixed order (main, functions by name, rules by text), a
blank line between sections, ``\\n`` line ends, UTF-8: a change to the structure changes the
lines it is about and no other. ``#`` lines are comments; ``rules = none`` in the header
marks a lock of an ``.onnx`` file read as it is (no rule sections).
"""

from __future__ import annotations

from pathlib import Path

from rewrite.errors import InputError
from rewrite.files.outputs import atomic_path
from rewrite.structure._lock import HISTOGRAMS, KINDS, Lock, Section, parse_histogram

FORMAT = "1"
HEADER = (
    "# rewrite structure lock: `rewrite verify` compares a model with it, `--update` rewrites "
    "it.\n# Review a change to it like code. What each line means: docs/structure.md, \"The "
    "lock file\".\n"
)


def dumps(lock: Lock) -> str:
    """The file's text."""
    lines = [HEADER.rstrip("\n"), f"format = {FORMAT}"]
    if not lock.has_rules:
        lines.append("rules = none")
    for section in lock.sections:
        lines.extend(["", f"[{section.title}]"])
        lines.extend(f"{key} = {value}" for key, value in section.fields)
    return "\n".join(lines) + "\n"


def write(path: str | Path, lock: Lock) -> None:
    """Write the file whole or not at all, with ``\n`` line ends on every platform."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(dumps(lock).encode("utf-8"))


class _Reader:
    def __init__(self, name: str) -> None:
        self.name = name
        self.top: dict[str, str] = {}
        self.sections: list[Section] = []
        self.current: tuple[str, str, list] | None = None

    def fail(self, number: int, message: str) -> InputError:
        return InputError(f"{self.name}:{number}: malformed lock: {message}")

    def line(self, number: int, line: str) -> None:
        if line.startswith("["):
            if not line.endswith("]"):
                raise self.fail(number, "a section header ends with ']'")
            kind, _, name = line[1:-1].partition(" ")
            if kind not in KINDS or (kind != "main") != bool(name):
                raise self.fail(number, f"unknown section [{line[1:-1]}]")
            self.close()
            self.current = (kind, name, [])
            return
        key, eq, value = line.partition(" = ")
        if not eq or not key or " " in key:
            raise self.fail(number, f"expected 'key = value', got {line!r}")
        if key in HISTOGRAMS:
            try:
                parse_histogram(value)
            except ValueError as e:
                raise self.fail(number, f"{key}: {e}") from None
        if self.current is None:
            self.top[key] = value
        else:
            self.current[2].append((key, value))

    def close(self) -> None:
        if self.current is not None:
            kind, name, fields = self.current
            self.sections.append(Section(kind, name, tuple(fields)))


def loads(text: str, name: str) -> Lock:
    """The :class:`Lock` a file's ``text`` holds; :class:`InputError` with ``name:line``
    when it is not a lock."""
    reader = _Reader(name)
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r").strip()
        if line and not line.startswith("#"):
            reader.line(number, line)
    reader.close()
    if reader.top.get("format") != FORMAT:
        raise InputError(f"{name}:1: malformed lock: no 'format = {FORMAT}' line (is it a "
                         "lock written by `rewrite lock`?)")
    titles = [s.title for s in reader.sections]
    if len(set(titles)) != len(titles):
        twice = next(t for t in titles if titles.count(t) > 1)
        raise InputError(f"{name}: malformed lock: section [{twice}] appears twice")
    return Lock(tuple(reader.sections), has_rules=reader.top.get("rules") != "none")
