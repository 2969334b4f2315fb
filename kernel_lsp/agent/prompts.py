"""Prompts for the LLM proposer: the task, the GPU, the current source, the last evaluation."""

from __future__ import annotations

import json
from typing import Any

from kernel_lsp.model import Evaluation, Task

from .proposer import ProposalRequest

SYSTEM = """You are an expert GPU kernel engineer. You rewrite a kernel so that it stays \
numerically correct against the reference and runs faster on the given GPU.

Answer with EITHER the whole new file in ONE fenced code block, OR one or more \
SEARCH/REPLACE patch blocks against the current source:

<<<<<<< SEARCH
exact lines copied from the current source
=======
the lines that replace them
>>>>>>> REPLACE

Rules:
- Keep the same interface: for a Python file, `class ModelNew(nn.Module)` with the same \
constructor and forward signature as `Model`; for a .cu file, the same exported function.
- Prefer source forms that compile fast: in a .cu, an `extern "C"` launcher taking raw \
pointers and sizes; in Python, `torch.utils.cpp_extension.load_inline` with a small cpp \
stub (only the declaration) and the kernels in cuda_sources. Such sources build in seconds when the kernels touch no torch types: launch them with `<<<...>>>` from the torch-facing host functions, pass `data_ptr<T>()` pointers and sizes, and keep `__constant__` memory, `__device__` lambdas and thrust/cub out of host code.
- Write every output element; do not modify inputs; do not cache results across calls; \
do not fall back to the PyTorch op being replaced; no side streams.
- One short sentence before the code saying what you changed."""

REPAIR_HINT = """The current source FAILS ({verdict}). Fix it first, with the smallest \
change that works (SEARCH/REPLACE patches preferred). Do not optimize yet."""

OPTIMIZE_HINT = """The current source is correct. Make it faster. Try one clear idea \
(memory coalescing, vectorized loads, shared-memory tiling, fusion, fewer launches, \
better block size, warp-level reductions), not a rewrite of everything at once."""


def _trim(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n... [{len(text) - limit} chars trimmed] ...\n" + text[-half:]


def _ms(t: Any) -> str:
    return "n/a" if t is None else f"{t.median_ms:.4f} ms (spread {t.spread_pct:.1f}%)"


def describe_device(info: dict[str, Any]) -> str:
    if not info:
        return "GPU: unknown"
    keys = [("name", "name"), ("capability", "compute capability"), ("sm_count", "SMs"),
            ("memory_bandwidth_gbps", "memory bandwidth GB/s"), ("memory_gb", "memory GB"),
            ("shared_memory_per_block", "shared memory per block"), ("l2_bytes", "L2 bytes")]
    parts = [f"{label}: {info[k]}" for k, label in keys if info.get(k) not in (None, "")]
    extra = {k: v for k, v in info.items() if k not in dict(keys) and isinstance(v, (int, float, str))}
    for k, v in list(extra.items())[:8]:
        parts.append(f"{k}: {v}")
    return "GPU: " + ", ".join(parts)


def describe_evaluation(ev: Evaluation | None, *, log_limit: int = 3000) -> str:
    if ev is None:
        return "Not evaluated yet."
    lines = [f"verdict: {ev.verdict}" + (f" - {ev.message}" if ev.message else "")]
    if ev.flags:
        lines.append("flags: " + ", ".join(ev.flags))
    if ev.compile is not None and not ev.compile.ok:
        diags = "\n".join(f"line {d.span.start_line + 1}: {d.severity}: {d.message}"
                          for d in ev.compile.diagnostics[:20])
        lines.append("compiler messages:\n" + _trim(diags or ev.compile.log, log_limit))
        if diags and ev.compile.log:
            lines.append("compile log (trimmed):\n" + _trim(ev.compile.log, log_limit // 2))
    if ev.evidence:
        lines.append("verifier evidence: " + _trim(json.dumps(ev.evidence, default=str), 1500))
    if ev.verdict == "correct" and ev.compile is not None and ev.compile.resources:
        # Resource facts are for optimizing: only once the node is correct (CuTeGen's order).
        for r in ev.compile.resources[:6]:
            lines.append(f"kernel {r.kernel}: {r.registers} registers, {r.shared_bytes} B shared, "
                         f"spills {r.spill_stores}/{r.spill_loads}, occupancy {r.occupancy}")
    if ev.time is not None:
        lines.append(f"time: {_ms(ev.time)}; eager reference: {_ms(ev.eager)}; "
                     f"torch.compile reference: {_ms(ev.compiled)}")
    return "\n".join(lines)


def describe_profile(profile: dict[str, Any] | None, limit: int = 2500) -> str:
    if not profile:
        return ""
    return _trim(json.dumps(profile, indent=1, default=str), limit)


def build_messages(req: ProposalRequest) -> list[dict[str, str]]:
    task: Task = req.task
    lang = "python" if req.parent.kind == "python" else "cuda"
    parts = [
        f"Task: {task.name}",
        describe_device(req.device),
        "Reference (KernelBench format, the ground truth):\n```python\n"
        + _trim(task.reference_source, 12000) + "\n```",
        f"Current source ({'a Python file defining ModelNew' if lang == 'python' else 'a .cu file'}):"
        f"\n```{lang}\n{req.parent.source}\n```",
        "Last evaluation of the current source:\n" + describe_evaluation(req.evaluation),
    ]
    if req.start_evaluation is not None and req.start_evaluation.time is not None:
        parts.append(f"The user's starting source runs in {_ms(req.start_evaluation.time)}.")
    if req.profile:
        parts.append("Profiler facts for the current source:\n" + describe_profile(req.profile))
    if req.history:
        parts.append("Already tried (do not repeat):\n" + "\n".join(f"- {h}" for h in req.history[-12:]))
    if req.mode == "repair":
        verdict = req.evaluation.verdict if req.evaluation else "unknown"
        parts.append(REPAIR_HINT.format(verdict=verdict))
    else:
        parts.append(OPTIMIZE_HINT)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]
