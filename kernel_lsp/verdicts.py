"""What to tell the user about an Evaluation or a Search: one reason string, one exit code.

Standard library and `kernel_lsp.model` only, so the command line and the language server
both import it without torch or openai. Functions accept the records or their JSON forms
(`Evaluation.to_dict()` / `summary()`, `SearchResult.to_dict()`).

Exit codes (every command): 0 = did what was asked and found it good; 1 = ran and found a
problem or no improvement; 2 = could not run (bad input, no GPU for GPU work, no model
configured, endpoint unreachable).
"""

from __future__ import annotations

import re
from typing import Any

from kernel_lsp.model import (
    ACCURACY_FLAGS,
    CUSTOM_KERNEL,
    NOISY_SPREAD_PCT,
    PYTORCH_REWRITE,
    Evaluation,
    disqualified_by,
)

# Reasons the engine and the Search give, word for word (front ends may match on them).
NO_GPU = "a .cu candidate needs a GPU to run; none is visible"
NO_GPU_TASK = "this Task runs on a CUDA GPU; none is visible"
NO_MODEL = ("no model configured for the LLM proposer: set --model / KERNEL_LSP_MODEL "
            "(and --base-url / OPENAI_BASE_URL for a local or private endpoint), or use the tuner")
ALL_SLOWER = "every candidate was slower"
NO_CUDA_TOOLKIT = "this machine cannot build CUDA code"


GPU_MEMORY_HELD = "out of memory while other processes held the GPU's memory"


def shared_oom_reason(processes: list[dict[str, Any]], waited_s: float, retried: bool) -> str:
    """Why an out-of-memory on a shared GPU is "could not run" (not_run, exit 2), naming who held it."""
    def one(p: dict[str, Any]) -> str:
        mib = p.get("memory_mib")
        held = f"{mib / 1024:.1f} GiB" if isinstance(mib, (int, float)) else "memory"
        name = f" ({p['name']})" if p.get("name") else ""
        if p.get("pid") is None:  # not listed (a sandboxed Worker sees no other process): the amount only
            return f"{p.get('name') or 'other processes'} {held}"
        return f"pid {p.get('pid')}{name} {held}"

    names = ", ".join(one(p) for p in processes[:6]) + (f" and {len(processes) - 6} more" if len(processes) > 6 else "")
    text = f"{GPU_MEMORY_HELD} ({names})"
    text += ("; retried once after it freed, and ran out again while they held it" if retried
             else f"; it did not free within {waited_s:.0f} s")
    return text + ": could not run here now, not a verdict on the candidate (run it again when the GPU is free)"


def no_toolkit_reason(torch_version: str, torch_cuda: str | None) -> str:
    """Why a CUDA candidate could not be built here (not_run, exit 2), and how to get a toolkit."""
    if not torch_cuda:
        return (f"{NO_CUDA_TOOLKIT}: torch {torch_version} is a CPU-only build, which cannot build CUDA "
                "extensions; install a CUDA build of torch (https://pytorch.org/get-started/locally/) and "
                "the CUDA toolkit, or run on a GPU machine that has both; nothing here is wrong with the kernel")
    return (f"{NO_CUDA_TOOLKIT}: no CUDA toolkit (nvcc) in $CUDA_HOME/bin, PATH or /usr/local/cuda/bin; install "
            f"the CUDA toolkit {torch_cuda} that torch {torch_version} was built with "
            "(https://developer.nvidia.com/cuda-downloads, or `conda install -c nvidia cuda-toolkit`) and set "
            "CUDA_HOME to it; nothing here is wrong with the kernel")

# Search.outcome values and their exit codes.
OUTCOMES = ("improved", "no_improvement", "cannot_run", "cancelled", "failed")
EXIT_CODES = {"improved": 0, "no_improvement": 1, "cannot_run": 2, "failed": 1, "cancelled": 130}


class CannotRun(Exception):
    """Nothing could run: exit 2 on the command line, a plain message in the editor."""

    kind = "cannot_run"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NoModelConfigured(CannotRun):
    """The LLM proposer was asked for without a model (never a default at a public endpoint)."""

    kind = "no_model"

    def __init__(self, reason: str = NO_MODEL) -> None:
        super().__init__(reason)


class EndpointUnreachable(CannotRun):
    """The model endpoint did not answer (connection refused, DNS, timeout)."""

    kind = "endpoint_unreachable"


class NoGPU(CannotRun):
    kind = "no_gpu"

    def __init__(self, reason: str = NO_GPU) -> None:
        super().__init__(reason)


