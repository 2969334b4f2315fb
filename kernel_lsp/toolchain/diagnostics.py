"""Turning nvcc's, cudafe's, gcc's, ptxas' and the linker's messages into Diagnostics
placed on the compiled document's lines.

Positions here are 0-based lines and columns of the *source text given to nvcc*;
compile.py maps them through `line_map` for sources embedded in another document.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from kernel_lsp.intexpr import LazyNames, eval_int
from kernel_lsp.model import Diagnostic, Span

# cudafe / nvcc front end: `file(12): error #20-D: identifier "x" is undefined`
_CUDAFE = re.compile(
    r"^(?P<file>\S.*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|fatal error|error|warning|remark)"
    r"(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$")
# gcc / clang host compiler: `file:12:5: error: msg`
_GCC = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|warning|note):"
    r" (?P<msg>.*)$")
_GCC_INCLUDED = re.compile(r"^(?:In file included|\s+) from (?P<file>[^:]+):(?P<line>\d+)[:,]")
_GCC_ECHO = re.compile(r"^\s*\d*\s*\|")
_TOOL = re.compile(r"^(?P<tool>nvcc|ptxas|nvlink|fatbinary|cicc|cudafe\+\+)\s+(?P<sev>fatal|error|warning)\s*: (?P<msg>.*)$")
_LD = re.compile(r"^(?:/\S*/)?(?:ld|collect2)(?:\.\w+)?: (?P<msg>.*)$")
_CARET = re.compile(r"^\s*\^\s*$")
_NOISE = re.compile(
    r"^(?:\d+ errors? detected in the compilation of|Remark: The warnings can be suppressed"
    r"|compilation terminated\.|Error limit reached\.|# --error 0x|In function |.*: In function )")
_ENTRY = re.compile(r"(?:Entry function|function|reference to) '(?P<name>[\w$.]+)'")
_LD_REF = re.compile(r"^\S+:\(\.[\w.]+\+0x[0-9a-fA-F]+\): (?P<msg>.*)$")
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](?P<name>[^>"]+)[>"]')
_WORD = re.compile(r'"[^"\n]*"|<[^<>\n]*>(?=\s*$)|[A-Za-z_]\w*|\d+|\S')


@dataclass
class RawMessage:
    """One compiler message before placement: 1-based line/column in `file`, or no file."""

    severity: str
    message: str
    file: str | None = None
    line: int | None = None
    col: int | None = None          # 1-based, when the tool gave one
    code: str | None = None
    echo: str | None = None         # cudafe's copy of the source line
    caret: int | None = None        # 0-based caret position in `echo`
    notes: list[str] = field(default_factory=list)
    include_chain: list[tuple[str, int]] = field(default_factory=list)  # gcc's "included from"
    function: str | None = None     # ptxas: the (mangled) function the message names
    tool: str = "nvcc"


def _severity(word: str) -> str:
    word = word.lower()
    if "error" in word or word == "fatal":
        return "error"
    if word == "warning":
        return "warning"
    return "information"


def parse_messages(log: str) -> list[RawMessage]:
    """Every error/warning in an nvcc log, with continuation lines folded in."""
    out: list[RawMessage] = []
    current: RawMessage | None = None
    body: list[str] = []
    chain: list[tuple[str, int]] = []
    ld_lines: list[str] = []

    def finish() -> None:
        nonlocal current, body
        if current is not None:
            for text in body:
                stripped = text.strip()
                if stripped:
                    current.notes.append(stripped)
            out.append(current)
        current, body = None, []

    for raw in log.splitlines():
        line = raw.rstrip("\r\n")
        m = _CUDAFE.match(line)
        if m:
            finish()
            current = RawMessage(_severity(m["sev"]), m["msg"].strip(), m["file"], int(m["line"]),
                                 code=m["code"], tool="nvcc")
            continue
        m = _GCC_INCLUDED.match(line)
        if m:
            finish()
            chain.append((m["file"], int(m["line"])))
            continue
        m = _GCC.match(line)
        if m:
            if m["sev"] == "note" and out and current is None:
                out[-1].notes.append(f"note: {m['msg'].strip()}")
                continue
            if m["sev"] == "note" and current is not None:
                body.append(f"note: {m['msg'].strip()}")
                continue
            finish()
            current = RawMessage(_severity(m["sev"]), m["msg"].strip(), m["file"], int(m["line"]),
                                 int(m["col"]) if m["col"] else None, tool="host compiler",
                                 include_chain=chain)
            chain = []
            continue
        m = _TOOL.match(line)
        if m:
            finish()
            msg = m["msg"].strip()
            fn = _ENTRY.search(msg)
            out.append(RawMessage(_severity(m["sev"]), msg, function=fn["name"] if fn else None,
                                  tool=m["tool"]))
            continue
        m = _LD.match(line) or _LD_REF.match(line)
        if m:
            finish()
            if "ld returned" not in m["msg"] and not re.search(r"in function `[^']*':$", m["msg"]):
                ld_lines.append(m["msg"].strip())
            continue
        if line.startswith("ptxas info") or not line.strip():
            finish()
            continue
        if _NOISE.match(line):
            finish()
            continue
        if current is None:
            continue
        if _GCC_ECHO.match(line):
            continue  # gcc's own source echo; we have the column already
        if _CARET.match(line) and body:
            current.echo = body.pop()
            current.caret = line.index("^")
            continue
        body.append(line)
    finish()
    if ld_lines:
        out.append(RawMessage("error", "link failed: " + "; ".join(dict.fromkeys(ld_lines)), tool="ld"))
    return out


def _line_span(lines: list[str], line: int) -> Span:
    text = lines[line] if 0 <= line < len(lines) else ""
    start = len(text) - len(text.lstrip())
    return Span(line, start, line, max(len(text.rstrip()), start))


def _token_span(lines: list[str], line: int, col: int) -> Span:
    text = lines[line] if 0 <= line < len(lines) else ""
    col = max(0, min(col, len(text)))
    m = _WORD.match(text, col)
    end = m.end() if m else min(col + 1, len(text))
    if end <= col:
        return _line_span(lines, line)
    return Span(line, col, line, end)


def _caret_column(src: str, echo: str, caret: int) -> int | None:
    """Where cudafe's caret points in the real line: its echo is indented and may show
    macros expanded (`__global__` as `__attribute__((global))`)."""
    # cudafe indents the echo by two spaces.
    indent = 2 if echo.startswith("  ") else 0
    shown, col = echo[indent:], caret - indent
    if shown == src and 0 <= col <= len(src):
        return col
    if col < 0 or col >= len(shown):
        return None
    m = _WORD.match(shown, col)
    token = m.group(0) if m else shown[col]
    # Expansions happen to the left more often than not: align on the line's end first.
    guess = len(src) - (len(shown) - col)
    if 0 <= guess and src.startswith(token, guess):
        return guess
    hits = [k.start() for k in re.finditer(re.escape(token), src)]
    if not hits:
        return None
    return min(hits, key=lambda k: abs(k - guess))


def find_kernel_line(source: str, name: str) -> Span | None:
    """The identifier span of the __global__ function `name` (bare name) in `source`."""
    pattern = re.compile(r"\b" + re.escape(name) + r"\b\s*(?:<[^;{()]*>\s*)?\(")
    for m in pattern.finditer(source):
        start = max(source.rfind(";", 0, m.start()), source.rfind("}", 0, m.start()),
                    source.rfind("{", 0, m.start()))
        head = source[start + 1:m.start()]
        if "__global__" in head or "global" in head and "__attribute__" in head:
            line = source.count("\n", 0, m.start())
            col = m.start() - (source.rfind("\n", 0, m.start()) + 1)
            return Span(line, col, line, col + len(name))
    return None


_GLOBAL_HEAD = re.compile(
    r"__global__(?P<head>(?:[^;{}()]|\([^()]*(?:\([^()]*\)[^()]*)*\))*?)"
    r"\b(?!__launch_bounds__\b)(?P<name>[A-Za-z_]\w*)\s*(?:<[^;{()]*>\s*)?\(")
_BOUNDS = re.compile(r"__launch_bounds__\s*\(\s*([^,)]+)")


def launch_bounds_map(source: str) -> dict[str, int | None]:
    """Every __global__ kernel's first __launch_bounds__ argument, in one pass over `source`
    (a per-kernel scan is quadratic: seconds on a file with hundreds of kernels)."""
    found: dict[str, int | None] = {}
    values = _named_values(source) if "__launch_bounds__" in source else {}
    for m in _GLOBAL_HEAD.finditer(source):
        name = m.group("name")
        if name in found:
            continue
        b = _BOUNDS.search(m.group("head"))
        found[name] = _constant(source, b.group(1).strip(), values=values) if b else None
    return found


def launch_bounds(source: str, name: str) -> int | None:
    """The first __launch_bounds__ argument of kernel `name`, resolving a simple #define."""
    return launch_bounds_map(source).get(name)


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+([^\n]*?)[ \t]*(?://.*)?$", re.M)
_CONSTEXPR = re.compile(r"constexpr\s+(?:unsigned\s+)?int\s+([A-Za-z_]\w*)\s*=\s*([^;]+);")


def _named_values(source: str) -> dict[str, str]:
    """`#define NAME value` and `constexpr int NAME = value;` texts, the first of each name."""
    values: dict[str, str] = {}
    for pattern in (_DEFINE, _CONSTEXPR):
        for m in pattern.finditer(source):
            values.setdefault(m.group(1), m.group(2))
    return values


def _constant(source: str, expr: str, values: dict[str, str] | None = None) -> int | None:
    """Evaluate a launch-bounds expression with the file's `#define NAME value` and
    `constexpr int NAME = value;` constants (kernel_lsp.intexpr: the one C evaluator)."""
    return eval_int(expr, LazyNames(values if values is not None else _named_values(source)))


@dataclass
class Placement:
    """What is needed to put messages on the compiled document's lines."""

    source: str
    source_file: str          # the file name nvcc saw (in the temp dir)
    temp_dir: str
    user_dir: str | None      # the document's own directory (its headers are "ours")
    display_name: str         # the document's base name, for messages
    demangled: dict[str, str] = field(default_factory=dict)

    def is_source(self, file: str) -> bool:
        path = file if os.path.isabs(file) else os.path.join(self.temp_dir, file)
        return os.path.normpath(path) == os.path.normpath(os.path.join(self.temp_dir, self.source_file))

    def shown(self, file: str) -> str:
        path = os.path.normpath(file if os.path.isabs(file) else os.path.join(self.temp_dir, file))
        if self.user_dir and path.startswith(self.user_dir + os.sep):
            return os.path.relpath(path, self.user_dir)
        if path.startswith(self.temp_dir + os.sep):
            return os.path.relpath(path, self.temp_dir)
        return file

    def is_user_header(self, file: str) -> bool:
        path = os.path.normpath(file if os.path.isabs(file) else os.path.join(self.temp_dir, file))
        return bool(self.user_dir) and path.startswith(self.user_dir + os.sep)

    def include_line(self, msg: RawMessage, lines: list[str]) -> int | None:
        """The line of our #include that brings in msg.file."""
        for file, line in msg.include_chain:
            if self.is_source(file):
                return line - 1
        target = os.path.normpath(msg.file or "")
        for i, text in enumerate(lines):
            m = _INCLUDE.match(text)
            if m and (target == os.path.normpath(m["name"])
                      or target.endswith(os.sep + os.path.normpath(m["name"]))):
                return i
        # "detected during instantiation ... at line N of <our file>"
        for note in msg.notes:
            m = re.search(r"at line (\d+) of (\S+)", note)
            if m and self.is_source(m.group(2).strip('"')):
                return int(m.group(1)) - 1
        return None

    def _clean(self, text: str) -> str:
        text = text.replace(self.temp_dir + os.sep, "")
        if self.source_file != self.display_name:
            text = text.replace(self.source_file, self.display_name)
        return text

    def place(self, messages: list[RawMessage]) -> list[Diagnostic]:
        lines = self.source.split("\n")
        out: list[Diagnostic] = []
        seen: set[tuple] = set()
        for msg in messages:
            text = msg.message
            notes = [n for n in msg.notes]
            if msg.file is not None and msg.line is not None and self.is_source(msg.file):
                line = msg.line - 1
                if msg.col is not None:
                    span = _token_span(lines, line, msg.col - 1)
                elif msg.echo is not None and msg.caret is not None and 0 <= line < len(lines):
                    col = _caret_column(lines[line], msg.echo, msg.caret)
                    span = _token_span(lines, line, col) if col is not None else _line_span(lines, line)
                else:
                    span = _line_span(lines, line)
            elif msg.file is not None and msg.line is not None:
                if msg.severity != "error" and not self.is_user_header(msg.file):
                    continue  # warnings from system/torch headers are not the user's to fix
                where = f"{self.shown(msg.file)}:{msg.line}" + (f":{msg.col}" if msg.col else "")
                text = f"in {where}: {text}"
                include = self.include_line(msg, lines)
                span = _line_span(lines, include) if include is not None else _line_span(lines, 0)
            elif msg.function:
                name = self.demangled.get(msg.function, msg.function)
                from kernel_lsp.toolchain.demangle import function_name

                bare = function_name(name)
                entry = "Entry function" in text
                text = text.replace(msg.function, bare if entry else name)
                if "too much shared data" in text:
                    text += (" (static __shared__ arrays are limited to 48 KB per block; use dynamic"
                             " shared memory with cudaFuncSetAttribute for more)")
                span = (find_kernel_line(self.source, bare) if entry else None) or _line_span(lines, 0)
                text = f"{msg.tool}: {text}"
            else:
                span = Span(0, 0, 0, 0) if not lines else _line_span(lines, 0)
                text = f"{msg.tool}: {text}" if msg.tool not in ("nvcc", "host compiler") else text
            if notes:
                text = text + "\n" + "\n".join(notes)
            text = self._clean(text)
            key = (span.start_line, span.start_col, msg.severity, text)
            if key in seen:
                continue
            seen.add(key)
            out.append(Diagnostic(span=span, severity=msg.severity, message=text,  # type: ignore[arg-type]
                                  source="nvcc", code=msg.code))
        return out
