"""Which stream does CUDA/C++ text launch its work on? (standard library only)

A kernel launched on a stream other than the caller's current one races with the caller:
PyTorch orders its own work (the next op reading the output, the timer's events) on the
current stream only. `foreign_launches(code)` finds every launch (`<<<grid, block, smem,
STREAM>>>`), stream-taking runtime call (`cudaMemcpyAsync(..., STREAM)`, `cudaLaunchKernel`,
...) and launch config (`cfg.stream = STREAM`) whose stream is not known to be the current one.

Known to be the current stream: `at::cuda::getCurrentCUDAStream()` / `c10::cuda::
getCurrentCUDAStream()` (with `.stream()`, casts), the legacy default stream (`0`, `nullptr`,
`NULL`, `cudaStreamLegacy`: what PyTorch's current stream is unless the caller switched), a
variable only ever assigned one of those, and a function parameter (the caller passes it: from
Python, `torch.cuda.current_stream().cuda_stream`, which the Python scan checks). Anything else
(a stream the code made, took from a pool, or keeps in a global) is foreign. A text scan, not
a compiler: a stream reached through a struct member or a container reads as foreign, which
errs on the side of not crediting.
"""

from __future__ import annotations

import re

# Runtime calls that take a stream, and the 0-based position of that argument; a call with
# fewer arguments uses the default stream (the argument's default), which is the current one.
STREAM_ARG = {
    "cudaMemcpyAsync": 4, "cudaMemsetAsync": 3, "cudaMemcpy2DAsync": 7, "cudaMemset2DAsync": 5,
    "cudaMemcpy3DAsync": 1, "cudaMemcpyToSymbolAsync": 5, "cudaMemcpyFromSymbolAsync": 5,
    "cudaMemcpyPeerAsync": 5, "cudaMallocAsync": 2, "cudaFreeAsync": 1, "cudaMemPrefetchAsync": 3,
    "cudaLaunchKernel": 5, "cudaLaunchCooperativeKernel": 5, "cudaLaunchHostFunc": 0,
    "cudaGraphLaunch": 1, "cuLaunchKernel": 8, "cuMemcpyAsync": 3, "cuMemcpyHtoDAsync": 3,
    "cuMemcpyDtoHAsync": 3, "cuMemcpyDtoDAsync": 3,
    # a library handle set to a stream runs every later call of that library there
    "cublasSetStream": 1, "cublasSetStream_v2": 1, "cublasLtMatmul": 15, "cudnnSetStream": 1,
}

_CURRENT_CALL = re.compile(r"\bget(Current|Default)CUDAStream\b|\bgetCurrentStream\b")
_DEFAULT = re.compile(r"(0[lLuU]*|NULL|nullptr|cudaStreamLegacy|CU_STREAM_LEGACY|\{\s*\}|at::cuda::CUDAStream\(\))")
_CAST = re.compile(r"^\(\s*(?:const\s+)?(?:cudaStream_t|CUstream|void\s*\*|(?:std::)?u?intptr_t)\s*\)\s*")
_CPP_CAST = re.compile(r"^(?:static|reinterpret|const)_cast\s*<[^<>]*>\s*\((.*)\)$", re.S)
_TYPES = (r"(?:const\s+)?(?:cudaStream_t|CUstream|void\s*\*|(?:std::)?u?intptr_t|int64_t|long\s+long|long|"
          r"(?:at|c10)::cuda::CUDAStream|CUDAStream|auto)")
_PARAM = re.compile(r"[(,]\s*" + _TYPES + r"\s*[&*]?\s*(\w+)\s*(?=[,)=])")
_ASSIGN = re.compile(r"(?<![=!<>+\-*/%&|^.])\b(\w+)\s*=(?!=)\s*([^;{}]+);")
_CTOR = re.compile(r"\b" + _TYPES + r"\s+(\w+)\s*[({]([^;]*)[)}]\s*;")
_MADE = re.compile(r"\b(?:cudaStreamCreate\w*|cuStreamCreate\w*)\s*\(\s*&\s*(\w+)")
_CONFIG_STREAM = re.compile(r"(?:\.|->)\s*stream\s*=(?!=)\s*([^;]+);")
_CALL = re.compile(r"\b(" + "|".join(sorted(STREAM_ARG, key=len, reverse=True)) + r")\s*\(")


def strip_comments(code: str) -> str:
    """`//` and `/* */` comments blanked, newlines and offsets kept."""
    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, code, flags=re.S)


def split_args(text: str) -> list[str]:
    """Top-level comma-separated parts of `text` (brackets and parentheses nest)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _balanced(code: str, open_at: int) -> int:
    """Index just past the parenthesis that closes the one at `open_at` (or len(code))."""
    depth = 0
    for i in range(open_at, len(code)):
        if code[i] == "(":
            depth += 1
        elif code[i] == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(code)


def _bare(expr: str) -> str:
    e = expr.strip()
    for _ in range(4):
        before = e
        e = _CAST.sub("", e).strip()
        m = _CPP_CAST.match(e)
        if m:
            e = m.group(1).strip()
        e = re.sub(r"\.\s*stream\s*\(\s*\)$", "", e).strip()
        if e.startswith("(") and e.endswith(")") and _balanced(e, 0) == len(e):
            e = e[1:-1].strip()
        if e == before:
            break
    return e


class _Streams:
    def __init__(self, code: str) -> None:
        self.params = set(_PARAM.findall(code))
        self.made = set(_MADE.findall(code))  # whatever else it is assigned, it was made here
        assigned: dict[str, list[str]] = {}
        for name, rhs in _ASSIGN.findall(code) + _CTOR.findall(code):
            assigned.setdefault(name, []).append(rhs)
        self.current: set[str] = set()
        for _ in range(8):  # a = getCurrent...; b = a; ...: a short fixpoint
            grown = {n for n, rhss in assigned.items() if all(self.is_current(r) for r in rhss)}
            if grown <= self.current:
                break
            self.current |= grown
        self.assigned = assigned

    def is_current(self, expr: str) -> bool:
        e = _bare(expr)
        if not e or _DEFAULT.fullmatch(e) or _CURRENT_CALL.search(e):
            return True
        if re.fullmatch(r"\w+", e):
            if e in self.made:
                return False
            if e in self.current:
                return True
            return e in self.params and e not in self.assigned
        return False


def foreign_launches(code: str, context: str | None = None) -> list[tuple[int, str, str]]:
    """(0-based line in `code`, stream expression, what) for each launch or stream-taking call
    whose stream is not known to be the caller's current stream. `context`: all the C/C++ text
    the code belongs with (a source written as several Python strings), where the streams'
    declarations and assignments are looked up; `code` itself by default."""
    text = strip_comments(code)
    streams = _Streams(strip_comments(context) if context is not None else text)
    out: list[tuple[int, str, str]] = []

    def check(pos: int, expr: str, what: str) -> None:
        if not streams.is_current(expr):
            out.append((text.count("\n", 0, pos), " ".join(expr.split())[:80], what))

    for m in re.finditer(r"<<<(.*?)>>>", text, re.S):
        args = split_args(m.group(1))
        if len(args) >= 4:
            check(m.start(), args[3], "a kernel launch")
    for m in _CALL.finditer(text):
        end = _balanced(text, m.end() - 1)
        args = split_args(text[m.end():end - 1])
        index = STREAM_ARG[m.group(1)]
        if index < len(args) and args[index]:
            check(m.start(), args[index], m.group(1))
    for m in _CONFIG_STREAM.finditer(text):
        check(m.start(), m.group(1), "a launch configuration")
    return out
