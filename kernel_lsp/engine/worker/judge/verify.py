"""Is the Candidate correct? (the engine's rules and the cheats of docs/cheats.md.)

Order of work, each step aimed at a known cheat:

1. A warm-up set runs through the reference only (under a FLOP counter and an aten-op
   recorder): it teaches the output shapes (for poisoning), the FLOPs (for the roofline)
   and the compute ops the reference uses (for the fallback check). Its outputs stay alive.
2. For each of `input_sets` freshly seeded sets (never the timing sets): free memory is
   poisoned with NaN (the CUDA caching allocator's free blocks, filled byte 0xFF), and the
   candidate runs FIRST with `torch.use_deterministic_algorithms(warn_only)` +
   `fill_uninitialized_memory`, so every `torch.empty` it makes reads NaN (CPU and CUDA);
   the previous set's reference outputs are still alive, so no freed block holds the answer
   (Sakana's reuse exploit). Then: launch errors (device sync), output type (exactly
   `torch.Tensor`: no subclass / lazy object), shape, dtype, device, strides, inputs
   unchanged (compared with clones taken before), and values against the reference run
   AFTERWARDS on pristine clones.
3. Reference first, then candidate: the reference output is copied, freed, memory
   poisoned, and the candidate must still be right (the exploit's own order).
4. Stale results: the candidate is called again on the SAME tensor objects (same id and
   data_ptr) refilled in place with another set's values; it must follow the new values.
5. The candidate runs once more under an aten-op recorder: any compute op the reference
   uses (aten.mm, aten._softmax, ...) seen there is flagged `torch_fallback`.

Values are judged against a float64 run of the reference (worker/judge/oracle.py), within a budget
set by the reference's own error (worker/judge/accuracy.py, docs/correctness.md): `correct`, `correct`
with flag `less_accurate`, or `mismatch`. An explicit ATOL/RTOL (the Task's or the options') wins
and is a fixed tolerance against the reference, as is the fallback when float64 cannot run.
When the reference behaves differently in training mode (BatchNorm, ...: worker/judge/modes.py), two
input sets are verified in training mode too; correct in eval mode only is flag `eval_only`,
unless the Task declares `MODE = "eval"`.

NaN never passes where the reference is finite. Whether a NaN was written or never written
is decided by two fills the engine controls, never by what memory held before: the same
call is repeated with every `torch.empty` & co. filled with a finite sentinel (`SentinelFill`,
a dispatch mode: it sees the allocations of C++ extensions too); a NaN that turns finite
there came from the fill, so the candidate never wrote it (`unwritten_output`); one that stays
NaN is the candidate's own (`nan`). On CPU the allocator cannot be poisoned reliably, so the
deterministic fill is what makes `torch.empty` read NaN there.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernel_lsp.engine.worker.judge import accuracy, memory_plan, modes, recompute
from kernel_lsp.engine.worker import notify
from kernel_lsp.engine.worker.options import EngineOptions
from kernel_lsp.engine.worker.harness import Harness, InputSet, clone_inputs, flat_tensors, set_seed, tensor_bytes
from kernel_lsp.engine.worker.judge.oracle import Oracle
from kernel_lsp.verdicts import shortcut_words, times_phrase

# KernelBench's current defaults (eval.get_tolerance_for_precision, after torchbench):
# fp32 1e-4, fp16/bf16 1e-2, used as both atol and rtol. Nothing here is looser.
DEFAULT_TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-7,
    torch.float32: 1e-4,
    torch.complex64: 1e-4,
    torch.complex128: 1e-7,
    torch.float16: 1e-2,
    torch.bfloat16: 1e-2,
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        DEFAULT_TOLERANCE[getattr(torch, _name)] = 1.25e-1  # 3 mantissa bits: eps 0.125

# aten ops that only allocate, move or re-view data: using them is not a fallback.
MOVEMENT_OPS = frozenset(
    "aten." + n for n in (
        "empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like "
        "full full_like new_zeros new_ones new_full fill_ fill zero_ copy_ copy clone contiguous "
        "_to_copy to view _unsafe_view reshape _reshape_alias as_strided t transpose permute expand "
        "squeeze unsqueeze slice select detach alias lift_fresh lift_fresh_copy resize_ set_ split "
        "split_with_sizes chunk unbind narrow flatten unflatten view_as expand_as _local_scalar_dense "
        "item is_same_size sym_size sym_stride sym_numel sym_storage_offset arange numel stride size "
        "dim is_contiguous _has_compatible_shallow_copy_type record_stream equal randn rand randint "
        "normal_ uniform_ random_ bernoulli_ _pin_memory pin_memory is_pinned data_ptr"
    ).split()
)


# PyTorch ops that do a kernel's worth of work: beside a custom kernel they make the candidate
# a partial fallback (labelled a PyTorch rewrite, never a kernel speedup).
HEAVY_OPS = frozenset(
    "aten." + n for n in (
        "mm bmm addmm addmv addbmm baddbmm matmul mv dot linear einsum convolution _convolution "
        "cudnn_convolution conv1d conv2d conv3d conv_transpose2d _softmax _log_softmax softmax "
        "native_layer_norm layer_norm native_batch_norm _native_batch_norm_legit batch_norm "
        "native_group_norm group_norm sum mean var std cumsum amax amin max min prod norm "
        "_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention "
        "_scaled_dot_product_cudnn_attention scaled_dot_product_attention _fft_r2c _fft_c2c topk sort"
    ).split()
)


def _brings_kernel(h: Harness) -> bool:
    from kernel_lsp.engine.worker.judge import static_checks

    cand = h.candidate
    return cand is not None and (cand.kind == "cuda" or static_checks.has_kernel(cand.source))


@dataclass
class VerifyResult:
    verdict: str = "correct"
    message: str = ""
    evidence: dict[str, Any] | None = None
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reference_ops: list[str] = field(default_factory=list)
    fallback_ops: list[str] = field(default_factory=list)
    flops: int | None = None
    input_bytes: int = 0
    output_bytes: int = 0
    input_sets: int = 0
    accuracy: dict[str, Any] | None = None   # Evaluation.accuracy (Judge.report)
    # The bytes any correct implementation must move: the inputs and parameters the reference
    # reads (each read once) and its outputs (written once): the roofline's floor.
    read_bytes: int = 0
    candidate_flops: int | None = None      # the candidate's own FLOPs, when it is PyTorch code
    memory: dict[str, Any] | None = None    # where verify kept its data (worker/judge/memory_plan.py)

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"

    @property
    def sets_checked(self) -> int:
        """Every input set the candidate was checked on: the fresh ones, then the exploit's
        order and the stale-result check (steps 3 and 4)."""
        return self.input_sets + 2


class _Fail(Exception):
    """Stops verification with a verdict."""

    def __init__(self, verdict: str, message: str, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message
        self.evidence = evidence


# Movement ops that read their source's data (a copy): they count as reads for the floor.
_COPY_OPS = frozenset("aten." + n for n in "copy_ copy clone contiguous _to_copy to".split())


class OpRecorder(TorchDispatchMode):
    """Records every aten op that reaches the dispatcher, from Python or from C++ extensions.
    `reads`: also the bytes each storage's data is read by compute (and copy) ops: the largest
    view of it an op took (a lower bound of what the op touched)."""

    def __init__(self, reads: bool = False, work: bool = False) -> None:
        super().__init__()
        self.ops: set[str] = set()
        self.reads: dict[int, int] | None = {} if reads else None
        # `work`: one operation per element of every compute op torch's FLOP counter leaves out
        # (elementwise, reductions): with its count, how much arithmetic the code does.
        self.elementwise: int | None = 0 if work else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket)
        self.ops.add(name)
        if self.elementwise is not None and name not in MOVEMENT_OPS and func.overloadpacket not in _flop_registry():
            sizes = [t.numel() for t in flat_tensors(list(args) + list((kwargs or {}).values()))]
            self.elementwise += max(sizes, default=0)
        if self.reads is not None and (name not in MOVEMENT_OPS or name in _COPY_OPS):
            leaves = list(args[1:] if name == "aten.copy_" else args) + list((kwargs or {}).values())
            for t in flat_tensors(leaves):
                try:
                    key = t.untyped_storage().data_ptr()
                except Exception:  # a tensor without storage (meta, sparse): nothing read from memory
                    continue
                self.reads[key] = max(self.reads.get(key, 0), t.numel() * t.element_size())
        return func(*args, **(kwargs or {}))


def _flop_registry() -> Any:
    from torch.utils.flop_counter import flop_registry

    return flop_registry


def read_bytes(reads: dict[int, int], tensors: list[torch.Tensor]) -> int:
    """Bytes of `tensors` (inputs, parameters, buffers) the recorded ops read, each storage once."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        try:
            storage = t.untyped_storage()
            key = storage.data_ptr()
        except Exception:
            continue
        if key in seen or key not in reads:
            continue
        seen.add(key)
        total += min(reads[key], storage.nbytes())
    return total


