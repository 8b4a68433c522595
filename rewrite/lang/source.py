"""Rules source text and positions in it."""

from __future__ import annotations

from attrs import field, frozen


@frozen
class Source:
    """A rules text and the name it is reported under (a path, or ``<string>``)."""

    text: str = field(repr=False)
    name: str = "<string>"

    def line(self, number: int) -> str | None:
        """Line ``number`` (1-based) without its newline, or None past the end.

        Lines end at a newline only, as the parser counts them (``str.splitlines`` would also
        split at a lone carriage return, a form feed and other separators: the wrong line).
        """
        lines = self.text.split("\n")
        if 1 <= number <= len(lines):
            return lines[number - 1].removesuffix("\r")
        return None


@frozen
class Span:
    """A position in a rules source: 1-based line and column."""

    source: Source = field(repr=False, eq=False)
    line: int
    column: int

    @property
    def location(self) -> str:
        return f"{self.source.name}:{self.line}:{self.column}"

    @property
    def source_line(self) -> str | None:
        return self.source.line(self.line)

    def __str__(self) -> str:
        return self.location
