"""What the model reads: the system prompt, the evaluation of a source in a kernel engineer's
words (verdict, evidence, diagnostics quoting the lines they cite, resources, times, profile),
and the instruction for this turn. The turn structure (a lineage's conversation) lives in
conversation.py; the GPU and the numbers to beat in context.py.
"""

from __future__ import annotations

import json
from typing import Any

from kernel_lsp.model import Evaluation

from .context import describe_device, ms_text  # noqa: F401  (describe_device re-exported: tests and callers import it here)
from .proposer import ProposalRequest

_RULES = """Rules:
- Keep the same interface: for a Python file, `class ModelNew(nn.Module)` with the same \
constructor and forward signature as `Model`; for a .cu file, the same exported function.
- Prefer source forms that compile fast: in a .cu, an `extern "C"` launcher taking raw \
pointers and sizes; in Python, `torch.utils.cpp_extension.load_inline` with a small cpp \
stub (only the declaration) and the kernels in cuda_sources. Such sources build in seconds when \
the kernels touch no torch types: launch them with `<<<...>>>` from the torch-facing host functions, \
pass `data_ptr<T>()` pointers and sizes, and keep `__constant__` memory, `__device__` lambdas and \
thrust/cub out of host code.
- Write every output element; do not modify inputs; do not cache results across calls; \
do not fall back to the PyTorch op being replaced; no side streams; keep the reference's precision.
- Sources are shown with line numbers as `  12| ` prefixes: they are not part of the file; leave \
them out of SEARCH blocks and files."""

SYSTEM = """You are an expert GPU kernel engineer. You rewrite a kernel so that it stays \
numerically correct against the reference and runs faster on the given GPU.

Begin each answer with a short plan (a few lines: what limits the current source, what you \
change, why it should help), then the code. Answer with EITHER the whole new file in ONE fenced \
code block, OR one or more SEARCH/REPLACE patch blocks against the current source:

<<<<<<< SEARCH
exact lines copied from the current source
=======
the lines that replace them
>>>>>>> REPLACE

Each answer is evaluated (compiled, verified against the reference on fresh inputs, timed) and \
the result comes back to you as the next message.

""" + _RULES

SYSTEM_TOOLS = """You are an expert GPU kernel engineer. You rewrite a kernel so that it stays \
numerically correct against the reference and runs faster on the given GPU.

Work like an engineer at a terminal: begin with a short plan, then use the tools. `compile` gives \
the compiler's diagnostics with line numbers, `test` the verifier's verdict with its evidence, \
`time` the measured time against the start, `profile` the profiler's per-kernel facts, \
`read_reference` the code to match (and `read_op_source`, where offered, the op's own code). Each of compile/test/time/profile is one \
evaluation of the Search's budget. Pass either `source` (the whole file) or `patch` \
(SEARCH/REPLACE blocks against your working source, which starts as the current source). When \
a version is correct and faster, call `submit` (the Search re-verifies and times it). If tools are \
unavailable, answer with the whole file in one fenced block or with SEARCH/REPLACE blocks.

""" + _RULES

REPAIR_HINT = """The current source FAILS ({verdict}). Fix it first, with the smallest \
change that works (SEARCH/REPLACE patches preferred). Do not optimize yet."""

FLAG_HINTS = {
    "less_accurate": "its error against a float64 run is beyond the accuracy budget the reference's own "
                     "error sets: accumulate in fp32 (or wider), keep the reference's order of operations "
                     "where it matters, avoid fast-math approximations",
    "precision_lowering": "it computes in a lower precision than the reference (fp16/bf16/TF32 where the "
                          "reference is fp32): keep the reference's dtypes",
    "torch_fallback": "it calls the PyTorch op it should replace: do the work in your own kernel",
    "eval_only": "it is right in eval mode only: handle training mode too",
}

REPAIR_FLAG_HINT = """The current source is correct and timed but does not count: flagged {flags}. \
{why}. Keep what makes it fast and fix only that."""

OPTIMIZE_HINT = """The current source is correct. Make it faster. Try one clear idea \
(memory coalescing, vectorized loads, shared-memory tiling, fusion, fewer launches, \
better block size, warp-level reductions), not a rewrite of everything at once."""

# Sibling children of one node each get one of these, in turn (diversity: the same prompt
# to several samples gives near-copies).
DIRECTIONS = (
    "memory traffic: coalesced, vectorized (16-byte) loads and stores, each byte read once",
    "parallel decomposition: grid and block shape, work per thread, occupancy, tail handling",
    "fusion and launches: fewer kernels, fewer round trips to DRAM, no intermediate tensors",
    "on-chip reuse: shared-memory or register tiling, warp shuffles for reductions",
    "the hardware's units: tensor cores (mma/wgmma), TMA or cp.async pipelines where they fit",
    "algebra: do less work (rewrite the math, skip what the output does not need)",
)