def written_bytes(outputs: Any, inputs: list[torch.Tensor]) -> int:
    """Bytes of the outputs, without those that are views of an input (nothing written)."""
    held = set()
    for t in inputs:
        try:
            held.add(t.untyped_storage().data_ptr())
        except Exception:
            continue
    total = 0
    for t in flat_tensors(outputs):
        try:
            if t.untyped_storage().data_ptr() in held:
                continue
        except Exception:
            pass
        total += t.numel() * t.element_size()
    return total


def tolerance_for(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    base = DEFAULT_TOLERANCE.get(dtype, 0.0)  # integers and bool: exact
    return (base if atol is None else atol, base if rtol is None else rtol)


# -- poisoning ---------------------------------------------------------------------------------

def poison_free_memory(device: torch.device, sizes: list[int], pattern: int = 0xFF,
                       cap_bytes: int = 8 << 30) -> int:
    """Fill memory the allocator will hand out next with `pattern` (0xFF bytes read as NaN in
    every float format), then free it. Returns the bytes poisoned.

    CUDA: every free block of the caching allocator (from memory_snapshot) is allocated at its
    exact size (best fit returns that block), filled and freed, plus blocks of the expected
    output sizes. CPU: blocks of the expected output sizes only (glibc may or may not reuse them).
    """
    blocks: list[torch.Tensor] = []
    total = 0
    try:
        if device.type == "cuda":
            free_sizes: list[int] = []
            for seg in torch.cuda.memory_snapshot():
                if seg.get("device", device.index or 0) != (device.index or 0):
                    continue
                for blk in seg.get("blocks", []):
                    if blk.get("state") == "inactive":
                        free_sizes.append(int(blk["size"]))
            for nbytes in sorted(free_sizes, reverse=True) + sizes * 2:
                if nbytes <= 0 or total + nbytes > cap_bytes:
                    continue
                blocks.append(torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(pattern))
                total += nbytes
            torch.cuda.synchronize(device)
        else:
            for nbytes in sizes * 3:
                if nbytes > 0 and total + nbytes <= cap_bytes:
                    blocks.append(torch.empty(nbytes, dtype=torch.uint8).fill_(pattern))
                    total += nbytes
    except RuntimeError:  # out of memory while poisoning: what was filled still counts
        pass
    del blocks
    return total


@contextlib.contextmanager
def nan_fill(enabled: bool = True) -> Iterator[None]:
    """torch.empty & co. return NaN (floats) / max int while active (CPU and CUDA)."""
    if not enabled:
        yield
        return
    import torch.utils.deterministic as det

    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.use_deterministic_algorithms(True, warn_only=True)
        det.fill_uninitialized_memory = True
        try:
            yield
        finally:
            det.fill_uninitialized_memory = was_fill
            torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


# -- calling ------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    """Wait for all work on the device; a failed launch surfaces here as a verdict."""
    if device.type != "cuda":
        return
    try:
        torch.cuda.synchronize(device)
    except Exception as exc:  # sticky CUDA errors (illegal address) land here
        raise _Fail("error", f"CUDA error after the call: {exc}") from exc


def _mode_stacks_empty() -> bool:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return torch._C._len_torch_function_stack() == 0 and not _get_current_dispatch_mode_stack()


# The finite value `SentinelFill` writes into fresh tensors (representable in every float
# format down to fp8, and in every integer type).
SENTINEL = 42
_EMPTY_OPS = frozenset(("aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
                        "aten.new_empty_strided", "aten.empty_permuted"))


class SentinelFill(TorchDispatchMode):
    """Every tensor torch.empty & co. hand out (from Python or from a C++ extension) holds
    SENTINEL instead of whatever its memory held: a fill the engine controls."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if str(func.overloadpacket) in _EMPTY_OPS and isinstance(out, torch.Tensor) and out.numel():
            out.fill_(True if out.dtype == torch.bool else SENTINEL)
        return out


def call(fn: Callable[..., Any], inputs: list[Any], device: torch.device, who: str,
         fill: bool | str = False) -> Any:
    """fill: True (or "nan"): fresh tensors read NaN / max int; "sentinel": they read SENTINEL."""
    if not _mode_stacks_empty():
        raise _Fail("error", "a torch function/dispatch mode is active before the call: the harness was tampered with")
    try:
        with (SentinelFill() if fill == "sentinel" else nan_fill(bool(fill))):
            out = fn(*inputs)
    except _Fail:
        raise
    except Exception as exc:
        verdict = "oom" if isinstance(exc, torch.OutOfMemoryError) else "error"
        raise _Fail(verdict, f"the {who} raised {type(exc).__name__}: {_short(exc)}") from exc
    sync(device)
    if not _mode_stacks_empty():
        raise _Fail("error", f"the {who} left a torch function/dispatch mode active (tampering with comparisons)")
    return out


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return first[:limit]


# -- comparing ----------------------------------------------------------------------------------

def _leaves(value: Any, path: str = "output") -> list[tuple[str, Any]]:
    if isinstance(value, (list, tuple)):
        out: list[tuple[str, Any]] = []
        for i, v in enumerate(value):
            out += _leaves(v, f"{path}[{i}]")
        return out
    return [(path, value)]


def check_structure(out: Any, expected: Any, input_set: int, device: torch.device | None = None) -> None:
    """Output kinds, shapes, dtypes, devices: anything off is `bad_output`."""
    def bad(message: str, **ev: Any) -> _Fail:
        return _Fail("bad_output", message, {"input_set": input_set, **ev})

    if isinstance(expected, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(expected):
            raise bad(f"expected a {type(expected).__name__} of {len(expected)} outputs, got {type(out).__name__}"
                      + (f" of {len(out)}" if isinstance(out, (list, tuple)) else ""))
        for i, (o, e) in enumerate(zip(out, expected)):
            _check_leaf(o, e, f"output[{i}]", bad, device)
        return
    _check_leaf(out, expected, "output", bad, device)


def _check_leaf(o: Any, e: Any, name: str, bad: Callable[..., _Fail], device: torch.device | None = None) -> None:
    """`device`: where the outputs belong when `e` is a copy kept on the host (the largest Tasks)."""
    if isinstance(e, (list, tuple)):
        if not isinstance(o, (list, tuple)) or len(o) != len(e):
            raise bad(f"{name}: expected a sequence of {len(e)}", output=name)
        for i, (oo, ee) in enumerate(zip(o, e)):
            _check_leaf(oo, ee, f"{name}[{i}]", bad, device)
        return
    if not isinstance(e, torch.Tensor):
        if isinstance(o, torch.Tensor) or o != e:
            raise bad(f"{name}: expected {e!r}, got {type(o).__name__}", output=name)
        return
    # Exact type first, before touching it: a subclass may compute only when compared.
    if type(o) is not torch.Tensor:
        raise bad(f"{name} is a {type(o).__module__}.{type(o).__qualname__}, not a plain torch.Tensor "
                  "(subclasses and lazy objects are refused)", output=name, type=type(o).__qualname__)
    if tuple(o.shape) != tuple(e.shape):
        raise bad(f"{name} has shape {tuple(o.shape)}, expected {tuple(e.shape)}", output=name,
                  shape=list(o.shape), expected_shape=list(e.shape))
    if o.dtype != e.dtype:
        raise bad(f"{name} has dtype {o.dtype}, expected {e.dtype}", output=name,
                  dtype=str(o.dtype), expected_dtype=str(e.dtype))
    if device is not None and isinstance(e, torch.Tensor) and e.device.type == "cpu" and device.type != "cpu":
        if o.device.type != device.type or (device.index is not None and o.device.index != device.index):
            raise bad(f"{name} is on {o.device}, expected {device}", output=name)
    elif o.device != e.device:
        raise bad(f"{name} is on {o.device}, expected {e.device}", output=name)
    if o.is_sparse or o.layout != torch.strided:
        raise bad(f"{name} has layout {o.layout}, expected torch.strided", output=name)
    if any(s == 0 and n > 1 for s, n in zip(o.stride(), o.shape)) and not any(
            s == 0 and n > 1 for s, n in zip(e.stride(), e.shape)):
        raise bad(f"{name} is a broadcast view (stride 0): elements overlap", output=name,
                  stride=list(o.stride()))


def compare(out: Any, expected: Any, atol: float | None, rtol: float | None,
            input_set: int, first: bool = False) -> dict[str, Any] | None:
    """None when every tensor leaf matches; else evidence of the worst element (`first`: of the
    first chunk that differs, for a yes/no question on the largest outputs)."""
    outs = _leaves(out)
    exps = _leaves(expected)
    for (name, o), (_, e) in zip(outs, exps):
        if not isinstance(e, torch.Tensor):
            continue
        ev = compare_tensor(o, e, atol, rtol, first)
        if ev is not None:
            ev.update(output=name, input_set=input_set)
            return ev
    return None


def compare_tensor(o: torch.Tensor, e: torch.Tensor, atol: float | None,
                   rtol: float | None, first: bool = False) -> dict[str, Any] | None:
    """None when `o` matches `e`; else evidence. `o` and `e` may sit on different devices (the
    expected outputs of the largest Tasks are kept on the host); large ones go by chunks."""
    if o.device == e.device and e.numel() <= accuracy.CHUNK:
        return _compare_one(o, e, atol, rtol)
    if tuple(o.shape) != tuple(e.shape):
        return _compare_one(o.to(e.device), e, atol, rtol)
    of, ef = o.detach().reshape(-1), e.detach().reshape(-1)
    n = ef.numel()
    worst: dict[str, Any] | None = None
    mismatched = 0
    masks: list[tuple[int, torch.Tensor]] = []
    # Chunks are compared on the GPU when either side is there: float64 arithmetic over a
    # host-kept 6 GiB output costs tens of seconds on the CPU, a chunk's copy a few milliseconds.
    for a, (oc, ec) in accuracy.chunks(accuracy.compute_device(o, e), of, ef):
        ev = _compare_one(oc, ec, atol, rtol)
        if ev is None:
            continue
        mismatched += ev["mismatched"]
        if ev.get("nonfinite_mask") is not None and ev["nonfinite"]:
            masks.append((a, ev["nonfinite_mask"]))
        flat = a + ev["where"][0]
        ev["where"] = [int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(e.shape))] if e.dim() else []
        key = (ev["nonfinite"], ev["max_abs_err"] if ev["max_abs_err"] == ev["max_abs_err"] else float("inf"))
        if worst is None or key > (worst["nonfinite"], worst["_key"]):
            worst = {**ev, "_key": key[1]}
        if first:
            break
    if worst is None:
        return None
    worst.pop("_key")
    worst.update(mismatched=mismatched, numel=int(n))
    mask = None
    if masks:
        mask = torch.zeros(n, dtype=torch.bool, device=e.device)
        for a, m in masks:
            mask[a:a + m.numel()] = m
        mask = mask.reshape(e.shape)
    worst["nonfinite_mask"] = mask
    worst["nonfinite"] = bool(masks)
    return worst


def same_output(a: Any, b: Any, dev: torch.device, relative: bool, atol: float | None,
                rtol: float | None) -> bool:
    """`a` would pass for `b` (the weak-test question), computed by chunks on `dev`.

    `relative` (the float64 oracle decides the verdict): every element within LOOSE_TOL of `b`
    on `b`'s own scale (each element's magnitude, at least the output's mean magnitude). The
    oracle never accepts more than that, so a softmax over 393,216 columns (entries near 3e-6,
    all below the fixed atol of 1e-2) is not called weak, while a softmax over one column (every
    entry 1.0) is. Else the fixed tolerance (atol, rtol), which does accept such tiny outputs."""
    for (_, x), (_, y) in zip(_leaves(a), _leaves(b)):
        if not isinstance(y, torch.Tensor) or not isinstance(x, torch.Tensor) or x.shape != y.shape:
            if not (isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor)) and x == y:
                continue
            return False
        if not (y.is_floating_point() or y.is_complex()):
            if not torch.equal(x.to(dev), y.to(dev)):
                return False
            continue
        fx, fy = x.detach().reshape(-1), y.detach().reshape(-1)
        if relative:
            total = sum(float(_real64(cy).abs().nan_to_num_(0.0, 0.0, 0.0).sum())
                        for _, (cy,) in accuracy.chunks(dev, fy))
            floor = max(total / max(1, fy.numel()), torch.finfo(torch.float64).tiny)
        for _, (chx, chy) in accuracy.chunks(dev, fx, fy):
            cx, cy = _real64(chx), _real64(chy)
            if relative:
                ok = (cx - cy).abs() <= accuracy.LOOSE_TOL * cy.abs().clamp_min(floor)
            else:
                a_tol, r_tol = tolerance_for(y.dtype, atol, rtol)
                ok = (cx - cy).abs() <= a_tol + r_tol * cy.abs()
            if not bool((ok | (torch.isnan(cx) & torch.isnan(cy)) | (cx == cy)).all()):
                return False
    return True


def _real64(t: torch.Tensor) -> torch.Tensor:
    """float64 values of `t`; a complex one as its real and imaginary parts."""
    return (torch.view_as_real(t) if t.is_complex() else t).double()


def _compare_one(o: torch.Tensor, e: torch.Tensor, atol: float | None,
                 rtol: float | None) -> dict[str, Any] | None:
    a_tol, r_tol = tolerance_for(e.dtype, atol, rtol)
    if e.numel() == 0:
        return None
    if e.dtype == torch.bool or not (e.is_floating_point() or e.is_complex()):
        bad = o != e
        if not bool(bad.any()):
            return None
        diff = (o.double() - e.double()).abs() if e.dtype != torch.bool else bad.double()
        return _evidence(o, e, diff, bad, a_tol, r_tol, nan=False)
    a = o.detach().to(torch.complex128 if e.is_complex() else torch.float64)
    b = e.detach().to(a.dtype)
    a_nan, b_nan = torch.isnan(a), torch.isnan(b)
    if e.is_complex():
        a_nan, b_nan = a_nan | torch.isnan(a.imag), b_nan | torch.isnan(b.imag)
    diff = (a - b).abs()
    same_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    finite = torch.isfinite(a) & torch.isfinite(b)
    ok = ((diff <= a_tol + r_tol * b.abs()) & finite) | (a_nan & b_nan) | same_inf
    bad = ~ok
    if not bool(bad.any()):
        return None
    nan_bad = (a_nan & ~b_nan) | (torch.isinf(a) & ~same_inf)
    return _evidence(o, e, diff, bad, a_tol, r_tol, nan=bool(nan_bad.any()), nan_mask=nan_bad)


def _evidence(o: torch.Tensor, e: torch.Tensor, diff: torch.Tensor, bad: torch.Tensor,
              atol: float, rtol: float, nan: bool, nan_mask: torch.Tensor | None = None) -> dict[str, Any]:
    finite = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
    ref_abs = e.detach().abs().double() if not e.is_complex() else e.detach().abs().double()
    rel = finite / ref_abs.clamp_min(1e-12)
    # The worst element: a non-finite one if any, else the largest excess over tolerance.
    score = torch.where(bad, finite - (atol + rtol * ref_abs), torch.full_like(finite, -float("inf")))
    if nan and nan_mask is not None:
        score = torch.where(nan_mask, torch.full_like(score, float("inf")), score)
    flat = int(torch.argmax(score.reshape(-1)))
    where = [int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(e.shape))] if e.dim() else []
    got = o.reshape(-1)[flat].item()
    want = e.reshape(-1)[flat].item()
    return {
        "max_abs_err": float(finite[bad].max()) if bool((bad & torch.isfinite(diff)).any()) else float("nan"),
        "max_rel_err": float(rel[bad].max()) if bool((bad & torch.isfinite(diff)).any()) else float("nan"),
        "where": where,
        "got": _num(got),
        "expected": _num(want),
        "mismatched": int(bad.sum()),
        "numel": int(e.numel()),
        "atol": atol,
        "rtol": rtol,
        "nonfinite": bool(nan),
        "nonfinite_mask": nan_mask,  # dropped before leaving verify (not JSON)
    }


def _num(x: Any) -> Any:
    if isinstance(x, complex):
        return [x.real, x.imag]
    if isinstance(x, float) and x != x:
        return "nan"
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return x


def _clean(ev: dict[str, Any] | None) -> dict[str, Any] | None:
    if ev is None:
        return None
    return {k: v for k, v in ev.items() if k != "nonfinite_mask"}


def _changed(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements of `a` that differ from `b` (NaN equal to NaN), by chunks, across devices."""
    fa, fb = a.detach().reshape(-1), b.detach().reshape(-1)
    return sum(int((torch.nan_to_num(x) != torch.nan_to_num(y)).sum())
               for _, (x, y) in accuracy.chunks(accuracy.compute_device(a, b), fa, fb))


def _first_mutation(before: list[Any], after: list[Any]) -> dict[str, Any] | None:
    for i, (b, a) in enumerate(zip(before, after)):
        if isinstance(b, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.shape != b.shape:
                return {"input": i, "changed_elements": -1}
            changed = _changed(a, b)
            if changed:
                return {"input": i, "changed_elements": changed}
    return None


def _tensor_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_tensor_copy(v) for v in value)
    return value


# -- judging values: the float64 oracle and the accuracy budget -----------------------------------

def _oracle_sanity(dtype: torch.dtype) -> float:
    """The reference's own error beyond which rounding does not explain it: random ops, code that
    branches on dtype, or a numerically weak formula (the Judge runs it twice to tell)."""
    return accuracy.gap_limit(dtype)


# Two fp32 runs of the reference on the same input that differ by more than this share of its gap
# to float64 make it random (the gap is then noise, not a weakness): randn in the forward differs
# by the whole gap, a deterministic one-pass variance by nothing.
RANDOM_SHARE = 0.01


class Judge:
    """Decides whether one output is right: against the float64 oracle within the accuracy budget,
    or with a fixed tolerance against the reference (an explicit ATOL/RTOL, which wins and is said
    so; the `oracle` option off; float64 refused). Keeps the worst measure of every output."""

    def __init__(self, h: Harness, options: EngineOptions) -> None:
        self.h = h
        self.weak: dict[str, Any] | None = None   # the reference is numerically weak (judged on float64)
        self.atol = options.atol if options.atol is not None else h.task.atol
        self.rtol = options.rtol if options.rtol is not None else h.task.rtol
        self.oracle: Oracle | None = None
        self.why_fixed = ""
        # An explicit ATOL/RTOL decides; the oracle still runs, to show the accuracy.
        self.explicit = self.atol is not None or self.rtol is not None
        # The caller switched the oracle off: the fixed tolerance is what was asked for, no note.
        self.off_by_option = not self.explicit and not options.oracle
        if self.explicit:
            whose = "the options'" if options.atol is not None or options.rtol is not None else "the Task's"
            a_tol, r_tol = (self.atol if self.atol is not None else "default",
                            self.rtol if self.rtol is not None else "default")
            self.why_fixed = f"{whose} ATOL={a_tol}, RTOL={r_tol} decide (an explicit tolerance wins)"
        elif not options.oracle:
            self.why_fixed = "the float64 oracle is off (option oracle=false): fixed tolerance"
        if options.oracle and h.model is not None:
            try:
                self.oracle = Oracle(h, skip_ops=MOVEMENT_OPS)
            except Exception as exc:  # a Model that cannot be copied
                self.why_fixed = self.why_fixed or f"no float64 oracle ({type(exc).__name__}: {exc}); fixed tolerance"
        self.worst: dict[tuple[str, str], accuracy.Measure] = {}
        self.modes: dict[str, str] = {}
        self.train_evidence: dict[str, Any] | None = None  # where training mode went wrong (eval_only)

    @property
    def uses_oracle(self) -> bool:
        return not self.why_fixed and self.oracle is not None and self.oracle.refused is None

    def _refuse(self, why: str) -> None:
        if self.oracle is not None:
            self.oracle.refuse(why)
        if not self.why_fixed:
            self.why_fixed = f"{why}; fixed tolerance used"
            self.worst.clear()  # measures against an oracle that is not one

    def check(self, out: Any, expected: Any, inputs: list[Any], seed: int, input_set: int,
              mode: str = "eval") -> dict[str, Any] | None:
        """None when `out` is right; else the evidence of the first wrong output."""
        oracle_out = None
        if self.oracle is not None and (self.uses_oracle or self.explicit):
            oracle_out = self.oracle.outputs(seed, inputs, mode)
            if oracle_out is None and self.oracle.refused and not self.why_fixed:
                self._refuse(self.oracle.refused)
        if not self.uses_oracle:
            if oracle_out is not None:  # an explicit tolerance decides; accuracy is still shown
                self._measure_all(out, expected, oracle_out, input_set, mode, inputs)
            return compare(out, expected, self.atol, self.rtol, input_set)
        assert oracle_out is not None
        # NaN / Inf where the reference is finite, and integer outputs: checked as before (the
        # full comparison only when some output is not all finite or not floating).
        if not all(isinstance(o, torch.Tensor) and o.is_floating_point() and bool(torch.isfinite(o).all())
                   for _, o in _leaves(out)):
            ev = compare(out, expected, math.inf, 0.0, input_set)
            if ev is not None:
                return ev
        failed = self._measure_all(out, expected, oracle_out, input_set, mode, inputs)
        if not self.uses_oracle:  # refused on sight: the fixed tolerance decides after all
            return compare(out, expected, self.atol, self.rtol, input_set)
        if failed is None:
            return None
        return {"output": failed.output, "input_set": input_set, "mode": mode, "rule": "oracle",
                "where": failed.where, "got": failed.got, "expected": failed.expected, "oracle": failed.oracle,
                "max_abs_err": failed.max_abs_err, "ratio": failed.ratio, "cand_err": failed.cand_err,
                "ref_err": failed.ref_err, "budget": failed.budget, "within_loose": failed.loose_ok,
                "mismatched": failed.beyond, "numel": failed.numel, "nonfinite": False,
                "weak_reference": failed.weak_reference}

    def _measure_all(self, out: Any, expected: Any, oracle_out: Any, input_set: int,
                     mode: str, inputs: list[Any] | None = None) -> accuracy.Measure | None:
        first_bad = None
        leaves_o, leaves_e, leaves_r = _leaves(out), _leaves(expected), _leaves(oracle_out)
        if len(leaves_r) != len(leaves_e):
            self._refuse("the float64 run returned another structure than the reference")
            return None
        for (name, o), (_, e), (_, r) in zip(leaves_o, leaves_e, leaves_r):
            if not isinstance(e, torch.Tensor) or not (e.is_floating_point() or e.is_complex()):
                continue
            if not isinstance(r, torch.Tensor) or r.shape != e.shape or not isinstance(o, torch.Tensor):
                self._refuse(f"the float64 run's {name} does not match the reference's in shape")
                return None
            m = accuracy.measure(o, e, r, name, input_set, weak=self.weak is not None)
            if m.ref_err > _oracle_sanity(e.dtype) and self.weak is None:
                random = self._random(name, e, r, inputs, mode)
                if random is not None:
                    self._refuse(random)
                    return None
                self.weak = {"output": name, "ref_err": m.ref_err, "mode": mode,
                             "text": f"the reference itself is {m.ref_err:.2g} of scale off float64 on {name}: "
                                     "numerically weak; judged against float64"}
                m = accuracy.measure(o, e, r, name, input_set, weak=True)
            if m.weak_reference and m.outcome != "correct" and \
                    compare_tensor(o, e, self.atol, self.rtol) is None:
                m.outcome = "correct"  # it computes what the weak reference computes, rounding and all
            if m.weak_reference and self.weak is not None:
                self.weak["ref_err"] = max(self.weak["ref_err"], m.ref_err)
            key = (mode, name)
            self.worst[key] = accuracy.worse(self.worst.get(key), m)
            if m.outcome == "mismatch" and first_bad is None:
                first_bad = m
        return first_bad

    def _random(self, name: str, e: torch.Tensor, r: torch.Tensor, inputs: list[Any] | None,
                mode: str) -> str | None:
        """The reference is far from float64 on `name`: random, or deterministic and weak? The
        same input twice in fp32 (no reseed: random ops draw new numbers), and twice in float64
        under two seeds. Either pair differing: random (a reason to fall back); else None."""
        h = self.h
        gap = accuracy.measure(e, e, r).cand_err
        if inputs is None or h.model is None or self.oracle is None:
            return (f"the float64 run differs from the reference by {gap:.2g} of its scale on {name}, "
                    "and it could not be run twice to tell random from weak")
        states = modes.States(h.model)
        try:
            states.restore()
            again = call(h.model, _fresh(inputs, h.device), h.device, "reference")
        except _Fail as fail:
            return f"the reference could not run again ({fail.message})"
        finally:
            states.restore()
        leaf = dict(_leaves(again)).get(name)
        if not isinstance(leaf, torch.Tensor) or leaf.shape != e.shape:
            return f"the reference's {name} changes shape between two runs on the same input"
        fp32 = accuracy.measure(leaf, leaf, e).cand_err   # the two fp32 runs, on the first's scale
        del again, leaf
        if fp32 > RANDOM_SHARE * gap:
            return (f"the reference is random: two fp32 runs on the same input differ by {fp32:.2g} of its "
                    f"scale on {name} (its gap to float64 is {gap:.2g})")
        r2 = self.oracle.again(inputs, mode)
        leaf64 = dict(_leaves(r2)).get(name) if r2 is not None else None
        if isinstance(leaf64, torch.Tensor) and leaf64.shape == r.shape:
            f64 = accuracy.measure(leaf64, leaf64, r).cand_err
            if f64 > RANDOM_SHARE * gap:
                return (f"the reference is random: two float64 runs under two seeds differ by {f64:.2g} of "
                        f"its scale on {name}")
        return None

    def outcome(self) -> str:
        """The worst outcome over every output, set and mode measured against the oracle."""
        order = ("correct", "less_accurate", "mismatch")
        if not self.uses_oracle or not self.worst:
            return "correct"
        return max((m.outcome for m in self.worst.values()), key=order.index)

    def report(self) -> dict[str, Any]:
        """Evaluation.accuracy: the rule, the worst output (its errors, their ratio, the budget),
        every output's worst measure, the modes verified and what the oracle cost."""
        rule = "oracle" if self.uses_oracle else "task_tolerance" if self.explicit else "fixed_tolerance"
        out: dict[str, Any] = {"rule": rule, "rule_text": accuracy.RULE if rule == "oracle" else self.why_fixed,
                               "ratio_correct": accuracy.RATIO_CORRECT,
                               "ratio_less_accurate": accuracy.RATIO_LESS_ACCURATE, "loose_tol": accuracy.LOOSE_TOL}
        if rule != "oracle":
            a_tol, r_tol = tolerance_for(torch.float32, self.atol, self.rtol)
            out.update(atol=self.atol if self.atol is not None else "dtype default",
                       rtol=self.rtol if self.rtol is not None else "dtype default", fp32_atol=a_tol, fp32_rtol=r_tol)
        if self.worst:
            (mode, _), w = max(self.worst.items(), key=lambda kv: kv[1].ratio)
            out.update(outcome=self.outcome() if rule == "oracle" else None, output=w.output,
                       ratio=w.ratio, cand_err=w.cand_err, ref_err=w.ref_err, budget=w.budget,
                       max_abs_err=w.max_abs_err, ref_max_abs_err=w.ref_max_abs_err, mode=mode)
            out["outputs"] = [{"mode": k[0], **{f: getattr(v, f) for f in (
                "output", "dtype", "ratio", "cand_err", "ref_err", "budget", "max_abs_err", "ref_max_abs_err",
                "scale", "outcome", "where", "got", "expected", "oracle", "input_set", "weak_reference")},
                "within_loose": v.loose_ok} for k, v in self.worst.items()]
        if self.modes:
            out["modes"] = dict(self.modes)
        if self.oracle is not None:
            out["oracle"] = self.oracle.summary()
        if self.train_evidence is not None:
            out["train_evidence"] = self.train_evidence
        if self.weak is not None and rule == "oracle":
            out["weak_reference"] = dict(self.weak)
            out["rule_text"] = (f"{self.weak['text']}: correct within {accuracy.weak_tol(torch.float32):g} "
                                f"(fp32; {accuracy.LOOSE_TOL:g} fp16/bf16) of float64 or matching the reference's "
                                f"own rounding; less_accurate within {accuracy.LOOSE_TOL:g}")
        return out


# -- the procedure ------------------------------------------------------------------------------

def _precision_state() -> tuple[Any, ...]:
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(),
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)