def exit_code(outcome: str) -> int:
    return EXIT_CODES.get(outcome, 1)


def label(custom_kernel: bool | None) -> str | None:
    if custom_kernel is None:
        return None
    return CUSTOM_KERNEL if custom_kernel else PYTORCH_REWRITE


def is_noisy(spread_pct: float | None) -> bool:
    return spread_pct is not None and spread_pct == spread_pct and spread_pct > NOISY_SPREAD_PCT


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _eval_doc(ev: Evaluation | dict[str, Any]) -> dict[str, Any]:
    """The fields used here from either an Evaluation, its to_dict() or its summary()."""
    if isinstance(ev, Evaluation):
        return ev.summary()
    if "time_ms" in ev or "speedup_eager" in ev:  # summary()
        return ev
    e = Evaluation.from_dict(ev)
    return e.summary()


def speed_phrase(speedup_eager: float | None, speedup_compile: float | None,
                 spread_pct: float | None, what: str = "") -> str:
    """'2.10x eager, 0.61x torch.compile (spread 3.2 %)', with the noise warning when due."""
    parts = []
    if speedup_eager is not None:
        parts.append(f"{_x(speedup_eager)} eager")
    if speedup_compile is not None:
        parts.append(f"{_x(speedup_compile)} torch.compile")
    text = ", ".join(parts) or "not compared with a baseline"
    if what:
        text = f"{what}: {text}"
    if spread_pct is not None and spread_pct == spread_pct:
        if is_noisy(spread_pct):
            text += (f" (spread {spread_pct:.1f} % is above {NOISY_SPREAD_PCT:.0f} %: noisy, "
                     "not a reliable number)")
        else:
            text += f" (spread {spread_pct:.1f} %)"
    return text


def compile_advice(speedup_compile: float | None) -> str | None:
    """The plain sentence when torch.compile beats the result, else None."""
    if speedup_compile is None or speedup_compile >= 1.0:
        return None
    return (f"torch.compile of the reference is faster ({1 / speedup_compile:.2f}x this result's speed): "
            "try torch.compile(model) first")


def shared_phrase(shared: dict[str, Any] | None) -> str | None:
    if not shared:
        return None
    n = shared.get("count") or len(shared.get("processes") or []) or 1
    text = f"timed on a shared GPU ({n} other process{'es' if n != 1 else ''} used it)"
    spread = shared.get("spread_pct")
    if spread is not None:
        text += f"; spread {spread:.1f} %"
    return text


def times_phrase(ratio: float) -> str:
    """'3.1x', '0.09x', '1838x', '5.3e+05x': how many times the reference's own error."""
    if ratio != ratio:
        return "?"
    if ratio >= 1e4:
        return f"{ratio:.1e}x"
    if ratio >= 10:
        return f"{ratio:.0f}x"
    return f"{ratio:.2g}x"


def accuracy_phrase(acc: dict[str, Any] | None) -> str | None:
    """Evaluation.accuracy in words: "3.1x PyTorch's error against float64 (correct up to 100x)";
    None when nothing was measured."""
    if not acc:
        return None
    ratio = acc.get("ratio")
    rule = acc.get("rule")
    if not isinstance(ratio, (int, float)):
        return acc.get("rule_text") or None
    text = f"{times_phrase(float(ratio))} PyTorch's error against float64"
    where = []
    if acc.get("output") not in (None, "output"):
        where.append(str(acc["output"]))
    if acc.get("mode") == "train":
        where.append("training mode")
    if where:
        text += f" (worst: {', '.join(where)})"
    limit = acc.get("ratio_correct")
    weak = weak_reference_phrase(acc)
    if weak and rule == "oracle":
        text += f"; {weak}"
    if rule == "oracle":
        outcome = acc.get("outcome")
        if outcome == "less_accurate":
            text += f"; beyond the {limit:g}x budget: less accurate" if limit else "; less accurate"
        elif outcome == "mismatch":
            text += "; beyond the budget and the loose bound"
        elif limit:
            text += f" (correct up to {limit:g}x)"
    elif acc.get("rule_text"):
        text += f"; {acc['rule_text']}"
    return text


