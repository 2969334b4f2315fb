"""Scan a Candidate's source for the patterns of the cheats in docs/cheats.md.

Standard library only. Findings are flags, not verdicts: a
flagged Candidate may be correct, but it never counts as an optimized kernel.
Each finding is `{"flag", "line", "text", "why"}` with a 1-based line.
"""

from __future__ import annotations

import re
from typing import Any

from kernel_lsp.engine.worker.judge import stream_args

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
    ("tampering", r"\bos\.(remove|unlink|rename|replace|chmod)\(|\bshutil\.(rmtree|move|copy\w*)\(|"
                  r"\.write_(text|bytes)\(", "writes or removes files (the evaluator's?)"),
    ("side_stream", r"\btorch\.cuda\.(Stream|stream|ExternalStream)\b", "runs work on another CUDA stream"),
    ("side_stream", r"^\s*(import\s+[\w\s,.]*\b(threading|multiprocessing|concurrent)\b|from\s+(threading|"
                    r"multiprocessing|concurrent)\b)|\bThread\(",
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

# Checked on the raw line (the mode is inside a string literal).
_PY_RAW_RULES: list[tuple[str, str, str]] = [
    ("tampering", r"\bopen\([^)#]*,\s*(mode\s*=\s*)?['\"][^'\"]*[wax+]", "writes or removes files (the evaluator's?)"),
]

_CU_RULES: list[tuple[str, str, str]] = [
    ("torch_fallback", r"\b(torch|at)::(matmul|mm|bmm|addmm|linear|conv\w*|softmax|log_softmax|layer_norm|"
                       r"batch_norm|group_norm|gelu|relu|sigmoid|tanh|einsum|scaled_dot_product_attention|"
                       r"sum|mean|max|min|cumsum|exp|mul|add|sub|div)\s*\(",
     "calls an ATen/PyTorch op instead of a kernel"),
    ("torch_fallback", r"\bcublas\w*\(|\bcudnn\w*\(", "calls a vendor library"),
    ("side_stream", r"\bcudaStreamCreate\w*\b|\bstd::thread\b|\bpthread_create\b", "runs work on another stream or thread"),
    ("side_stream", r"\b(getStreamFromPool|getStreamFromExternal|setCurrentCUDAStream|CUDAStreamGuard|"
                    r"OptionalCUDAStreamGuard|CUDAMultiStreamGuard)\b|\bcudaStreamPerThread\b",
     "takes or switches to a stream other than the caller's current stream"),
    ("precision_lowering", r"\b__half\b|\b__nv_bfloat16\b|\b__float2half\w*|\bhalf\b|\bat::kHalf\b|\bat::kBFloat16\b",
     "computes in lower precision"),
    ("cuda_graph", r"\bcudaGraph\w*\b|\bcudaStreamBeginCapture\b", "replays a CUDA graph the baseline lacks"),
    ("timer_patch", r"\bcudaEventElapsedTime\b", "measures its own time"),
]

# Ops that make a Python candidate a PyTorch fallback when it is meant to hold a custom kernel.
_PY_FALLBACK = re.compile(
    r"\b(F|torch\.nn\.functional)\.\w+\(|\btorch\.(matmul|mm|bmm|addmm|einsum|softmax|log_softmax|conv\w*|"
    r"layer_norm|relu|sigmoid|tanh|nn\.functional\.\w+)\(|[\w\)\]]\s*@\s*[\w\(]"
    # An ATen op called as an op overload (torch.ops.aten.exp.default(...)): eager's kernel beside
    # the candidate's own, as the no-LLM writer's "eager op kept" files do.
    r"|\btorch\.ops\.aten\.\w+\.\w+\("
)
_PY_HAS_KERNEL = re.compile(r"load_inline|cpp_extension|@triton\.jit|triton\.jit|ctypes\.CDLL|"
                            r"torch\.ops\.(?!aten\b|prims\b|quantized\b)\w+")

_LOW_PRECISION_WORDS = re.compile(r"half|float16|bfloat16|float8|__half|__nv_bfloat16")


# A string holding C/CUDA code. `<<<` and runtime calls too: a source built from one-line
# strings ("cudaStreamCreate(&s);\\n" with an escaped newline) has no other mark.
_C_CODE_HINT = re.compile(r"__global__|#include|;\s*$|;\s*\n|\{|<<<|\bcu(da)?[A-Z]\w*\s*\(")


def _python_parts(source: str) -> tuple[dict[int, str], list[tuple[int, str]], list[tuple[int, str]]]:
    """(each line with comments and string contents blanked, [(line, text) of C/CUDA code in
    strings], each string whole: [(its first line, text)])."""
    import io
    import tokenize

    lines = source.splitlines()
    blank = [list(ln) for ln in lines]
    c_lines: list[tuple[int, str]] = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        # unparsable: scan it raw, as Python and as C (the CUDA rules must not go blind)
        raw = {i: ln for i, ln in enumerate(lines, start=1)}
        return raw, [(i, ln.split("//", 1)[0]) for i, ln in raw.items()], [(1, source)]
    blocks: list[tuple[int, str]] = []

    def wipe(start: tuple[int, int], end: tuple[int, int]) -> None:
        for row in range(start[0], end[0] + 1):
            if row - 1 >= len(blank):
                break
            chars = blank[row - 1]
            lo = start[1] if row == start[0] else 0
            hi = end[1] if row == end[0] else len(chars)
            for k in range(lo, min(hi, len(chars))):
                chars[k] = " "

    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            wipe(tok.start, tok.end)
        elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            if _C_CODE_HINT.search(tok.string):
                for k, ln in enumerate(tok.string.splitlines()):
                    c_lines.append((tok.start[0] + k, ln.split("//", 1)[0]))
            blocks.append((tok.start[0], tok.string))  # every string: a stream may be declared in any
            wipe(tok.start, tok.end)
    return {i: "".join(chars) for i, chars in enumerate(blank, start=1)}, c_lines, blocks


def _stream_findings(blocks: list[tuple[int, str]], raw_lines: list[str]) -> list[dict[str, Any]]:
    """side_stream for every launch or stream-taking call on a stream that is not the caller's
    current one (engine/worker/judge/stream_args.py), in C/CUDA text starting at the given lines."""
    out = []
    context = "\n".join(text for _, text in blocks)
    for first, text in blocks:
        for offset, stream, what in stream_args.foreign_launches(text, context):
            number = first + offset
            line = raw_lines[number - 1].strip() if 0 < number <= len(raw_lines) else ""
            out.append({"flag": "side_stream", "line": number, "text": line[:160],
                        "why": f"{what} on stream `{stream}`, not the caller's current stream "
                               "(at::cuda::getCurrentCUDAStream()): a race with the caller's work"})
    return out


_REFERENCE_BLOCK = re.compile(r"(class\s+Model\b|def\s+get_inputs\b|def\s+get_init_inputs\b)")


def _reference_owned(source: str, reference_source: str) -> list[str]:
    """The reference's lines that excuse the same line in the candidate. When Model and ModelNew
    share one file, only the reference's own blocks (class Model, get_inputs, get_init_inputs)
    excuse anything: the file's CUDA strings and launch code are the candidate's, and a
    side stream made there was once excused because the whole file was "the reference"."""
    lines = (reference_source or "").splitlines()
    if not reference_source or reference_source != source:
        return lines
    owned, inside = [], False
    for raw in lines:
        if raw.strip() and not raw[0].isspace():
            inside = bool(_REFERENCE_BLOCK.match(raw))
        if inside:
            owned.append(raw)
    return owned


def scan(source: str, kind: str, reference_source: str = "") -> list[dict[str, Any]]:
    """Findings for a Candidate's text. `kind` is "python" or "cuda"; the reference's text
    excuses precision words it uses itself (a half-precision task may use half), and lines it
    holds itself (a candidate that keeps the Task's own code, as an extracted op's does, is not
    flagged for it)."""
    findings: list[dict[str, Any]] = []
    raw_lines = source.splitlines()
    ref_low_precision = bool(_LOW_PRECISION_WORDS.search(reference_source or ""))
    ref_lines = {ln.strip() for ln in _reference_owned(source, reference_source) if ln.strip()}
    in_new: set[int] = set()   # the lines of class ModelNew: never excused
    inside = False
    for number, raw in enumerate(raw_lines, start=1):
        if raw.strip() and not raw[0].isspace():
            inside = bool(re.match(r"class\s+ModelNew\b", raw))
        if inside:
            in_new.add(number)

    def excused(number: int) -> bool:
        """A line the reference holds itself, outside ModelNew."""
        return number not in in_new and 0 < number <= len(raw_lines) and raw_lines[number - 1].strip() in ref_lines

    def add(rules: list[tuple[str, str, str]], number: int, text: str) -> None:
        if excused(number):
            return
        for flag, pattern, why in rules:
            if flag == "precision_lowering" and ref_low_precision:
                continue
            if re.search(pattern, text):
                raw = raw_lines[number - 1] if 0 < number <= len(raw_lines) else text
                findings.append({"flag": flag, "line": number, "text": raw.strip()[:160], "why": why})

    if kind != "python":
        for number, raw in enumerate(raw_lines, start=1):
            add(_CU_RULES, number, raw.split("//", 1)[0])
        findings += _stream_findings([(1, source)], raw_lines)
        return _dedupe(findings)

    code, c_lines, blocks = _python_parts(source)
    for number, text in c_lines:
        add(_CU_RULES, number, text)
    findings += [f for f in _stream_findings(blocks, raw_lines) if not excused(f["line"])]
    has_kernel = _has_kernel(code, c_lines)
    in_forward, forward_indent = False, 0
    current_class = ""
    for number, raw in enumerate(raw_lines, start=1):
        top = re.match(r"class\s+(\w+)", raw)
        if top:
            current_class = top.group(1)
        elif raw and not raw[0].isspace() and raw.strip():
            current_class = ""
        text = code.get(number, "")
        if not text.strip():
            continue
        add(_PY_RULES, number, text)
        add(_PY_RAW_RULES, number, raw)
        indent = len(raw) - len(raw.lstrip())
        # Only ModelNew.forward: a same-file reference's Model.forward is meant to use torch ops.
        if re.match(r"\s*def\s+forward\s*\(", raw) and current_class == "ModelNew":
            in_forward, forward_indent = True, indent
            continue
        if in_forward and indent <= forward_indent:
            in_forward = False
        if in_forward and has_kernel and _PY_FALLBACK.search(text):
            findings.append({"flag": "torch_fallback", "line": number, "text": raw.strip()[:160],
                             "why": "forward calls PyTorch compute ops beside its custom kernel"})
    return _dedupe(findings)


def has_kernel(source: str) -> bool:
    """A Python candidate that brings its own kernel (load_inline / cpp_extension CUDA, Triton,
    a ctypes library, a custom op); without one its speed is PyTorch's."""
    code, c_lines, _ = _python_parts(source)
    return _has_kernel(code, c_lines)


def _has_kernel(code: dict[int, str], c_lines: list[tuple[int, str]]) -> bool:
    """has_kernel on a source already split by _python_parts."""
    if any("__global__" in text for _, text in c_lines):
        return True
    # An import alone builds nothing: a KernelBench file's reference keeps the file's
    # `from torch.utils.cpp_extension import load_inline` once its ModelNew is cut away, and the
    # no-LLM writer must still see a plain module there. A name it imports counts where it is called.
    imports = [t for t in code.values() if _IMPORT_LINE.match(t)]
    body = "\n".join(t for t in code.values() if not _IMPORT_LINE.match(t))
    if _PY_HAS_KERNEL.search(body):
        return True
    for line in imports:
        if _PY_HAS_KERNEL.search(line) and any(re.search(rf"\b{re.escape(n)}\s*\(", body) for n in _imported_names(line)):
            return True
    return False


_IMPORT_LINE = re.compile(r"^\s*(?:from\s+[\w.]+\s+)?import\s")


def _imported_names(line: str) -> list[str]:
    """The names an import line binds: `from a.b import c as d, e` gives [d, e]; `import a.b as c`
    gives [c]; `import a.b` gives [a]."""
    names = line.split(" import ", 1)[1] if re.match(r"\s*from\s", line) else re.sub(r"^\s*import\s", "", line)
    out = []
    for part in names.replace("(", " ").replace(")", " ").split(","):
        words = part.split()
        if not words:
            continue
        name = words[-1] if len(words) >= 3 and words[-2] == "as" else words[0]
        out.append(name.split(".")[0])
    return out


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