def _set_precision(state: tuple[Any, ...]) -> None:
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = state[0], state[1]
    torch.set_float32_matmul_precision(state[2])
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = state[3]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = state[4]


# Full fp32 for reference and candidate while checking: cuDNN's default TF32 makes the
# reference itself off by ~1e-3, which fails exact kernels at KernelBench's 1e-4.
STRICT_PRECISION = (False, False, "highest", True, True)


def verify(h: Harness, options: EngineOptions | dict[str, Any]) -> VerifyResult:
    """Judge h.candidate_fn against h.model. Never raises for the candidate's faults."""
    res = VerifyResult()
    # Local to this call: its float64 model copy must not outlive verify (run.py keeps the
    # VerifyResult through the timing).
    judge: Judge | None = None
    saved = _precision_state()
    _set_precision(STRICT_PRECISION)
    try:
        opts = EngineOptions.of(options)
        with torch.no_grad():
            judge = Judge(h, opts)
            _verify(h, opts, judge, res)
    except _Fail as fail:
        res.verdict, res.message, res.evidence = fail.verdict, fail.message, _clean(fail.evidence)
    finally:
        if judge is not None:
            try:
                res.accuracy = judge.report()
            except Exception as exc:  # the report must never cost the verdict
                res.accuracy = {"rule": "unknown", "error": f"{type(exc).__name__}: {exc}"}
            if judge.why_fixed and not judge.off_by_option:
                res.notes.append(judge.why_fixed)
            if judge.oracle is not None and judge.oracle.moved:
                res.notes.append(judge.oracle.moved)
        if _precision_state() != STRICT_PRECISION:
            res.flags.append("precision_lowering")
            res.notes.append("the candidate switched on TF32 / reduced-precision math "
                             f"({_precision_state()[:3]})")
        _set_precision(saved)
    return res


