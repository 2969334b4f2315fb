"""What a kernel engineer would tell a colleague before they start: the GPU's facts in units,
what the toolchain offers, the numbers this Task is judged by, and, for an op Task of the
whole-model flow, the op's own source (its Task holds only `self.op = _original().Cls(...)`).

Caller side: no torch, no CUDA; everything comes from `engine.device_info()`, the Evaluations
and the files on disk.
"""

from __future__ import annotations

import ast
import glob
import os
import re
from typing import Any

from kernel_lsp.model import Evaluation, Task
from kernel_lsp.toolchain.occupancy import ARCH_LIMITS

# What an architecture's arch-specific target ("a" suffix) enables; the base target has none of it.
ARCH_FEATURES: dict[int, str] = {
    80: "sm_80: cp.async, mma.sync (tensor cores via mma/wmma), bf16/tf32",
    86: "sm_86: cp.async, mma.sync",
    89: "sm_89: cp.async, mma.sync, fp8 mma",
    90: "sm_90a: wgmma (warpgroup MMA), TMA (cp.async.bulk.tensor), setmaxnreg, thread-block clusters "
        "and distributed shared memory; builds here target sm_90a",
    100: "sm_100a: tcgen05 MMA with tensor memory, TMA, clusters; builds here target sm_100a",
    103: "sm_103a: tcgen05 MMA with tensor memory, TMA, clusters",
    120: "sm_120a: mma.sync with fp8/fp4, TMA",
}


# FP32 lanes per SM by compute capability (the CUDA programming guide's arithmetic throughput table).
FP32_LANES_PER_SM: dict[int, int] = {70: 64, 75: 64, 80: 64, 86: 128, 87: 128, 89: 128, 90: 128,
                                     100: 128, 103: 128, 120: 128}


def _capability(info: dict[str, Any]) -> int | None:
    cap = info.get("capability")
    if isinstance(cap, (list, tuple)) and len(cap) == 2:
        return int(cap[0]) * 10 + int(cap[1])
    if isinstance(cap, str) and re.fullmatch(r"\d+\.\d+", cap):
        major, minor = cap.split(".")
        return int(major) * 10 + int(minor)
    return None


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def _peaks(name: str) -> dict[str, float]:
    """Dense peak FLOP/s by dtype from the engine's roofline table (empty for an unknown GPU)."""
    try:
        from kernel_lsp.engine.worker.timing.roofline import for_device
    except Exception:  # the table is a hint: a GPU it does not know gets no peaks
        return {}
    out = {}
    for dtype, key in (("float32", "tf32 (tensor cores)"), ("float16", "fp16"), ("bfloat16", "bf16"),
                       ("float8_e4m3fn", "fp8"), ("float64", "fp64")):
        roof = for_device(name, dtype)
        if roof.source == "table" and roof.peak_flops:
            out[key] = roof.peak_flops
    return out