def _trim(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n... [{len(text) - limit} chars trimmed from the middle] ...\n" + text[-half:]


def numbered(source: str) -> str:
    """The source with `  12| ` prefixes: the numbers compiler messages cite."""
    lines = source.splitlines()
    width = max(3, len(str(len(lines))))
    return "\n".join(f"{i:>{width}}| {line}" for i, line in enumerate(lines, 1))


def _quote(source: str | None, line: int) -> str:
    if not source:
        return ""
    lines = source.splitlines()
    return f"\n    {line}| {lines[line - 1].strip()}" if 0 < line <= len(lines) else ""


def describe_resources(r: Any) -> str:
    """One kernel's resources as ptxas reported them, occupancy as a share of the SM's warps."""
    occ = getattr(r, "occupancy", None)
    occ_text = f"{100 * occ:.0f}% theoretical occupancy" if isinstance(occ, (int, float)) else "occupancy unknown"
    limiter = getattr(r, "occupancy_limiter", None)
    return (f"kernel {r.kernel}: {r.registers} registers/thread, {r.shared_bytes} B static shared, "
            f"spills {r.spill_stores} B stored/{r.spill_loads} B loaded, {occ_text}"
            + (f" (limited by {limiter})" if limiter else ""))


def describe_evaluation(ev: Evaluation | None, *, log_limit: int = 3000, source: str | None = None,
                        start: Evaluation | None = None) -> str:
    """The evaluation as the model should read it. `source`: the evaluated text, so compiler
    messages quote the lines they cite. `start`: the start's evaluation, whose baselines hold
    for every candidate (children are timed without them)."""
    if ev is None:
        return "Not evaluated yet."
    lines = [f"verdict: {ev.verdict}" + (f" - {ev.message}" if ev.message else "")]
    if ev.flags:
        lines.append("flags: " + ", ".join(ev.flags))
    if ev.compile is not None and not ev.compile.ok:
        diags = "\n".join(f"line {d.span.start_line + 1}: {d.severity}: {d.message}"
                          + (_quote(source, d.span.start_line + 1) if not d.path else "")
                          for d in ev.compile.diagnostics[:20])
        lines.append("compiler messages:\n" + _trim(diags or ev.compile.log, log_limit))
        if diags and ev.compile.log:
            lines.append("compile log:\n" + _trim(ev.compile.log, log_limit // 2))
    evidence = {k: v for k, v in (ev.evidence or {}).items() if k not in ("phases", "speed_of_light")}
    if evidence:
        lines.append("verifier evidence: " + _trim(json.dumps(evidence, default=str), 1500))
    if ev.verdict == "correct" and ev.compile is not None and ev.compile.resources:
        # Resource facts are for optimizing: only once the node is correct (CuTeGen's order).
        lines += [describe_resources(r) for r in ev.compile.resources[:6]]
    if ev.time is not None:
        eager = ev.eager or (start.eager if start is not None else None)
        compiled = ev.compiled or (start.compiled if start is not None else None)
        lines.append(f"time: {ms_text(ev.time)}; eager reference: {ms_text(eager)}; "
                     f"torch.compile reference: {ms_text(compiled)}")
        for name, base in (("eager", eager), ("torch.compile", compiled)):
            if base is not None and ev.time.median_ms > 0:
                lines.append(f"  {base.median_ms / ev.time.median_ms:.2f}x vs {name}")
    return "\n".join(lines)


def describe_profile(profile: dict[str, Any] | None, limit: int = 6000) -> str:
    """Per kernel, the hottest first, each kernel whole (never cut in the middle of one)."""
    if not profile:
        return ""
    kernels = profile.get("kernels") if isinstance(profile.get("kernels"), list) else None
    if not kernels:
        return _trim(json.dumps(profile, indent=1, default=str), limit)
    head = {k: v for k, v in profile.items() if k not in ("kernels", "command")}
    out = [json.dumps(head, default=str)] if head else []
    used = sum(len(s) for s in out)
    for i, k in enumerate(kernels):
        text = json.dumps(k, default=str)
        if used + len(text) > limit and out:
            out.append(f"[{len(kernels) - i} cooler kernel(s) left out of {len(kernels)}]")
            break
        out.append(text)
        used += len(text)
    return "\n".join(out)


def instruction(req: ProposalRequest) -> str:
    """What this turn asks for: a repair (of a failure, or of a flag), or one direction to speed up."""
    ev = req.evaluation
    if req.mode == "repair":
        bad = [f for f in (ev.flags if ev is not None else []) if f in FLAG_HINTS]
        if ev is not None and ev.verdict == "correct" and bad:
            return REPAIR_FLAG_HINT.format(flags=", ".join(bad), why="; ".join(FLAG_HINTS[f] for f in bad))
        return REPAIR_HINT.format(verdict=ev.verdict if ev else "unknown")
    text = OPTIMIZE_HINT
    if req.direction:
        text += f"\nThis answer's direction: {req.direction}."
    if req.siblings:
        text += ("\nOther answers from this same source are exploring: "
                 + "; ".join(req.siblings) + ". Take a different idea.")
    return text