def _fresh(values: list[Any], dev: torch.device) -> list[Any]:
    """A private copy of an input set on the device (the kept set may sit on the host)."""
    return [x.detach().to(dev, copy=True) if isinstance(x, torch.Tensor) else copy.deepcopy(x) for x in values]


def _host(value: Any) -> Any:
    """`value`'s tensors in host memory (the largest Tasks keep their sets and outputs there)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_host(v) for v in value)
    return value


def _free_memory(dev: torch.device) -> tuple[int | None, int | None]:
    """(GPU bytes free to this process, host bytes available); None where not known."""
    gpu = None
    if dev.type == "cuda":
        try:
            free, _ = torch.cuda.mem_get_info(dev)
            gpu = int(free) + int(torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
        except Exception:
            gpu = None
    host = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
    except OSError:
        pass
    return gpu, host


def _plan_memory(h: Harness, options: EngineOptions, judge: Judge, res: VerifyResult, peak: int,
                 out_elem: int, held: list[torch.Tensor]) -> memory_plan.Plan:
    """`held`: the warm-up set's tensors, freed before the sets when they are not kept on the GPU."""
    assert h.model is not None
    params = sum(t.numel() * t.element_size() for t in list(h.model.parameters()) + list(h.model.buffers()))
    gpu, host = _free_memory(h.device)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held if t.device.type == "cuda"}
    held_bytes = sum(storages.values())  # by storage: an output that is a view of an input counts once
    notify.data_size(res.input_bytes + res.output_bytes)  # said at the turn points (caller/gpu_lock)
    p = memory_plan.plan(res.input_bytes, res.output_bytes, params, peak, gpu, host,
                         wanted=options.input_sets, element_bytes=out_elem, on_gpu=h.device.type == "cuda",
                         held_bytes=held_bytes)
    res.memory = {"keep": p.keep, "oracle": p.oracle, "sets": p.sets, "working_bytes": p.working_bytes,
                  "oracle_bytes": p.oracle_bytes, "gpu_free_bytes": gpu, "host_free_bytes": host,
                  "held_bytes": held_bytes}
    res.notes += p.notes
    if judge.oracle is not None:
        if p.oracle == "host":
            judge.oracle.device = torch.device("cpu")
        elif p.oracle == "none" and (judge.uses_oracle or judge.explicit):
            judge._refuse(p.notes[-1])
    return p


