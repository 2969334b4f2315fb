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
from typing import Any, Iterator

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
    weak_reference: bool = False   # judged on float64 alone: the reference is numerically weak


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


# Elements per chunk of a measure: float64 temporaries of 256 MiB each, so measuring a
# several-GiB output never needs more than about a GiB beside it on the GPU. On the host,
# HOST_CHUNK: 16 MiB temporaries, below glibc's 32 MiB mmap ceiling, so the heap reuses them;
# each 256 MiB one is fresh pages faulted in (a 100 M-element measure on 2 cores: 2.3 s
# against 4.5 s; benchmarks/measure_chunks.py, results/measure_chunks.md).
CHUNK = 1 << 25
HOST_CHUNK = 1 << 21


def chunk_size(dev: torch.device) -> int:
    """Elements per chunk of arithmetic on `dev` (CHUNK on an accelerator, HOST_CHUNK on the CPU)."""
    return HOST_CHUNK if dev.type == "cpu" else CHUNK


def compute_device(*tensors: torch.Tensor) -> torch.device:
    """Where chunked arithmetic over `tensors` runs: the first one's accelerator, if any sits
    on one (the largest Tasks keep expected outputs, and may keep the oracle, in host memory)."""
    for t in tensors:
        if t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


def chunks(dev: torch.device, *flat: torch.Tensor) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """(start, each flat tensor's chunk moved to `dev`) over 1-D tensors of one length,
    chunk_size(dev) elements at a time: the walk every by-chunk comparison of the judge takes."""
    c = chunk_size(dev)
    for a in range(0, flat[0].numel(), c):
        yield a, [t[a:a + c].to(dev) for t in flat]


def gap_limit(dtype: torch.dtype) -> float:
    """The reference's own error beyond which rounding does not explain it: a reference this far
    from float64 is random, dtype-dependent or numerically weak (verify's Judge decides which)."""
    return max(LOOSE_TOL, 8 * eps(dtype))


# A numerically weak reference (deterministic, yet farther from float64 than rounding explains)
# is no yardstick: the candidate is judged on float64 itself. Correct within KernelBench's own
# tolerance of the dtype, against float64 (fp32 1e-4, fp16 / bf16 1e-2), or when it matches the
# weak reference's own rounding (verify checks that); less_accurate within LOOSE_TOL.
WEAK_TOL = {torch.float64: 1e-7, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def weak_tol(dtype: torch.dtype) -> float:
    if dtype.is_complex:
        dtype = torch.float32 if dtype == torch.complex64 else torch.float64
    return WEAK_TOL.get(dtype, LOOSE_TOL)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1)


def measure(out: torch.Tensor, expected: torch.Tensor, oracle: torch.Tensor, name: str = "output",
            input_set: int = 0, weak: bool = False) -> Measure:
    """The candidate's output, the reference's (its own dtype) and the oracle's, for one output.
    Non-finite values are judged elsewhere (verify's nan / unwritten checks) and ignored here.
    The three may sit on different devices (the oracle on the host for the largest Tasks): the
    chunks are measured on the GPU when any of them is there (on the host when even a chunk
    does not fit).
    `weak`: the reference is numerically weak (see WEAK_TOL), where its own error is beyond
    gap_limit."""
    of, ef, rf = _flat(out), _flat(expected), _flat(oracle)
    n = rf.numel()
    # Chunks are measured on the candidate's GPU even when the oracle sits on the host: float64
    # arithmetic over a 6 GiB softmax took tens of seconds on the host, a chunk's copy milliseconds.
    dev = compute_device(out, expected, oracle)
    try:
        scan = _Scan(of, ef, rf, dev)
    except torch.OutOfMemoryError:  # the GPU has not even a chunk's room: the host then
        dev = torch.device("cpu")
        scan = _Scan(of, ef, rf, dev)
    cand_err, ref_err, flat = scan.cand_err, scan.ref_err, scan.flat
    yard = max(ref_err, eps(expected.dtype))
    ratio = cand_err / yard
    is_weak = weak and ref_err > gap_limit(expected.dtype)
    budget = weak_tol(expected.dtype) if is_weak else RATIO_CORRECT * yard
    if is_weak:
        outcome = "correct" if cand_err <= budget else "less_accurate" if scan.loose_ok else "mismatch"
    elif ratio <= RATIO_CORRECT:
        outcome = "correct"
    elif ratio <= RATIO_LESS_ACCURATE and scan.loose_ok:
        outcome = "less_accurate"
    else:
        outcome = "mismatch"
    beyond = scan.beyond(budget) if cand_err > budget else 0
    where = ([int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(out.shape))]
             if out.dim() and n else [])
    return Measure(
        output=name, dtype=str(expected.dtype).replace("torch.", ""), cand_err=cand_err, ref_err=ref_err,
        yardstick=yard, ratio=ratio, budget=budget, max_abs_err=scan.max_abs, ref_max_abs_err=scan.ref_max_abs,
        scale=scan.scale, loose_ok=scan.loose_ok, outcome=outcome, where=where,
        got=_num(of[flat].item()) if n else None,
        expected=_num(ef[flat].item()) if n else None,
        oracle=_num(_f64(rf[flat]).item()) if n else None,
        beyond=beyond, numel=int(n), input_set=input_set, weak_reference=is_weak)


