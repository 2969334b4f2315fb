"""Text helpers: reading files safely, and converting tree-sitter byte points to code points.

tree-sitter works on UTF-8 bytes and reports (row, byte column); every Span in kernel-lsp
is in code points. `LineIndex` does the conversion, fast for ASCII lines (the common case).
"""

from __future__ import annotations

import bisect
import os

from kernel_lsp.model import Span

# Lone surrogates (from a caller's surrogateescape decoding) must not make encoding raise.
ENCODING_ERRORS = "surrogatepass"


def span_dict(span: Span) -> dict[str, int]:
    """Span.to_dict without dataclasses.asdict's deep copy (hot in big files)."""
    return {"start_line": span.start_line, "start_col": span.start_col,
            "end_line": span.end_line, "end_col": span.end_col}


class SourceError(Exception):
    """A file cannot be read as source text (missing, unreadable, or binary)."""


def read_text(path: str | os.PathLike[str]) -> str:
    """Read a source file as UTF-8, replacing undecodable bytes; refuse binary files."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SourceError(f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from exc
    if b"\0" in data:
        raise SourceError(f"{os.fspath(path)} looks binary (it contains NUL bytes), not source text")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 BOM is not part of the code
    return data.decode("utf-8", errors="replace")


def encode(text: str) -> bytes:
    return text.encode("utf-8", ENCODING_ERRORS)


class LineIndex:
    """Line starts of a text, and conversions between byte points, offsets and (line, col).

    Lines split on "\\n" only, as tree-sitter counts rows; a "\\r" stays on its line.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        starts = [0]
        pos = text.find("\n")
        while pos != -1:
            starts.append(pos + 1)
            pos = text.find("\n", pos + 1)
        self.starts = starts
        self.ascii = text.isascii()  # then byte columns are code-point columns everywhere
        self._encoded: dict[int, bytes] = {}

    @property
    def line_count(self) -> int:
        return len(self.starts)

    def line(self, row: int) -> str:
        start = self.starts[row]
        end = self.starts[row + 1] - 1 if row + 1 < len(self.starts) else len(self.text)
        return self.text[start:end]

    def col(self, row: int, byte_col: int) -> int:
        """The code-point column of a tree-sitter (row, byte column) point."""
        if self.ascii or row >= len(self.starts) or byte_col == 0:
            return byte_col
        line = self.line(row)
        if line.isascii():
            return byte_col
        raw = self._encoded.get(row)
        if raw is None:
            raw = self._encoded[row] = encode(line)
        head = raw[:byte_col]
        try:
            return len(head.decode("utf-8", ENCODING_ERRORS))
        except UnicodeDecodeError:  # a column inside a broken sequence: count whole chars
            return len(head.decode("utf-8", "ignore"))

    def byte_col(self, row: int, col: int) -> int:
        """The UTF-8 byte column of a code-point column on `row`."""
        if self.ascii:
            return col
        line = self.line(row) if row < len(self.starts) else ""
        if line.isascii():
            return col
        return len(encode(line[:col]))

    def span(self, node) -> Span:  # node: tree_sitter.Node
        (sr, sc), (er, ec) = node.start_point, node.end_point
        if self.ascii:
            return Span(sr, sc, er, ec)
        return Span(sr, self.col(sr, sc), er, self.col(er, ec))

    def offset(self, line: int, col: int) -> int:
        """Code-point offset in the text of (line, col), clamped to the text."""
        if line < 0:
            return 0
        if line >= len(self.starts):
            return len(self.text)
        start = self.starts[line]
        end = self.starts[line + 1] - 1 if line + 1 < len(self.starts) else len(self.text)
        return min(start + max(col, 0), end)

    def position(self, offset: int) -> tuple[int, int]:
        """(line, col) of a code-point offset."""
        offset = max(0, min(offset, len(self.text)))
        row = bisect.bisect_right(self.starts, offset) - 1
        return row, offset - self.starts[row]

    def node_offset(self, node) -> tuple[int, int]:
        """Code-point offsets (start, end) of a node."""
        (sr, sc), (er, ec) = node.start_point, node.end_point
        return self.starts[sr] + self.col(sr, sc), self.starts[er] + self.col(er, ec)
