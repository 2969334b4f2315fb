"""Scan a Candidate's source for the patterns of DESIGN.md's cheat list.

Standard library only (it also runs caller-side). Findings are flags, not verdicts: a
flagged Candidate may be correct, but it never counts as an optimized kernel.
Each finding is `{"flag", "line", "text", "why"}` with a 1-based line.
"""

from __future__ import annotations

import re
from typing import Any

# (flag, regex, why). Python and CUDA/C++ patterns; checked line by line, comments stripped.
_PY_RULES: list[tuple[str, str, str]] = [
    ("timer_patch", r"\b(torch\.cuda\.(Event|synchronize|elapsed_time)|time\.(perf_counter(_ns)?|time(_ns)?|monotonic(_ns)?)"
                    r"|statistics\.\w+|torch\.cuda\.Event\.\w+)\s*=(?!=)", "reassigns a timer or statistics function"),
    ("timer_patch", r"\bsetattr\(\s*(torch|time|statistics|builtins)\b", "patches timing/statistics via setattr"),
    ("tampering", r"^\s*(import|from)\s+kernel_lsp\b", "imports the evaluator"),
    ("tampering", r"\bsys\.modules\b|\bsys\._getframe\b|\binspect\.(stack|currentframe)\b|\bgc\.get_objects\b",
     "reaches into the interpreter / the caller's frames"),
    ("tampering", r"\bbuiltins\.\w+\s*=(?!=)|__builtins__", "patches builtins"),
    ("tampering", r"\b(TorchFunctionMode|TorchDispatchMode|__torch_function__|__torch_dispatch__)\b",
     "installs a torch function/dispatch hook (can fake comparisons)"),
    ("side_stream", r"\btorch\.cuda\.(Stream|stream|ExternalStream)\b", "runs work on another CUDA stream"),
    ("side_stream", r"^\s*(import|from)\s+(threading|multiprocessing|concurrent)\b|\bThread\(",
     "runs work on another thread or process"),
    ("result_cache", r"\w\[[^\]\n]*(\.data_ptr\(\)|\bid\()|\.get\([^\n]*(\.data_ptr\(\)|\bid\()"
                     r"|\bif\b[^\n]*(\.data_ptr\(\)|\bid\([^)]*\))[^\n]*\bin\b", "looks results up by pointer or id"),
    ("result_cache", r"@(functools\.)?(lru_cache|cache)\b", "memoizes results"),
    ("precision_lowering", r"\.(half|bfloat16)\(\)|torch\.(float16|half|bfloat16|float8\w*)\b|autocast",
     "computes in lower precision"),
    ("precision_lowering", r"allow_tf32\s*=\s*True|set_float32_matmul_precision\(\s*['\"](high|medium)",
     "enables TF32"),
    ("cuda_graph", r"\bCUDAGraph\b|\bcuda\.graph\b|make_graphed_callables", "replays a CUDA graph the baseline lacks"),
]

_CU_RULES: list[tuple[str, str, str]] = [
    ("torch_fallback", r"\b(torch|at)::(matmul|mm|bmm|addmm|linear|conv\w*|softmax|log_softmax|layer_norm|"
                       r"batch_norm|group_norm|gelu|relu|sigmoid|tanh|einsum|scaled_dot_product_attention|"
                       r"sum|mean|max|min|cumsum|exp|mul|add|sub|div)\s*\(",
     "calls an ATen/PyTorch op instead of a kernel"),
    ("torch_fallback", r"\bcublas\w*\(|\bcudnn\w*\(", "calls a vendor library"),
    ("side_stream", r"\bcudaStreamCreate\w*\b|\bstd::thread\b|\bpthread_create\b", "runs work on another stream or thread"),
    ("precision_lowering", r"\b__half\b|\b__nv_bfloat16\b|\b__float2half\w*|\bhalf\b|\bat::kHalf\b|\bat::kBFloat16\b",
     "computes in lower precision"),
    ("cuda_graph", r"\bcudaGraph\w*\b|\bcudaStreamBeginCapture\b", "replays a CUDA graph the baseline lacks"),
    ("timer_patch", r"\bcudaEventElapsedTime\b|\bcudaEventRecord\b", "records its own timing events"),
]