def _verify(h: Harness, options: EngineOptions, judge: Judge, res: VerifyResult) -> None:
    assert h.model is not None and h.candidate_fn is not None
    ref, cand, dev = h.model, h.candidate_fn, h.device
    atol, rtol = judge.atol, judge.rtol  # the fixed tolerance: stale and weak-test checks
    base = h.seed + 1_000_003  # fresh seeds: disjoint from the seed used for timing sets

    # 1. warm-up set: reference only; learns output sizes, FLOPs, the ops it uses, the bytes it
    # reads (the roofline's floor) and its peak memory (where verify can keep its data).
    warm = h.make_inputs(base)
    from torch.utils.flop_counter import FlopCounterMode

    recorder = OpRecorder(reads=True, work=True)
    before = 0
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
    try:
        with FlopCounterMode(display=False) as flops, recorder:
            prev_expected = ref(*clone_inputs(warm.values))
        res.flops = int(flops.get_total_flops()) or None
    except Exception:  # counting is best effort; the plain run must work
        prev_expected = call(ref, clone_inputs(warm.values), dev, "reference")
    sync(dev)
    peak = max(0, torch.cuda.max_memory_allocated(dev) - before) if dev.type == "cuda" else 0
    res.reference_ops = sorted(recorder.ops - MOVEMENT_OPS)
    out_sizes = [t.numel() * t.element_size() for t in flat_tensors(prev_expected)]
    res.input_bytes = tensor_bytes(warm.values)
    res.output_bytes = sum(out_sizes)
    model_tensors = list(ref.parameters()) + list(ref.buffers())
    res.read_bytes = read_bytes(recorder.reads or {}, flat_tensors(warm.values) + model_tensors)
    res.output_bytes = written_bytes(prev_expected, flat_tensors(warm.values) + model_tensors) or res.output_bytes
    out_elem = min((t.element_size() for t in flat_tensors(prev_expected) if t.is_floating_point()), default=4)
    plan = _plan_memory(h, options, judge, res, max(0, peak - res.output_bytes), out_elem,
                        flat_tensors(warm.values) + flat_tensors(prev_expected))
    host = plan.keep == "host"  # never on a CPU Task: memory_plan keeps it all "device" (host memory)
    n_sets = plan.sets

    def draw(seed: int) -> list[Any]:
        return h.make_inputs(seed).values

    def expected_of(seed: int) -> Any:
        return call(ref, draw(seed), dev, "reference")

    # Too large to keep on the GPU: drawn and computed again when both repeat (worker/judge/recompute.py),
    # else copied to host memory.
    redo = False
    if host and not h.inputs_on_device and dev.type != "cpu":
        # Drawn by one CPU thread (~0.7 GB/s) and copied up: dearer than the host copy it replaces.
        res.notes.append("kept in host memory, not drawn again: get_inputs() draws on the host")
    elif host:
        redo, why = recompute.repeatable(
            draw, lambda x: call(ref, x, dev, "reference"), base, warm.values, prev_expected,
            lambda a, b: _first_mutation(a, b) is None, lambda a, b: compare(a, b, atol, rtol, 0) is None,
            res.input_bytes + res.output_bytes)
        if redo:
            host = False
            plan.keep = res.memory["keep"] = "recompute"  # type: ignore[index]
            res.notes = [memory_plan.recompute_note(plan.sets, res.input_bytes + res.output_bytes)
                         if n.startswith(memory_plan.HOST_NOTE) else n for n in res.notes]
        else:
            res.notes.append(f"kept in host memory, not drawn again: {why}")
    if h.inputs_note:
        res.notes.append(h.inputs_note)
    if warm.zero_float_inputs:
        res.flags.append("zero_inputs")
        res.notes.append(f"get_inputs() gives all-zero float inputs {warm.zero_float_inputs}: a weak test")
    if host or redo:
        del warm, prev_expected  # freed blocks are poisoned before each candidate run
        prev_expected = None

    expected_by_set: Any = recompute.Recomputed(expected_of) if redo else []
    sets: list[Any] = []
    for i in range(n_sets):
        if i:  # between two sets, outside their windows: the GPU may go to a waiting process
            notify.turn_point("verify_set")
        seed = base + 7919 * (i + 1)
        s = h.make_inputs(seed)
        pristine = None if redo else _host(s.values) if host else clone_inputs(s.values)
        poison_free_memory(dev, out_sizes)
        out = call(cand, s.values, dev, "candidate", fill=True)
        if redo:
            pristine = draw(seed)  # the same bits (checked): what the candidate was given
        mutation = _first_mutation(pristine, s.values)
        if mutation is not None:
            raise _Fail("mutated_input", f"the candidate changed input {mutation['input']} "
                        f"({mutation['changed_elements']} elements) on input set {i}",
                        {"input_set": i, **mutation})
        if host or redo:
            del s
        expected = call(ref, _fresh(pristine, dev), dev, "reference")
        check_structure(out, expected, i)
        if host:
            expected = _host(expected)
        ev = judge.check(out, expected, pristine, seed, i)
        if ev is not None:
            _classify_mismatch(h, ev, out, pristine, expected, expected_by_set, out_sizes, atol, rtol)
        if redo:
            expected_by_set.append(seed)
            sets.append(recompute.DrawnSet(draw, seed))
            del expected, pristine
        else:
            expected_by_set.append(expected)
            sets.append(InputSet(seed=seed, values=pristine))
        if not host and not redo:
            prev_expected = expected  # kept alive while the next set's candidate runs
        del out
    res.input_sets = n_sets

    # 3. the exploit's own order: reference first, its output freed, memory poisoned.
    last_seed = base + 104_729
    s = h.make_inputs(last_seed)
    pristine = None if redo else _host(s.values) if host else clone_inputs(s.values)
    fresh = call(ref, draw(last_seed) if redo else _fresh(pristine, dev), dev, "reference")
    expected = None if redo else _host(fresh) if host else _tensor_copy(fresh)
    del fresh
    poison_free_memory(dev, out_sizes)
    out = call(cand, s.values, dev, "candidate", fill=True)
    if host or redo:
        del s  # else kept alive: its pointer must not come back as the next set's (a cache keyed on it)
    if redo:  # after the candidate, as the host copy would be read: the same values
        pristine = draw(last_seed)
        expected = call(ref, _fresh(pristine, dev), dev, "reference")
    check_structure(out, expected, n_sets, dev if host else None)
    ev = judge.check(out, expected, pristine, last_seed, n_sets)
    if ev is not None:
        _classify_mismatch(h, ev, out, pristine, expected, expected_by_set, out_sizes, atol, rtol)
    del out, pristine
    # Every expected output so far: a later result equal to any of them is a stale one.
    seen = expected_by_set.plus(last_seed) if redo else expected_by_set + [expected]
    del expected

    # 4. stale results: the same tensor objects (same id, same data_ptr) refilled in place.
    holder = _fresh(sets[-1].values, dev)
    first = call(cand, holder, dev, "candidate")
    expected_last = expected_by_set[-1]  # recomputed once when not kept
    ev = judge.check(first, expected_last, sets[-1].values, sets[-1].seed, n_sets - 1)
    if ev is not None:
        _classify_mismatch(h, ev, first, sets[-1].values, expected_last, seen, out_sizes,
                           atol, rtol)
    del expected_last
    first_copy = _host(first) if host else _tensor_copy(first)
    for dst, src in zip(holder, sets[0].values):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)
    second = call(cand, holder, dev, "candidate", fill=True)
    expected_0 = expected_by_set[0]
    check_structure(second, expected_0, 0, dev if host else None)
    ev = judge.check(second, expected_0, sets[0].values, sets[0].seed, 0)
    if ev is not None:
        if compare(second, first_copy, atol, rtol, n_sets - 1) is None:
            raise _Fail("stale_result", "called again on the same tensors refilled with new values, "
                        "the candidate returned the previous call's result (a cache keyed on pointer/id)",
                        {**ev, "note": "equals the previous call's output"})
        _classify_mismatch(h, ev, second, sets[0].values, expected_0, seen, out_sizes,
                           atol, rtol)
    if flat_tensors(first) and flat_tensors(second) and any(
            a.data_ptr() == b.data_ptr() for a, b in zip(flat_tensors(first), flat_tensors(second))):
        if compare(first, first_copy, 0.0, 0.0, n_sets) is not None:
            res.flags.append("output_buffer_reused")
            res.notes.append("the candidate returns the same output buffer on every call "
                             "(an earlier result is overwritten by the next call)")
    del first, second, holder, first_copy, seen
    prev_expected = None

    # Weak tests: the reference's outputs barely depend on the inputs, under the rule that
    # decides the verdict (one set's output would pass for another's).
    if len(expected_by_set) >= 2 and all(
            same_output(expected_by_set[k], expected_0, dev, judge.uses_oracle, atol, rtol)
            for k in range(1, len(expected_by_set))):
        res.flags.append("near_constant_output")
        res.notes.append("the reference gives the same output on every input set: the test is weak")
    zero_outs = [i for i, t in enumerate(flat_tensors(expected_0))
                 if t.is_floating_point() and t.numel() and not bool(t.any())]
    if zero_outs:
        res.flags.append("zero_output")
        res.notes.append(f"the reference output {zero_outs} is all zeros: the test is weak")

    # Training mode, when the reference behaves differently in it.
    _verify_training(h, judge, res, sets, expected_0)
    del expected_0

    # 5. fallback: which of the reference's compute ops does the candidate run? (and, for PyTorch
    # code, its own FLOPs: fewer than the reference's is an algebraic shortcut)
    cand_rec = OpRecorder(work=True)
    counted: int | None = None
    with FlopCounterMode(display=False) as cand_flops, cand_rec:
        try:
            cand(*_fresh(sets[0].values, dev))
            counted = int(cand_flops.get_total_flops())
        except Exception:
            pass  # it ran fine above; a mode-specific failure is not a verdict
    ref_work = (res.flops or 0) + (recorder.elementwise or 0)
    cand_work = None if counted is None else counted + (cand_rec.elementwise or 0)
    sync(dev)
    brings_kernel = _brings_kernel(h)
    if not brings_kernel:
        res.candidate_flops = counted
    used = sorted((cand_rec.ops - MOVEMENT_OPS) & set(res.reference_ops))
    # A kernel beside PyTorch's heavy ops (a matmul, a conv, a reduction the reference wrote
    # another way): the heavy op likely does the work, so it is a partial fallback too.
    heavy = sorted((cand_rec.ops & HEAVY_OPS) - set(used)) if brings_kernel else []
    if used or heavy:
        res.fallback_ops = used + heavy
        res.flags.append("torch_fallback")
        if used:
            res.notes.append("calls the PyTorch ops the reference uses (" + ", ".join(used) + ")")
        if heavy:
            res.notes.append("runs PyTorch compute ops beside its own kernel (" + ", ".join(heavy) + ")")
    res.message = f"matches the reference on {res.sets_checked} input sets"
    if res.flops and not brings_kernel and cand_work is not None and cand_work < SHORTCUT_SHARE * ref_work:
        res.flags.append("algebraic_shortcut")
        res.message += "; " + shortcut_words(res.sets_checked)
        res.notes.append(f"the candidate does {cand_work:.3g} operations where the reference does {ref_work:.3g} "
                         f"(matmul FLOPs by torch's counter, one per element of every other compute op): "
                         f"{shortcut_words(res.sets_checked)}")
    if judge.weak is not None and judge.uses_oracle:
        res.flags.append("weak_reference")
        res.message += f"; {judge.weak['text']}"
        res.notes.append(judge.weak["text"] + " (two fp32 runs of it on one input agree: it is deterministic, "
                         "not random)")
    loose = [m for m in judge.worst.values() if m.outcome == "less_accurate"] if judge.uses_oracle else []
    if loose:
        w = max(loose, key=lambda m: m.ratio)
        res.flags.append("less_accurate")
        if w.weak_reference:
            res.message += (f"; less accurate: {w.cand_err:.2g} of scale off float64 on {w.output} "
                            f"(correct within {w.budget:g})")
            res.notes.append(f"less_accurate: {w.output} is {w.cand_err:.2g} of scale off float64, beyond "
                             f"{w.budget:g} and within {accuracy.LOOSE_TOL:g} (the reference is numerically weak)")
        else:
            res.message += (f"; less accurate: {times_phrase(w.ratio)} PyTorch's error against float64 "
                            f"on {w.output} (correct up to {accuracy.RATIO_CORRECT:g}x)")
            res.notes.append(f"less_accurate: {w.output} is {times_phrase(w.ratio)} the reference's "
                             f"own error against float64 (budget {accuracy.RATIO_CORRECT:g}x, within "
                             f"{accuracy.LOOSE_TOL:g}): an approximation or a weaker formula")
    if "eval_only" in res.flags and judge.train_evidence is not None:
        res.message += "; " + train_phrase(judge.train_evidence)