# Speed of light (docs/speed-of-light.md). A custom kernel below this fraction of its floor (the
# bytes it must move at the GPU's bandwidth, or its own FLOPs at peak when known) gets a hint-level
# "far from the hardware" diagnostic. Fractions of the bytes floor (4.8 TB/s) the recorded H200
# times reach (benchmarks/results/speed_of_light.md; `python benchmarks/speed_of_light_table.py`):
#   matmul .cu 0.3-0.5 %    compute-bound (reference FLOP floor 3.3x its bytes floor) and its own
#                           FLOPs unknown: no hint, the bytes floor would mislead
#   bias_gelu default 8.8 % a slow kernel (one element per thread): 6x slower than its tuned variant
#   elementwise .cu 35-42 %, softmax 37-72 %, layernorm 51-70 %, scaled_add 52 %, row_max 57 %,
#   reduce_sum 61-62 %, bias_gelu tuned 48-54 %
# 20 % fires on the slow bias_gelu (2.3x below) and on nothing tuned (the closest, elu, is 1.7x above).
# The 34 public KernelBench solutions of benchmarks/corpus/, benched on an H100 (3.35 TB/s;
# benchmarks/results/first_bench_corpus.md, second table of speed_of_light.md):
#   custom kernels: l1_p37 18.8-19.7 % (slower than PyTorch's rewrites at 22-27 %), l1_p7 12.4 %,
#   l1_p36 10.1 %, l1_p6 1.5 %, l1_p34 0.9 %: hint; GEMMs 0.3-0.8 % (compute-bound): none;
#   8 launch-overhead-sized: none; 12 PyTorch rewrites 0-27 %: none.
FAR_FROM_HARDWARE = 0.20


def speed_of_light(ev: Evaluation | dict[str, Any]) -> dict[str, Any] | None:
    """Evaluation.evidence["speed_of_light"] (from a record, its to_dict() or its summary())."""
    evidence = _get(ev, "evidence") or {}
    sol = evidence.get("speed_of_light") if isinstance(evidence, dict) else None
    return sol if isinstance(sol, dict) else None


def far_from_hardware(ev: Evaluation | dict[str, Any]) -> str | None:
    """The hint's text when a correct custom kernel is below FAR_FROM_HARDWARE of its floor; None
    otherwise: never at the floor, never for a launch-overhead-sized Task (its label says so), and
    never where the reference's arithmetic may bind and the kernel's own FLOPs are unknown."""
    sol = speed_of_light(ev)
    if sol is None or _get(ev, "verdict") != "correct" or _get(ev, "custom_kernel") is not True:
        return None
    fraction = sol.get("fraction")
    if not isinstance(fraction, (int, float)) or fraction >= FAR_FROM_HARDWARE or sol.get("launch_overhead_sized"):
        return None
    ref_ms, bytes_ms = sol.get("reference_flop_floor_ms"), sol.get("bytes_floor_ms")
    flags = _get(ev, "flags") or ()
    if sol.get("flop_floor_ms") is None and isinstance(ref_ms, (int, float)) and isinstance(bytes_ms, (int, float)) \
            and ref_ms > bytes_ms and "algebraic_shortcut" not in flags:
        return None  # likely compute-bound, and its own FLOPs are unknown: the bytes floor would mislead
    return (f"far from the hardware: {sol.get('label')} (hint below {FAR_FROM_HARDWARE:.0%}: the time to move "
            "its bytes once is the floor no kernel beats)")


def shortcut_words(n_sets: int | None) -> str:
    """The algebraic shortcut's label: verify writes it into the message, shortcut_phrase reads the
    count back from there."""
    n = f" {n_sets}" if n_sets is not None else ""
    return f"does less arithmetic than the reference: an algebraic shortcut, checked on{n} fresh input sets"


def shortcut_phrase(ev: Evaluation | dict[str, Any]) -> str | None:
    if "algebraic_shortcut" not in (_get(ev, "flags") or ()):
        return None
    found = re.search(r"checked on (\d+) fresh input sets", _get(ev, "message") or "")
    return shortcut_words(int(found.group(1)) if found else None)


def weak_reference_phrase(acc: dict[str, Any] | None) -> str | None:
    weak = (acc or {}).get("weak_reference")
    return weak.get("text") if isinstance(weak, dict) else None


def train_difference(acc: dict[str, Any] | None) -> str | None:
    """Where training mode went wrong (eval_only): "output[3, 7]: 1.3e+06x PyTorch's error ..."."""
    ev = (acc or {}).get("train_evidence")
    if not isinstance(ev, dict):
        return None
    where = ev.get("where")
    at = f"{ev.get('output', 'output')}{list(where) if where else ''}"
    if isinstance(ev.get("ratio"), (int, float)):
        return (f"{at}: {times_phrase(float(ev['ratio']))} PyTorch's error against float64 (got {ev.get('got')}, "
                f"float64 {ev.get('oracle')})")
    if "got" in ev:
        return f"{at}: got {ev.get('got')}, expected {ev.get('expected')}"
    return None


