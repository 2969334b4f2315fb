"""Evaluate a C integer constant expression (macro values, constexpr initializers).

Only literals, known names and integer operators; anything else (casts, sizeof, calls,
floats) gives None. Used so the tuner sees `#define BLOCK (2 * WARP)` as 64. The one such
evaluator in kernel-lsp (source reader, ptxas launch bounds, tuner): standard library only, so
the Worker side may import it, and no `eval`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping

_INT_LITERAL = re.compile(r"\b(0[xX][0-9a-fA-F]+|0[bB][01]+|\d+)(?:[uU](?:ll|LL|l|L)?|(?:ll|LL|l|L)[uU]?)?\b")
_COMMENT = re.compile(r"//.*|/\*.*?\*/", re.DOTALL)


def strip_comments(text: str) -> str:
    return _COMMENT.sub(" ", text).strip()


def _literal(match: re.Match[str]) -> str:
    digits = match.group(1)
    if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        return "0o" + digits[1:]  # C octal
    return digits


def eval_int(expr: str, names: Mapping[str, int] | None = None) -> int | None:
    """The integer value of a C expression, or None when it is not a plain integer expression."""
    text = strip_comments(expr)
    if not text or len(text) > 200 or "." in text or "'" in text or '"' in text:
        return None
    text = text.replace("&&", " and ").replace("||", " or ")
    text = _INT_LITERAL.sub(_literal, text)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return None
    try:
        return _eval(tree.body, names or {})
    except (ArithmeticError, RecursionError, _NotConstant):
        return None


class _NotConstant(Exception):
    pass


def _eval(node: ast.AST, names: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        value = names[node.id]
        if type(value) is not int:
            raise _NotConstant
        return value
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, names)
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return v
        if isinstance(node.op, ast.Invert):
            return ~v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, names), _eval(node.right, names)
        op = node.op
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, ast.Div):  # C division truncates toward zero
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        if isinstance(op, ast.Mod):
            r = abs(a) % abs(b)
            return r if a >= 0 else -r
        if isinstance(op, (ast.LShift, ast.RShift)) and 0 <= b < 64:
            return a << b if isinstance(op, ast.LShift) else a >> b
        if isinstance(op, ast.BitAnd):
            return a & b
        if isinstance(op, ast.BitOr):
            return a | b
        if isinstance(op, ast.BitXor):
            return a ^ b
    raise _NotConstant


class LazyNames(Mapping[str, int]):
    """Names whose values are C expression texts (`#define N (2 * M)`), evaluated on first use
    with the other names in scope; a cycle or a non-integer text is simply not a value."""

    def __init__(self, texts: Mapping[str, str]) -> None:
        self._texts = texts
        self._done: dict[str, int | None] = {}

    def __getitem__(self, name: str) -> int:
        if name not in self._done:
            self._done[name] = None  # a cycle sees "no value"
            self._done[name] = eval_int(self._texts[name], self)
        value = self._done[name]
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or name not in self._texts:
            return False
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self):
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)
