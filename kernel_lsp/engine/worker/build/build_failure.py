"""What a failed build tells the user, wherever it happened (the candidate's import, its
`ModelNew.__init__`, its first `forward`): the compiler's first error and its line in the
candidate's file (`compile_error`), or, when this machine has no way to build CUDA (no nvcc, a
CPU-only build of torch), that it cannot run here (`not_run`, exit 2) and how to get a toolkit.

Every extension build inside the Worker is recorded by worker/build/build.py's `capture()`, whoever
started it; `watch()` keeps those records for one evaluation and `settle()` reads them once the
verdict is in. Standard library and kernel_lsp only; torch is asked only for its CUDA version.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Any, Iterator

from kernel_lsp.model import CompileResult, Diagnostic, Evaluation
from kernel_lsp.verdicts import no_toolkit_reason

# Messages that say the build could not run here at all, not that the code is wrong.
_NO_TOOLKIT = re.compile(
    r"CUDA_HOME environment variable is not set|nvcc was not found|nvcc not found|"
    r"\bnvcc\b[^\n]{0,80}?(?:not found|No such file or directory)|No such file or directory: '[^']*nvcc'|"
    r"Ninja is required to load C\+\+ extensions", re.I)
_FAST_COMPILE = re.compile(r"fast \w+ unit failed to compile:\s*(.*)", re.S)


def no_toolkit(text: str) -> bool:
    return bool(_NO_TOOLKIT.search(text or ""))


@contextlib.contextmanager
def watch() -> Iterator[list[CompileResult]]:
    """The build records of every extension built meanwhile (none when the build module is not
    the one in use: a test's plain builder)."""
    from kernel_lsp.engine.worker.build import build  # noqa: PLC0415 - the builder, loaded with the Worker

    with build.capture() as records:
        yield records


def located_error(result: CompileResult) -> Diagnostic | None:
    """The compiler's first error with a place (file and line), from the build's own log or, when
    the build that followed a failed fast build could not run, from the fast build's compile."""
    located = [d for d in result.diagnostics if d.severity == "error" and d.source == "nvcc" and d.path
               and not no_toolkit(d.message)]
    if located:
        return located[0]
    m = _FAST_COMPILE.search(result.fallback_reason or "")
    if m:
        from kernel_lsp.engine.worker.build.build import parse_compiler_output  # noqa: PLC0415

        for d in parse_compiler_output(m.group(1)):
            if d.severity == "error" and d.path and not no_toolkit(d.message):
                return d
    return None


def cannot_build_here(result: CompileResult) -> bool:
    """No compiler error with a place, and the build says it could not run here (no nvcc, a
    CPU-only torch, no ninja): nothing was wrong with the code as far as anyone could tell."""
    if located_error(result) is not None:
        return False
    texts = [result.log, result.fallback_reason] + [d.message for d in result.diagnostics]
    return any(no_toolkit(t or "") for t in texts)


def first_error(result: CompileResult) -> Diagnostic | None:
    """The error to show: the first one with a place, else the first the compiler gave."""
    located = located_error(result)
    if located is not None:
        return located
    others = [d for d in result.diagnostics if d.severity == "error" and d.source == "nvcc"
              and not no_toolkit(d.message)]
    return others[0] if others else None


def _lines_of(path: str) -> list[str] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return None


def candidate_line(diag: Diagnostic, source: str, filename: str = "") -> int | None:
    """The 1-based line of the candidate's own text that a compiler diagnostic points at: the
    line itself for a .cu compiled under `#line`, else the line of the candidate that reads as
    the compiled file's line (load_inline's cuda.cu / main.cpp hold the candidate's strings,
    after a few lines of their own), the neighbours deciding between equal lines."""
    line = diag.span.start_line
    if diag.path and filename and os.path.abspath(diag.path) == os.path.abspath(filename):
        return line + 1
    compiled = _lines_of(diag.path) if diag.path else None
    if not compiled or line >= len(compiled) or not compiled[line].strip():
        return None
    mine = [ln.strip() for ln in source.splitlines()]
    want = compiled[line].strip()
    best, score = None, -1
    for i, text in enumerate(mine):
        if text != want:
            continue
        s = sum(1 for k in range(-3, 4) if k and 0 <= line + k < len(compiled) and 0 <= i + k < len(mine)
                and compiled[line + k].strip() == mine[i + k] and mine[i + k])
        if s > score:
            best, score = i + 1, s
    return best


def compile_message(result: CompileResult, source: str, filename: str = "") -> tuple[str, dict[str, Any] | None]:
    """("does not build: line N: <the compiler's first error>", evidence) for a failed build."""
    first = first_error(result)
    if first is None:
        any_error = next((d for d in result.diagnostics if d.severity == "error"), None)
        return (f"does not build: {any_error.message}" if any_error else "does not build"), None
    compiled = os.path.basename(first.path or "")
    at = f"{compiled}:{first.span.start_line + 1}" if compiled else ""
    line = candidate_line(first, source, filename)
    if line is not None and compiled and os.path.abspath(first.path or "") != os.path.abspath(filename or "/"):
        where = f"line {line} ({at} as compiled)"
    elif line is not None:
        where = f"line {line}"
    else:
        where = at or "the build"
    evidence = {"file": first.path, "compiled_line": first.span.start_line + 1, "line": line,
                "message": first.message}
    return f"does not build: {where}: error: {first.message}", evidence


def _merge(records: list[CompileResult]) -> CompileResult:
    return CompileResult(ok=False, diagnostics=[d for r in records for d in r.diagnostics],
                         resources=[u for r in records for u in r.resources],
                         log="\n".join(r.log for r in records if r.log),
                         seconds=sum(r.seconds for r in records),
                         fallback_reason="; ".join(r.fallback_reason for r in records if r.fallback_reason))


def _torch_cuda() -> tuple[str, str | None]:
    torch = sys.modules.get("torch")
    if torch is None:
        return "?", None
    return str(torch.__version__), (str(torch.version.cuda) if torch.version.cuda else None)


def settle(ev: Evaluation, records: list[CompileResult], source: str | None, filename: str = "",
           notes: list[str] | None = None, same_file: bool = False) -> None:
    """Once `ev` has its verdict: a build that failed where the candidate raised becomes
    `compile_error` with the compiler's first error and line (or `not_run` when CUDA cannot be
    built here); a build failure the candidate survived (it caught it) is noted. `same_file`:
    the reference is the candidate's own file, so a build failing as the reference loads is
    the candidate's too."""
    if source is None:
        return
    failed = [r for r in records if not r.ok]
    harness = ev.verdict == "error" and ev.message.startswith("harness:") and not same_file
    if ev.verdict == "error" and failed and not harness:
        raised = ev.message
        ev.compile = _merge([r for r in records])
        ev.verdict, ev.correct = "compile_error", False
        ev.message = ""
        ev.evidence = {**(ev.evidence or {}), "raised": raised[:500]}
    if ev.verdict != "compile_error" or ev.compile is None:
        ran = ev.verdict not in ("compile_error", "not_run", "error", "timeout", "crashed", "oom")
        if failed and notes is not None and ran:
            notes.append("an extension build failed inside the candidate and it went on without it: "
                         + compile_message(_merge(failed), source, filename)[0])
        return
    if cannot_build_here(ev.compile):
        ev.verdict, ev.correct = "not_run", None
        ev.message = no_toolkit_reason(*_torch_cuda())
        return
    ev.message, where = compile_message(ev.compile, source, filename)
    if where is not None:
        ev.evidence = {**(ev.evidence or {}), "build_error": where}