# Ops that make a Python candidate a PyTorch fallback when it is meant to hold a custom kernel.
_PY_FALLBACK = re.compile(
    r"\b(F|torch\.nn\.functional)\.\w+\(|\btorch\.(matmul|mm|bmm|addmm|einsum|softmax|log_softmax|conv\w*|"
    r"layer_norm|relu|sigmoid|tanh|nn\.functional\.\w+)\(|[\w\)\]]\s*@\s*[\w\(]"
)
_PY_HAS_KERNEL = re.compile(r"load_inline|cpp_extension|@triton\.jit|triton\.jit|ctypes\.CDLL|torch\.ops\.\w+")

_LOW_PRECISION_WORDS = re.compile(r"half|float16|bfloat16|float8|__half|__nv_bfloat16")


_C_CODE_HINT = re.compile(r"__global__|#include|;\s*$|;\s*\n|\{")


def _python_parts(source: str) -> tuple[dict[int, str], list[tuple[int, str]]]:
    """(code text per line without comments/strings, [(line, text) of C/CUDA code in strings])."""
    import io
    import tokenize

    code: dict[int, list[str]] = {}
    c_lines: list[tuple[int, str]] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        # Unparsable Python: scan it raw, as code.
        return {i: ln for i, ln in enumerate(source.splitlines(), start=1)}, []
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            if _C_CODE_HINT.search(tok.string):
                for k, ln in enumerate(tok.string.splitlines()):
                    c_lines.append((tok.start[0] + k, ln.split("//", 1)[0]))
            code.setdefault(tok.start[0], []).append('""')
            continue
        code.setdefault(tok.start[0], []).append(tok.string)
    return {n: " ".join(parts) for n, parts in code.items()}, c_lines


def _joined(line: str) -> str:
    """Tokens joined by spaces: `torch . cuda . Event = x` -> `torch.cuda.Event = x`."""
    line = re.sub(r"\s*\.\s*", ".", line)
    line = re.sub(r"\s*\(\s*", "(", line)
    return re.sub(r"\s*\)", ")", line)


def scan(source: str, kind: str, reference_source: str = "") -> list[dict[str, Any]]:
    """Findings for a Candidate's text. `kind` is "python" or "cuda"; the reference's text
    excuses precision words it uses itself (a half-precision task may use half)."""
    findings: list[dict[str, Any]] = []
    raw_lines = source.splitlines()
    ref_low_precision = bool(_LOW_PRECISION_WORDS.search(reference_source or ""))

    def add(rules: list[tuple[str, str, str]], number: int, text: str) -> None:
        for flag, pattern, why in rules:
            if flag == "precision_lowering" and ref_low_precision:
                continue
            if re.search(pattern, text):
                raw = raw_lines[number - 1] if 0 < number <= len(raw_lines) else text
                findings.append({"flag": flag, "line": number, "text": raw.strip()[:160], "why": why})

    if kind != "python":
        for number, raw in enumerate(raw_lines, start=1):
            add(_CU_RULES, number, raw.split("//", 1)[0])
        return _dedupe(findings)

    code, c_lines = _python_parts(source)
    for number, text in c_lines:
        add(_CU_RULES, number, text)
    has_kernel = bool(c_lines) or bool(_PY_HAS_KERNEL.search(source))
    in_forward, forward_indent = False, 0
    for number, raw in enumerate(raw_lines, start=1):
        text = _joined(code.get(number, ""))
        if not text.strip():
            continue
        add(_PY_RULES, number, text)
        indent = len(raw) - len(raw.lstrip())
        if re.match(r"\s*def\s+forward\s*\(", raw):
            in_forward, forward_indent = True, indent
            continue
        if in_forward and indent <= forward_indent:
            in_forward = False
        if in_forward and has_kernel and _PY_FALLBACK.search(text):
            findings.append({"flag": "torch_fallback", "line": number, "text": raw.strip()[:160],
                             "why": "forward calls PyTorch compute ops beside its custom kernel"})
    return _dedupe(findings)


def _dedupe(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[tuple[str, int]] = set()
    out = []
    for f in findings:
        key = (f["flag"], f["line"])
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def flags(findings: list[dict[str, Any]]) -> list[str]:
    return sorted({f["flag"] for f in findings})