class _Scan:
    """One pass over an output by chunks on `dev`: the candidate's and the reference's worst
    error relative to the oracle (floored at its mean magnitude), where the candidate's is, and
    whether every element is within LOOSE_TOL."""

    def __init__(self, of: torch.Tensor, ef: torch.Tensor, rf: torch.Tensor, dev: torch.device) -> None:
        self.of, self.rf, self.dev, self.chunk = of, rf, dev, chunk_size(dev)
        n = rf.numel()
        # The mean magnitude where the oracle lives: a host oracle is not copied up twice for it.
        total = sum(float(_f64(r).abs().sum()) for _, (r,) in chunks(rf.device, rf))
        self.scale = total / n if n else 0.0
        self.tiny = max(self.scale, torch.finfo(torch.float64).tiny)
        self.cand_err = self.ref_err = self.max_abs = self.ref_max_abs = 0.0
        self.flat = 0
        self.loose_ok = True
        for a in range(0, n, self.chunk):
            o64, mag, floor, absdiff = self._parts(a)
            ref_abs = torch.nan_to_num_((_f64(ef[a:a + self.chunk].to(dev), o64) - o64).abs_(), nan=0.0,
                                        posinf=0.0, neginf=0.0)
            self.ref_max_abs = max(self.ref_max_abs, float(ref_abs.max()))
            self.ref_err = max(self.ref_err, float(ref_abs.div_(floor).max()))
            del ref_abs
            cand_rel = absdiff / floor
            k = int(torch.argmax(cand_rel))
            if float(cand_rel[k]) > self.cand_err or a == 0:
                self.cand_err, self.flat = float(cand_rel[k]), a + k
            self.max_abs = max(self.max_abs, float(absdiff.max()))
            self.loose_ok = self.loose_ok and bool((absdiff <= mag.mul_(LOOSE_TOL).add_(LOOSE_TOL)).all())
            del o64, mag, floor, absdiff, cand_rel

    def _parts(self, a: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.chunk
        o64 = _f64(self.rf[a:a + c].to(self.dev))
        mag = o64.abs()
        floor = mag.clamp_min(self.tiny)
        absdiff = torch.nan_to_num_((_f64(self.of[a:a + c].to(self.dev), o64) - o64).abs_(), nan=0.0,
                                    posinf=0.0, neginf=0.0)
        return o64, mag, floor, absdiff

    def beyond(self, budget: float) -> int:
        """Elements whose error relative to the oracle is beyond `budget`."""
        try:
            return self._count_beyond(budget)
        except torch.OutOfMemoryError:
            self.dev, self.chunk = torch.device("cpu"), HOST_CHUNK
            return self._count_beyond(budget)

    def _count_beyond(self, budget: float) -> int:
        count = 0
        for a in range(0, self.rf.numel(), self.chunk):
            _, _, floor, absdiff = self._parts(a)
            count += int((absdiff / floor > budget).sum())
        return count


_ORDER = {"correct": 0, "less_accurate": 1, "mismatch": 2}


def worse(a: Measure | None, b: Measure) -> Measure:
    """The worse of two measures of the same output: by outcome, then by ratio."""
    if a is None:
        return b
    return b if (_ORDER[b.outcome], b.ratio) > (_ORDER[a.outcome], a.ratio) else a