# A PyTorch candidate doing fewer than this share of the reference's operations (matmul FLOPs by
# torch's counter, one per element of every other compute op) does less arithmetic: diag(A) @ B as
# a row scale 1e6 against 2.1e9, gemm_sum_rewrite 4.5e6 against 1.1e9; an in-order matvec written
# as a loop of multiply-adds does as many as the reference's mv (2 x 131,072 x 8) and is not one.
SHORTCUT_SHARE = 0.5


def train_phrase(ev: dict[str, Any]) -> str:
    """"in training mode output[3, 7] is 1.3e+06x PyTorch's error (got 0.5, float64 0.1)"."""
    where = ev.get("where")
    at = f"{ev.get('output', 'output')}{list(where) if where else ''}"
    if isinstance(ev.get("ratio"), (int, float)):
        return (f"in training mode {at} is {times_phrase(ev['ratio'])} PyTorch's error against float64 "
                f"(got {ev.get('got')}, float64 {ev.get('oracle')}, error {ev.get('max_abs_err', 0):.3g})")
    if "got" in ev:
        return (f"in training mode {at} differs: got {ev.get('got')}, expected {ev.get('expected')} "
                f"(max abs err {ev.get('max_abs_err', float('nan')):.3g})")
    return "wrong in training mode"


def _verify_training(h: Harness, judge: Judge, res: VerifyResult, sets: list[InputSet], eval_out: Any) -> None:
    """Verify in training mode too when the reference behaves differently there. Each call starts
    from the state both models were built in, on the first and the last input set (the eval-mode
    procedure ran on all of them; `eval_out` is the reference's output on the first). Wrong there
    only: flag `eval_only`."""
    assert h.model is not None and h.candidate_fn is not None
    ref, cand, dev = h.model, h.candidate_fn, h.device
    declared = (h.task.mode or "").lower()
    if declared == "eval":
        judge.modes = {"eval": "verified", "train": 'not verified: the Task declares MODE = "eval"'}
        res.notes.append('the Task declares MODE = "eval" (an inference Task): verified in eval mode only')
        return
    pr = modes.probe(ref, _fresh(sets[0].values, dev), h.seed, lambda m, x: call(m, x, dev, "reference"),
                     evaluated=eval_out)
    what = ", ".join(pr.modules[:4]) + (" ..." if len(pr.modules) > 4 else "")
    which = what or "the forward reads self.training"
    if pr.error is not None:
        judge.modes = {"eval": "verified", "train": f"not verified: the reference raises in training mode ({pr.error})"}
        res.notes.append(f"the reference raises in training mode ({pr.error}): verified in eval mode only")
        return
    if not pr.dependent:
        judge.modes = {"eval": "verified", "train": "same as eval (the reference does not depend on the mode)"}
        return
    if pr.random_in_training:
        judge.modes = {"eval": "verified", "train": f"not verified: random in training mode ({what or 'the forward'})"}
        res.notes.append(f"{what or 'the reference'} is random in training mode (Dropout): verified in eval mode only")
        return
    cand_model = h.candidate_model
    states = modes.States(ref, cand_model)
    failure: str | None = None
    evidence: dict[str, Any] | None = None
    try:
        for index in (0, len(sets) - 1):  # _verify makes at least two sets
            s = sets[index]
            states.restore()
            modes.set_mode(True, ref, cand_model)
            set_seed(h.seed)
            out = call(cand, _fresh(s.values, dev), dev, "candidate", fill=True)
            states.restore()
            set_seed(h.seed)
            expected = call(ref, _fresh(s.values, dev), dev, "reference")
            check_structure(out, expected, index)
            ev = judge.check(out, expected, s.values, s.seed, index, mode="train")
            if ev is not None:
                evidence = _clean(ev)
                if ev.get("rule") == "oracle":
                    failure = (f"{ev['output']} is {times_phrase(ev['ratio'])} the reference's error "
                               f"at {ev['where']} (got {ev['got']}, float64 {ev['oracle']})")
                else:
                    failure = (f"{ev['output']} differs at {ev['where']} (got {ev['got']}, "
                               f"expected {ev['expected']})")
                break
    except _Fail as fail:
        failure, evidence = fail.message, _clean(fail.evidence)
    finally:
        states.restore()
        modes.set_mode(False, ref, cand_model)
    if failure is None:
        judge.modes = {"eval": "verified", "train": f"verified ({which})"}
        res.notes.append(f"verified in training and eval mode ({which})")
        return
    judge.modes = {"eval": "verified", "train": f"wrong: {failure}"}
    res.flags.append("eval_only")
    res.notes.append(f"correct in eval mode only: in training mode ({which}) "
                     f"{failure}; declare MODE = \"eval\" in the reference if this Task is for inference")
    judge.train_evidence = evidence


