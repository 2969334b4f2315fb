"""Python string literals read from a tree-sitter-python tree: their value, and where each
character of the value sits in the file (so positions in embedded CUDA map back exactly).

Handles prefixes r/u/b/f (f-strings only without replacement fields), every escape of
str literals, line continuations, and implicit concatenation of adjacent literals.
"""

from __future__ import annotations

import unicodedata

from kernel_lsp.source.text import LineIndex

_SIMPLE_ESCAPES = {
    "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f",
    "n": "\n", "r": "\r", "t": "\t", "v": "\v",
}
_HEX_DIGITS = "0123456789abcdefABCDEF"


def decode_content(content: str, prefix: str) -> tuple[str, list[int]]:
    """Decode the text between the quotes. Returns (value, offsets): offsets[i] is the index
    in `content` where value[i] comes from; offsets[len(value)] == len(content)."""
    p = prefix.lower()
    raw = "r" in p
    fstring = "f" in p
    if "\r" not in content and (raw or "\\" not in content) and not (fstring and ("{" in content or "}" in content)):
        return content, list(range(len(content) + 1))  # nothing to decode: the common case
    out: list[str] = []
    offs: list[int] = []
    i, n = 0, len(content)
    while i < n:
        c = content[i]
        if c == "\r":  # Python reads sources with universal newlines
            out.append("\n")
            offs.append(i)
            i += 2 if content.startswith("\r\n", i) else 1
            continue
        if fstring and c in "{}" and content.startswith(c * 2, i):
            out.append(c)
            offs.append(i)
            i += 2
            continue
        if c != "\\" or raw:
            out.append(c)
            offs.append(i)
            if raw and c == "\\" and i + 1 < n:
                # In a raw string a backslash still keeps the next character (a quote) literal.
                out.append(content[i + 1])
                offs.append(i + 1)
                i += 2
            else:
                i += 1
            continue
        # An escape sequence in a non-raw literal.
        if i + 1 >= n:
            out.append(c)
            offs.append(i)
            i += 1
            continue
        e = content[i + 1]
        if e == "\n":
            i += 2  # line continuation: no character
            continue
        if e == "\r":
            i += 3 if content.startswith("\r\n", i + 1) else 2
            continue
        if e in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[e])
            offs.append(i)
            i += 2
            continue
        if e in "01234567":
            j = i + 1
            while j < n and j < i + 4 and content[j] in "01234567":
                j += 1
            out.append(chr(int(content[i + 1:j], 8)))
            offs.append(i)
            i = j
            continue
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width is not None and not ("b" in p and e in "uU"):
            digits = content[i + 2:i + 2 + width]
            if len(digits) == width and all(d in _HEX_DIGITS for d in digits):
                out.append(chr(int(digits, 16)))
                offs.append(i)
                i += 2 + width
                continue
        if e == "N" and "b" not in p and content.startswith("{", i + 2):
            close = content.find("}", i + 3)
            if close != -1:
                try:
                    out.append(unicodedata.lookup(content[i + 3:close]))
                    offs.append(i)
                    i = close + 1
                    continue
                except KeyError:
                    pass
        # An unknown escape keeps its backslash.
        out.append(c)
        offs.append(i)
        i += 1
    offs.append(n)
    return "".join(out), offs


def literal_value(node, lines: LineIndex) -> tuple[str, list[int]] | None:
    """Value and file offsets of a `string` or `concatenated_string` node (or one in
    parentheses); None when it is not a plain literal (an f-string with fields, bytes)."""
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    if node.type == "concatenated_string":
        value: list[str] = []
        offsets: list[int] = []
        for part in node.named_children:
            if part.type != "string":
                continue
            got = literal_value(part, lines)
            if got is None:
                return None
            value.append(got[0])
            offsets.extend(got[1][:-1])
            end = got[1][-1]
        if not value:
            return None
        offsets.append(end)
        return "".join(value), offsets
    if node.type != "string":
        return None
    start = end = None
    prefix = ""
    for child in node.children:
        if child.type == "string_start":
            prefix = child.text.decode("utf-8", "replace").rstrip("'\"")
            start = child
        elif child.type == "string_end":
            end = child
        elif child.type == "interpolation":
            return None
    if start is None or end is None or "b" in prefix.lower():
        return None
    content_start = lines.node_offset(start)[1]
    content_end = lines.node_offset(end)[0]
    content = lines.text[content_start:content_end]
    value, rel = decode_content(content, prefix)
    return value, [content_start + r for r in rel]


def content_bounds(node, lines: LineIndex) -> tuple[int, int] | None:
    """File offsets (start, end) of the content of a string or concatenated string."""
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    strings = [node] if node.type == "string" else [c for c in node.named_children if c.type == "string"]
    if not strings:
        return None
    first = [c for c in strings[0].children if c.type == "string_start"]
    last = [c for c in strings[-1].children if c.type == "string_end"]
    if not first or not last:
        return None
    return lines.node_offset(first[0])[1], lines.node_offset(last[0])[0]