def evaluation_reason(ev: Evaluation | dict[str, Any], kernels_only: bool = False,
                      accept_less_accurate: bool = False) -> str:
    """One sentence: what happened to this candidate and what its numbers are. `kernels_only`:
    a PyTorch rewrite is not counted (the `kernels_only` setting); `accept_less_accurate`: a
    `less_accurate` candidate is (the setting of that name)."""
    d = _eval_doc(ev)
    verdict = d.get("verdict") or "not_run"
    message = (d.get("message") or "").strip()
    if verdict == "not_run":
        return message or "nothing ran"
    if verdict != "correct":
        return f"{verdict.replace('_', ' ')}: {message}" if message else verdict.replace("_", " ")
    parts = [message or "correct"]
    kind = d.get("label") or label(d.get("custom_kernel"))
    if kind:
        parts.append(kind)
    bad = disqualified_by(d.get("flags") or (), accept_less_accurate)
    if kernels_only and d.get("custom_kernel") is False:
        bad.append("kernels_only: a PyTorch rewrite")
    if bad:
        parts.append("not counted (" + ", ".join(bad) + ")")
    if (not bad or bad == ["less_accurate"]) and d.get("time_ms") is not None:
        # A less accurate candidate's speed is shown beside its accuracy, never counted by default.
        parts.append(speed_phrase(d.get("speedup_eager"), d.get("speedup_compile"), d.get("spread_pct")))
        advice = compile_advice(d.get("speedup_compile"))
        if advice:
            parts.append(advice)
    accuracy = accuracy_phrase(d.get("accuracy"))
    if accuracy and ACCURACY_FLAGS.intersection(d.get("flags") or ()):
        parts.append(accuracy)
    sol = speed_of_light(d)
    if sol is not None and sol.get("label") and d.get("time_ms") is not None:
        parts.append(str(sol["label"]))
    shared = shared_phrase(d.get("shared_gpu"))
    if shared:
        parts.append(shared)
    return "; ".join(p for p in parts if p)


def search_reason(result: Any) -> str:
    """The headline of a Search (a SearchResult or its to_dict()): what it found, and why."""
    outcome = _get(result, "outcome") or ("improved" if _get(result, "improved") else "no_improvement")
    reason = _get(result, "reason") or ""
    if outcome == "cannot_run":
        return f"could not run: {reason}" if reason else "could not run"
    if outcome == "cancelled":
        return "cancelled; everything evaluated is in the store"
    if outcome == "failed":
        return f"the Search failed: {reason}"
    if outcome != "improved":
        return f"no improvement: {reason}" if reason else "no improvement"
    speedup = _get(result, "speedup")
    head = f"improved {_x(speedup)} over the start"
    measurement = _get(result, "measurement")
    if measurement:
        head += f" ({measurement})"
    kind = _get(result, "label")
    if kind:
        head += f", {kind}"
    parts = [head, speed_phrase(_get(result, "speedup_eager"), _get(result, "speedup_compile"),
                                _get(result, "spread_pct"), what="against the reference")]
    advice = compile_advice(_get(result, "speedup_compile"))
    if advice:
        parts.append(advice)
    shared = shared_phrase(_get(result, "shared_gpu"))
    if shared:
        parts.append(shared)
    return "; ".join(parts)


__all__ = [
    "NO_GPU", "NO_GPU_TASK", "NO_MODEL", "ALL_SLOWER", "NO_CUDA_TOOLKIT", "no_toolkit_reason",
    "GPU_MEMORY_HELD", "shared_oom_reason", "OUTCOMES", "EXIT_CODES", "CannotRun",
    "NoModelConfigured", "EndpointUnreachable", "NoGPU", "exit_code", "label", "is_noisy",
    "speed_phrase", "compile_advice", "shared_phrase", "evaluation_reason", "search_reason",
    "times_phrase", "accuracy_phrase", "FAR_FROM_HARDWARE", "speed_of_light", "far_from_hardware",
    "shortcut_phrase", "shortcut_words", "weak_reference_phrase", "train_difference",
    "CUSTOM_KERNEL", "PYTORCH_REWRITE", "NOISY_SPREAD_PCT",
]