def describe_device(info: dict[str, Any]) -> str:
    """The GPU in units: one fact per line, only facts the engine reported or a table holds."""
    if not info:
        return "GPU: unknown"
    if info.get("cuda") is False or info.get("name") == "cpu":
        return f"GPU: none (name: {info.get('name', 'cpu')}; {info.get('note', 'no CUDA GPU visible')})"
    lines = [f"GPU: {info.get('name', 'unknown')}"]
    cap = _capability(info)
    if cap is not None:
        lines.append(f"- compute capability {cap // 10}.{cap % 10} (sm_{cap})")
    if info.get("sm_count"):
        lines.append(f"- {info['sm_count']} SMs" + (f", max SM clock {info['max_sm_clock_mhz']:.0f} MHz"
                                                   if isinstance(info.get("max_sm_clock_mhz"), (int, float)) else ""))
    limits = ARCH_LIMITS.get(cap) if cap is not None else None
    if limits is not None:
        lines.append(f"- per SM: {limits.regs_per_sm} 32-bit registers, {_bytes(limits.smem_per_sm)} shared memory, "
                     f"{limits.max_warps_per_sm * 32} threads, {limits.max_blocks_per_sm} blocks")
        lines.append(f"- per block: {limits.regs_per_block} registers, {_bytes(limits.max_smem_per_block)} shared "
                     f"memory with the dynamic opt-in (48 KiB static), {limits.max_threads_per_block} threads; "
                     f"at most {limits.max_regs_per_thread} registers per thread")
    mem = info.get("memory_bytes")
    if mem:
        lines.append(f"- memory {_bytes(mem)}")
    if info.get("memory_bandwidth"):
        src = info.get("bandwidth_source")
        lines.append(f"- DRAM bandwidth {info['memory_bandwidth'] / 1e9:.0f} GB/s"
                     + (f" (from the {src})" if src else ""))
    if info.get("l2_bytes"):
        lines.append(f"- L2 cache {_bytes(info['l2_bytes'])}")
    peaks = _peaks(str(info.get("name", "")))
    lanes = FP32_LANES_PER_SM.get(cap) if cap is not None else None
    clock = info.get("max_sm_clock_mhz")
    if lanes and info.get("sm_count") and isinstance(clock, (int, float)):
        # Plain fp32 (an FMA is 2 FLOP per lane per clock): the ceiling of a kernel without tensor
        # cores, 7x below the TF32 figure on Hopper; a model must not aim at the wrong one.
        peaks = {"fp32 (CUDA cores, FMA)": 2 * lanes * info["sm_count"] * clock * 1e6, **peaks}
    if peaks:
        lines.append("- dense peak: " + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in peaks.items()))
    if cap is not None and cap in ARCH_FEATURES:
        lines.append(f"- {ARCH_FEATURES[cap]}")
    return "\n".join(lines)


def cutlass_headers(roots: tuple[str, ...] | None = None) -> str | None:
    """Where CUTLASS/CuTe headers are, if anywhere usual (None: not found)."""
    roots = roots or tuple(p for p in (os.environ.get("CUTLASS_PATH", ""), "/usr/local/cuda/include",
                                       "/usr/include", "/opt/cutlass/include", "/usr/local/include") if p)
    for root in roots:
        for sub in ("cutlass/cutlass.h", "include/cutlass/cutlass.h"):
            if os.path.exists(os.path.join(root, sub)):
                return os.path.dirname(os.path.dirname(os.path.join(root, sub)))
    hits = glob.glob(os.path.join(os.path.expanduser("~"), ".local/lib/python3*/site-packages/cutlass_library"))
    return hits[0] if hits else None


def _local_nvcc() -> str | None:
    from kernel_lsp.toolchain.nvcc import ToolchainError, find_nvcc, nvcc_version

    path = find_nvcc()
    try:
        return nvcc_version(path) if path else None
    except ToolchainError:
        return None


def describe_toolchain(info: dict[str, Any], cutlass: str | None | bool = False) -> str:
    """Versions the Worker reported and what may be included; `cutlass` False: look it up."""
    where = cutlass_headers() if cutlass is False else cutlass
    parts = []
    for key, label in (("cuda", "CUDA"), ("torch", "PyTorch"), ("triton", "Triton")):
        value = info.get(key)
        if value not in (None, "", "none", True, False):
            parts.append(f"{label} {value}")
    if not any(p.startswith("CUDA") for p in parts):
        nvcc = _local_nvcc()
        if nvcc:
            parts.insert(0, f"nvcc {nvcc}")
    parts.append(f"CUTLASS/CuTe headers at {where}" if where else "no CUTLASS/CuTe headers (write CUDA or Triton)")
    return "Toolchain: " + ", ".join(parts)


def ms_text(t: Any) -> str:
    """A Timing as the prompts show it: median with its spread."""
    return "n/a" if t is None else f"{t.median_ms:.4f} ms (spread {t.spread_pct:.1f}%)"


