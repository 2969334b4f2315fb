"""Our spans count code points; LSP counts UTF-16 code units unless the client agreed otherwise."""

from __future__ import annotations

from lsprotocol import types

from kernel_lsp.model import Span


class Positions:
    """Converts between code-point columns and the client's position encoding for one text."""

    def __init__(self, text: str, encoding: str = types.PositionEncodingKind.Utf16) -> None:
        self.lines = text.split("\n")
        self.encoding = encoding

    def _units(self, line: int, col: int) -> int:
        if self.encoding != types.PositionEncodingKind.Utf16 or line >= len(self.lines):
            return col
        prefix = self.lines[line][:col]
        return col + sum(1 for ch in prefix if ord(ch) > 0xFFFF)

    def _points(self, line: int, units: int) -> int:
        if self.encoding != types.PositionEncodingKind.Utf16 or line >= len(self.lines):
            return units
        count = 0
        for index, ch in enumerate(self.lines[line]):
            count += 2 if ord(ch) > 0xFFFF else 1
            if count > units:
                return index
        return len(self.lines[line])

    def position(self, line: int, col: int) -> types.Position:
        line = max(0, line)
        return types.Position(line=line, character=max(0, self._units(line, col)))

    def range(self, span: Span) -> types.Range:
        return types.Range(
            start=self.position(span.start_line, span.start_col),
            end=self.position(span.end_line, span.end_col),
        )

    def point(self, position: types.Position) -> tuple[int, int]:
        """(line, code-point column) of an LSP position."""
        return position.line, self._points(position.line, position.character)

    def line_span(self, line: int) -> Span:
        """The line from its first non-blank character to its end: where a column-less message goes."""
        text = self.lines[line] if 0 <= line < len(self.lines) else ""
        start = len(text) - len(text.lstrip())
        return Span(line, start, line, max(len(text), start))
