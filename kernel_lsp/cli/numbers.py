"""How the command line writes a measured number: with its spread, against both baselines,
and with the kind of result it is. One place, so bench, optimize and the report agree."""

from __future__ import annotations

import re
from typing import Any

from kernel_lsp.cli.exits import SPREAD_WARN_PCT

from kernel_lsp.model import CUSTOM_KERNEL as KERNEL_LABEL, PYTORCH_REWRITE as REWRITE_LABEL  # noqa: E402

# Flags that make a correct candidate's number meaningless (a cheat or a measurement it
# cannot be credited with). torch_fallback is not among them: a PyTorch rewrite is a real
# result, labelled as such.
from kernel_lsp.model import DISQUALIFYING_FLAGS as PROBLEM_FLAGS  # noqa: E402


def spread_of(timing: Any) -> float | None:
    """The interquartile spread (percent) of a Timing or its dict form."""
    if timing is None:
        return None
    value = timing.get("spread_pct") if isinstance(timing, dict) else getattr(timing, "spread_pct", None)
    return float(value) if isinstance(value, (int, float)) else None


def ratio_spread(*timings: Any) -> float | None:
    """A ratio of two medians is as uncertain as the noisier of them."""
    spreads = [s for s in (spread_of(t) for t in timings) if s is not None]
    return max(spreads) if spreads else None


def noisy(spread: float | None) -> bool:
    return spread is not None and spread > SPREAD_WARN_PCT


def speedup_text(x: float | None, spread: float | None, against: str = "", short: bool = False) -> str:
    """`1.84x eager ±2.1%`; above the spread threshold `~1.84x eager (spread 67%: not reliable)`
    (short, for a table cell: `~1.84x ±67%?`, with the warning printed below the table)."""
    if x is None:
        return "-"
    tail = f" {against}" if against else ""
    if spread is None:
        return f"{x:.2f}x{tail}"
    if noisy(spread):
        return f"~{x:.2f}x{tail} ±{spread:.0f}%?" if short else f"~{x:.2f}x{tail} (spread {spread:.0f}%: not reliable)"
    return f"{x:.2f}x{tail} ±{spread:.1f}%"


# What a Python candidate needs to hold a kernel of its own (CUDA through an extension,
# Triton, or a compiled library); without any, it is PyTorch code.
_KERNEL_MARKERS = re.compile(r"load_inline|cpp_extension|__global__|@triton\.jit|triton\.jit|ctypes\.CDLL|"
                             r"cdll\.LoadLibrary|cuda\.jit|tl\.load")


def has_kernel(source: str | None, kind: str | None = None) -> bool | None:
    """Whether a Candidate's text holds a kernel of its own (None: not known)."""
    if kind == "cuda":
        return True
    if source is None:
        return None
    return bool(_KERNEL_MARKERS.search(source))


def is_rewrite(flags: list[str] | tuple[str, ...] | None, custom_kernel: bool | None = None) -> bool:
    """A candidate whose speed comes from PyTorch ops rather than a kernel of its own."""
    if "torch_fallback" in (flags or ()):
        return True
    return custom_kernel is False


def label_for(flags: list[str] | tuple[str, ...] | None, custom_kernel: bool | None = None,
              label: str | None = None) -> str:
    if label:
        return label
    return REWRITE_LABEL if is_rewrite(flags, custom_kernel) else KERNEL_LABEL


def problem_flags(flags: list[str] | tuple[str, ...] | None) -> list[str]:
    return [f for f in (flags or ()) if f in PROBLEM_FLAGS]


def spread_warning(name: str, spread: float | None) -> str | None:
    if not noisy(spread):
        return None
    return (f"{name}: warning: the timing spread is {spread:.1f}% (above {SPREAD_WARN_PCT:.0f}%), so its "
            "speedups are not reliable; rerun when the machine is idle")