def describe_targets(start: Evaluation | None, current: Evaluation | None, seed: Any = None) -> str:
    """The numbers users judge the result by: the reference eager and under torch.compile, the
    user's starting source, the torch.compile seed when the Search has one (agent/seed.py: what
    is offered must beat it too), and the hardware floor with the share the current source
    reaches. Children are timed without baselines: the start's baselines hold."""
    if start is None:
        return ""
    eager = (current.eager if current is not None and current.eager else None) or start.eager
    compiled = (current.compiled if current is not None and current.compiled else None) or start.compiled
    lines = [f"- the reference eagerly: {ms_text(eager)}",
             f"- the reference under torch.compile: {ms_text(compiled)}"
             + ("" if compiled is not None else " (not timed)"),
             f"- the user's starting source: {ms_text(start.time)}"]
    if seed is not None and getattr(seed, "evaluation", None) is not None:
        lines.append(f"- the seed ({seed.label}): {ms_text(seed.evaluation.time)}; a version is kept only if it "
                     "beats this too")
    if current is not None and current.time is not None and current is not start:
        lines.append(f"- the current source: {ms_text(current.time)}")
    sol = _speed_of_light(current) or _speed_of_light(start)
    if sol:
        lines.append("- " + sol)
    return "Numbers to beat (the user compares against both baselines):\n" + "\n".join(lines)


def _speed_of_light(ev: Evaluation | None) -> str:
    sol = (ev.evidence or {}).get("speed_of_light") if ev is not None else None
    if not isinstance(sol, dict):
        return ""
    parts = []
    if isinstance(sol.get("bytes_floor_ms"), (int, float)):
        parts.append(f"moving the bytes once takes {sol['bytes_floor_ms']:.4f} ms")
    if isinstance(sol.get("flop_floor_ms"), (int, float)):
        parts.append(f"the FLOPs at peak {sol['flop_floor_ms']:.4f} ms")
    text = "hardware floor: " + ("; ".join(parts) if parts else "unknown")
    if isinstance(sol.get("fraction"), (int, float)):
        text += f"; this source reaches {100 * sol['fraction']:.0f}% of it"
    if sol.get("label"):
        text += f" ({sol['label']})"
    return text


# -- the op's own source, for an op Task of the whole-model flow ------------------------------

_ORIGINAL_CALL = re.compile(r"_original\(\)\.(\w+)\(")
_SOURCE_LINE = re.compile(r"^SOURCE = os\.path\.join\(os\.path\.dirname\(os\.path\.abspath\(__file__\)\), (['\"])(.+?)\1\)",
                          re.M)


def op_source(task: Task, limit: int = 12000) -> str | None:
    """The class an op Task builds from the user's file, with the user's top-level helpers and
    classes it names (one level deep), as text; None when the Task is not such an op Task or
    the file cannot be read."""
    ref = task.reference_source or ""
    m_cls, m_src = _ORIGINAL_CALL.search(ref), _SOURCE_LINE.search(ref)
    if not m_cls or not m_src:
        return None
    path = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(task.reference_path)), m_src.group(2)))
    try:
        text = open(path, encoding="utf-8").read()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    name = m_cls.group(1)
    if name not in defs:
        return None
    lines = text.splitlines()
    wanted = [name]
    names_used = {n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)}
    names_used |= {n.attr for n in ast.walk(defs[name]) if isinstance(n, ast.Attribute)}
    wanted += [d for d in defs if d != name and d in names_used and d not in ("Model", "ModelNew")]
    chunks = []
    for d in sorted(wanted, key=lambda d: defs[d].lineno):
        node = defs[d]
        start = min([node.lineno] + [dec.lineno for dec in getattr(node, "decorator_list", [])])
        chunks.append(f"# {os.path.basename(path)}, lines {start}-{node.end_lineno}\n"
                      + "\n".join(lines[start - 1:node.end_lineno]))
    out = "\n\n".join(chunks)
    if len(out) > limit:
        out = out[:limit] + f"\n# ... [{len(out) - limit} chars of helpers left out]"
    return out
