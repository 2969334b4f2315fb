"""How far an output is from the float64 oracle, and what the accuracy budget accepts.

The measure (docs/correctness.md): for one output, each element's error against the oracle is
divided by the larger of the element's own magnitude and the output's mean magnitude (so an
element near zero, made by cancellation, is judged on the output's scale, and a small entry of a
softmax on its own); the output's error is the largest such value. The same measure is taken of
the reference at its own dtype (fp32, fp16, bf16) against the oracle: that is the yardstick,
never taken below one rounding unit (`eps` of the output dtype), since an exact reference (a
ReLU, a max) would otherwise leave no room for a correct kernel that rounds once.

    ratio    = candidate error / yardstick
    correct        ratio <= RATIO_CORRECT
    less_accurate  RATIO_CORRECT < ratio <= RATIO_LESS_ACCURATE and within LOOSE_TOL elementwise
    mismatch       otherwise

The constants were chosen from the known-answer suite (benchmarks/accuracy_suite/, measured in
benchmarks/results/verify_accuracy_cpu.md and verify_accuracy.md): see the comments beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# A candidate up to 100x the reference's own error is correct. Measured on the CPU suite:
# split-K, tree and Kahan reductions, a two-pass fused LayerNorm, algebraic rewrites and fp16 /
# bf16 kernels that accumulate in fp32 land at 0.5-1.5x; an in-order fp32 sum of 131,072 terms
# at 6x (47x on an H200 against cuBLAS, issue 20). Above the line: a one-pass variance on rows
# whose mean is 200x their spread (230x), a tanh GELU for erf (1,840x).
RATIO_CORRECT = 100.0
# Up to 10,000x (and within LOOSE_TOL) is `less_accurate`: still correct, flagged, not counted
# by default. Measured beyond it: a KL divergence off by 0.64 % (54,000x), a softmax twice wrong
# on small entries (530,000x). The tanh GELU (1,840x) sits 5x below the line, the KL 5x above.
RATIO_LESS_ACCURATE = 1e4
# KernelBench's older fixed tolerance (atol = rtol = 1e-2): nothing beyond it is ever accepted,
# whatever the ratio (an output the reference itself gets badly wrong).
LOOSE_TOL = 1e-2

RULE = (f"error <= {RATIO_CORRECT:g}x the reference's own error against float64 (at least one "
        f"rounding unit of the output): correct; up to {RATIO_LESS_ACCURATE:g}x and within "
        f"{LOOSE_TOL:g}: less_accurate; beyond: mismatch")


@dataclass
class Measure:
    """One output on one input set: errors in the unit described in the module's docstring."""

    output: str
    dtype: str
    cand_err: float          # the candidate's error (relative, see above)
    ref_err: float           # the reference's own error, same unit
    yardstick: float         # max(ref_err, eps(dtype))
    ratio: float             # cand_err / yardstick
    budget: float            # RATIO_CORRECT * yardstick
    max_abs_err: float       # the candidate's largest absolute error against the oracle
    ref_max_abs_err: float
    scale: float             # the oracle's mean magnitude
    loose_ok: bool           # every element within LOOSE_TOL (atol = rtol) of the oracle
    outcome: str             # correct | less_accurate | mismatch
    where: list[int]         # the worst element
    got: Any
    expected: Any            # the reference's value there
    oracle: Any              # the float64 value there
    beyond: int              # elements over the budget
    numel: int
    input_set: int = 0


def eps(dtype: torch.dtype) -> float:
    if dtype.is_complex:
        dtype = torch.float32 if dtype == torch.complex64 else torch.float64
    return float(torch.finfo(dtype).eps)


def _num(x: Any) -> Any:
    if isinstance(x, complex):
        return [x.real, x.imag]
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return str(x)
    return x


def _f64(t: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    complex_ = t.is_complex() or (like is not None and like.is_complex())
    return t.detach().to(torch.complex128 if complex_ else torch.float64)


def measure(out: torch.Tensor, expected: torch.Tensor, oracle: torch.Tensor, name: str = "output",
            input_set: int = 0) -> Measure:
    """The candidate's output, the reference's (its own dtype) and the oracle's, for one output.
    Non-finite values are judged elsewhere (verify's nan / unwritten checks) and ignored here."""
    o64 = _f64(oracle)
    mag = o64.abs()
    scale = float(mag.mean()) if mag.numel() else 0.0
    floor = mag.clamp_min(max(scale, torch.finfo(torch.float64).tiny))
    absdiff = torch.nan_to_num_((_f64(out, o64) - o64).abs_(), nan=0.0, posinf=0.0, neginf=0.0)
    ref_abs = torch.nan_to_num_((_f64(expected, o64) - o64).abs_(), nan=0.0, posinf=0.0, neginf=0.0)
    n = absdiff.numel()
    ref_max_abs = float(ref_abs.max()) if n else 0.0
    cand_rel = absdiff / floor
    cand_err = float(cand_rel.max()) if n else 0.0
    ref_err = float(ref_abs.div_(floor).max()) if n else 0.0
    yard = max(ref_err, eps(expected.dtype))
    ratio = cand_err / yard
    budget = RATIO_CORRECT * yard
    loose_ok = bool((absdiff <= mag.mul_(LOOSE_TOL).add_(LOOSE_TOL)).all()) if n else True
    if ratio <= RATIO_CORRECT:
        outcome = "correct"
    elif ratio <= RATIO_LESS_ACCURATE and loose_ok:
        outcome = "less_accurate"
    else:
        outcome = "mismatch"
    flat = int(torch.argmax(cand_rel.reshape(-1))) if n else 0
    where = ([int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(out.shape))]
             if out.dim() and n else [])
    return Measure(
        output=name, dtype=str(expected.dtype).replace("torch.", ""), cand_err=cand_err, ref_err=ref_err,
        yardstick=yard, ratio=ratio, budget=budget,
        max_abs_err=float(absdiff.max()) if n else 0.0, ref_max_abs_err=ref_max_abs,
        scale=scale, loose_ok=loose_ok, outcome=outcome, where=where,
        got=_num(out.reshape(-1)[flat].item()) if n else None,
        expected=_num(expected.reshape(-1)[flat].item()) if n else None,
        oracle=_num(o64.reshape(-1)[flat].item()) if n else None,
        beyond=int((cand_rel > budget).sum()) if n else 0, numel=int(n), input_set=input_set)


_ORDER = {"correct": 0, "less_accurate": 1, "mismatch": 2}


def worse(a: Measure | None, b: Measure) -> Measure:
    """The worse of two measures of the same output: by outcome, then by ratio."""
    if a is None:
        return b
    return b if (_ORDER[b.outcome], b.ratio) > (_ORDER[a.outcome], a.ratio) else a
