"""The float64 oracle: the reference run once per input set in float64, kept by the Worker.

A deep copy of the reference Model (in the state it was built in) is cast with `.double()`,
floating inputs are cast, and it runs with float64 as torch's default dtype (so tensors the
forward makes itself are float64 too). Its outputs are kept on the CPU in a bounded cache keyed
by (reference source, model seed, input-set seed, device, mode): a second evaluation of the same
Task, any Candidate, pays nothing.

The oracle is refused (and the caller falls back to the fixed tolerance, saying why) when the
float64 run raises (an op without a float64 kernel), or when a compute op inside it still
produced float32 / float16 / bfloat16 values (the forward casts down on purpose: it would not be
a float64 run).
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections import OrderedDict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernel_lsp.engine.worker.harness import Harness, flat_tensors, set_seed

# Outputs kept across evaluations in one Worker, on the CPU. An H200 Task's outputs at
# KernelBench sizes are up to ~0.5 GiB in float64; four input sets of the largest fit.
CACHE_BYTES = 2 << 30
_CACHE: "OrderedDict[tuple[Any, ...], tuple[Any, int]]" = OrderedDict()  # key -> (outputs, their bytes)
_held = 0  # the bytes _CACHE holds
_LOW = (torch.float32, torch.float16, torch.bfloat16, torch.complex64)


class _LowPrecisionOps(TorchDispatchMode):
    """Compute ops whose floating outputs are below float64 during the oracle run."""

    def __init__(self, skip: frozenset[str]) -> None:
        super().__init__()
        self.skip = skip
        self.low: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        if name not in self.skip and any(t.dtype in _LOW for t in flat_tensors(out)):
            self.low.add(name)
        return out


def _to64(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            return value.to(torch.complex128)
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to64(v) for v in value)
    return value


def _to(value: Any, device: torch.device | str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in flat_tensors(value))


def clear_cache() -> None:
    global _held
    _CACHE.clear()
    _held = 0


def cache_size() -> int:
    return len(_CACHE)


class Oracle:
    """The float64 reference of one Harness. `outputs()` returns None once it is refused."""

    def __init__(self, h: Harness, skip_ops: frozenset[str] = frozenset()) -> None:
        assert h.model is not None
        self.h = h
        self.skip_ops = skip_ops
        src = hashlib.sha256(h.task.reference_source.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        self.key = (src, h.seed, str(h.device))
        # The state the reference was built in: training-mode calls change running statistics.
        self.init_state = {k: v.detach().clone() for k, v in h.model.state_dict().items()}
        self.model64: torch.nn.Module | None = None
        self.refused: str | None = None
        self.runs = 0            # float64 forward calls made here
        self.hits = 0            # answers from the Worker's cache
        self.seconds = 0.0       # wall time of the float64 runs (and the model's copy)
        self.not_kept = 0        # outputs above the cache's per-entry bound: the next evaluation runs again
        # Where the float64 run happens: the Harness's device, or the host CPU when the GPU has no
        # room for it beside the check (worker/judge/memory_plan.py decides; verify sets it).
        self.device: torch.device = h.device
        self.reruns = 0          # float64 runs made again under another seed (is the reference random?)
        self.moved: str | None = None  # why it left the GPU for the host CPU mid-verify

    def _model(self) -> torch.nn.Module:
        if self.model64 is None:
            assert self.h.model is not None
            # _run loads init_state before each call
            self.model64 = copy.deepcopy(self.h.model).to(device=self.device).double()
        return self.model64

    def outputs(self, seed: int, inputs: list[Any], mode: str = "eval") -> Any | None:
        """The float64 outputs for the input set made under `seed` (`inputs` are its values,
        untouched here), on the Harness's device; None when the oracle is refused."""
        key = (*self.key, str(self.device), seed, mode)
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            self.hits += 1
            return _to(hit[0], self.device)
        if self.refused is not None:
            return None
        t0 = time.perf_counter()
        try:
            out = self._run(inputs, mode)
        finally:
            self.seconds += time.perf_counter() - t0
        if out is None:
            return None
        self._keep(key, out)
        return out

    def again(self, inputs: list[Any], mode: str = "eval", seed_offset: int = 1) -> Any | None:
        """The float64 run once more under another seed, never cached: two runs that differ mean
        the reference is random (verify's Judge asks this only when it is far from float64)."""
        if self.refused is not None:
            return None
        self.reruns += 1
        t0 = time.perf_counter()
        try:
            out = self._run(inputs, mode, seed=self.h.seed + seed_offset)
            self.runs -= 1 if out is not None else 0  # counted in `reruns`, not as a cached answer's miss
            return out
        finally:
            self.seconds += time.perf_counter() - t0

    def _run(self, inputs: list[Any], mode: str, seed: int | None = None) -> Any | None:
        before = torch.get_default_dtype()
        watch = _LowPrecisionOps(self.skip_ops)
        out_of_memory = False
        try:
            model = self._model()
            model.load_state_dict(self.init_state)  # each call starts where the reference did
            model.train(mode == "train")
            args = [_to64(x.detach().to(self.device, copy=True) if isinstance(x, torch.Tensor) else x)
                    for x in inputs]
            torch.set_default_dtype(torch.float64)
            set_seed(self.h.seed if seed is None else seed)
            with torch.no_grad(), watch:
                out = model(*args)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.runs += 1
        except torch.OutOfMemoryError as exc:
            # The plan counts what is alive when the oracle runs; the allocator's rounding or
            # another process can still leave less: the host CPU then, never a verdict lost.
            if self.device.type == "cpu":
                self.refuse(f"the float64 run ran out of host memory ({str(exc).splitlines()[0][:120]})")
                return None
            out_of_memory = True
        except Exception as exc:  # an op without a float64 kernel, a dtype the forward insists on
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            where = " on the host CPU" if self.device.type != self.h.device.type else ""
            self.refuse(f"the reference does not run in float64{where} ({type(exc).__name__}: {first})")
            return None
        finally:
            torch.set_default_dtype(before)
        if out_of_memory:
            args = out = None  # noqa: F841 (their GPU memory goes before the host run)
            self.model64 = None
            self.moved = f"the float64 run did not fit on {self.device} beside the check: it ran on the host CPU"
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.device = torch.device("cpu")
            return self._run(inputs, mode, seed)
        if watch.low:
            self.refuse("the float64 run still computed in lower precision ("
                        + ", ".join(sorted(watch.low)[:4]) + "): the forward casts down itself")
            return None
        return out

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why
        self.model64 = None

    def _keep(self, key: tuple[Any, ...], out: Any) -> None:
        global _held
        nbytes = _nbytes(out)
        if nbytes > CACHE_BYTES // 4:
            self.not_kept += 1  # too big to keep: the next evaluation runs it again (summary says so)
            return
        replaced = _CACHE.pop(key, None)
        _held += nbytes - (replaced[1] if replaced is not None else 0)
        _CACHE[key] = (_to(out, "cpu"), nbytes)
        while _held > CACHE_BYTES and len(_CACHE) > 1:
            _, (_, old) = _CACHE.popitem(last=False)
            _held -= old

    def summary(self) -> dict[str, Any]:
        out = {"available": self.refused is None, "why_not": self.refused, "runs": self.runs,
               "cached": self.hits, "seconds": round(self.seconds, 4), "device": str(self.device)}
        if self.reruns:
            out["reruns"] = self.reruns
        if self.moved:
            out["moved"] = self.moved
        if self.not_kept:
            out["not_kept"] = self.not_kept
            out["not_kept_why"] = (f"float64 outputs above {CACHE_BYTES // 4 >> 20} MiB each are not kept: "
                                   "every evaluation runs them again")
        return out