def _classify_mismatch(h: Harness, ev: dict[str, Any], out: Any, pristine: list[Any], expected: Any,
                       earlier: list[Any], out_sizes: list[int], atol: float | None,
                       rtol: float | None) -> None:
    """Raise the right verdict for a failed comparison: unwritten, nan, stale or mismatch."""
    dev = h.device
    assert h.candidate_fn is not None
    where = ev.get("where")
    if ev.get("nonfinite"):
        # Same call with fresh tensors holding a finite sentinel instead of NaN: a NaN that
        # turns finite came from the fill (never written), whatever memory held before.
        again = call(h.candidate_fn, _fresh(pristine, dev), dev, "candidate", fill="sentinel")
        mask = ev.get("nonfinite_mask")
        still = False
        for (name, o), (_, e) in zip(_leaves(again), _leaves(expected)):
            if name == ev.get("output") and isinstance(o, torch.Tensor) and mask is not None \
                    and o.shape == mask.shape:
                still = bool((~torch.isfinite(o.detach()) & mask.to(o.device)).any())
        if not still:
            raise _Fail("unwritten_output",
                        f"{ev['output']} has elements the candidate never wrote (poisoned NaN survived; "
                        f"first at {where}, {ev['mismatched']} of {ev['numel']} wrong)", ev)
        raise _Fail("nan", f"{ev['output']} has NaN/Inf where the reference is finite (at {where})", ev)
    for k, old in enumerate(earlier):
        # Stale: the output equals an earlier set's reference (a cache hit on a reused pointer).
        if compare(out, old, atol, rtol, k) is None:
            raise _Fail("stale_result", f"{ev['output']} equals the result for input set {k}: "
                        "results are reused across calls", {**ev, "matches_input_set": k})
    if ev.get("rule") == "oracle" and ev.get("weak_reference"):
        raise _Fail("mismatch", f"{ev['output']} is {ev['cand_err']:.2g} of scale off float64 (the reference is "
                    f"numerically weak, {ev['ref_err']:.2g} off: judged against float64, correct within "
                    f"{ev['budget']:g}, less_accurate within {accuracy.LOOSE_TOL:g}): at {where} got {ev['got']}, "
                    f"float64 {ev['oracle']}, reference {ev['expected']}"
                    + (" in training mode" if ev.get("mode") == "train" else ""), ev)
    if ev.get("rule") == "oracle":
        raise _Fail("mismatch", f"{ev['output']} is {times_phrase(ev['ratio'])} the reference's own error "
                    f"against float64 (correct up to {accuracy.RATIO_CORRECT:g}x, less_accurate up to "
                    f"{accuracy.RATIO_LESS_ACCURATE:g}x within {accuracy.LOOSE_TOL:g}"
                    + ("" if ev.get("within_loose") else "; beyond it here") + f"): at {where} got {ev['got']}, "
                    f"float64 {ev['oracle']}, reference {ev['expected']} ({ev['mismatched']} of {ev['numel']} "
                    "elements over the budget)" + (" in training mode" if ev.get("mode") == "train" else ""), ev)
    raise _Fail("mismatch", f"{ev['output']} differs from the reference at {where}: got {ev['got']}, "
                f"expected {ev['expected']} (max abs err {ev['max_abs_err']:.3g}, "
                f"{ev['mismatched']} of {ev['numel']} elements off)", ev)
