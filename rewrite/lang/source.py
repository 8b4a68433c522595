"""Rules source text and positions in it."""

from __future__ import annotations

import codecs

from attrs import field, frozen

from rewrite.errors import Diagnostic, RuleError


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
    """A position in a rules source: 1-based line and column where something starts and,
    when the parser knows it, where it ends (``end_column`` just past its last character, as
    Lark counts)."""

    source: Source = field(repr=False, eq=False)
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    @property
    def location(self) -> str:
        return f"{self.source.name}:{self.line}:{self.column}"

    @property
    def source_line(self) -> str | None:
        return self.source.line(self.line)

    @property
    def text(self) -> str:
        """The source text from the start to the end (to the end of the start line when the
        end is not known)."""
        last = self.line if self.end_line is None else self.end_line
        lines = self.source.text.split("\n")[self.line - 1:last] or [""]
        if self.end_column is not None:
            lines[-1] = lines[-1][:self.end_column - 1]
        lines[0] = lines[0][self.column - 1:]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.location


def decode(data: bytes, name: str) -> str:
    """The UTF-8 text of a rules file (a leading byte-order mark dropped).

    Bytes that are not UTF-8 raise :class:`RuleError` at the first undecodable byte, with
    its line as far as it decodes, like any other diagnostic.
    """
    data = data.removeprefix(codecs.BOM_UTF8)  # a BOM (Windows editors) is not text
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[: e.start].decode("utf-8")
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        span = Span(Source(before, name), line, column)
        message = f"not UTF-8 text: {e.reason} 0x{data[e.start]:02x}"
        raise RuleError([Diagnostic("error", message, span,
                                    "save the file as UTF-8")]) from None
