"""Worker side: time a callable the way the best harnesses do.

The timer and statistics functions are captured HERE, at import, before any candidate code
is loaded (the Worker imports this module first): a candidate that later reassigns
`time.perf_counter_ns`, `torch.cuda.Event`, `Event.elapsed_time`, `torch.cuda.synchronize`
or `builtins.sorted` changes nothing measured here (cheat 7).

GPU method, per run: L2 flushed (a buffer of 2x the device's L2 written), device-wide sync,
`start` event, one call on the next of several rotating input sets, `end` event, device-wide
sync, then a `done` event recorded after that sync. `end - start` is the classic event time;
`done - start` minus the sync's own latency (calibrated with an empty call) also covers work
the candidate hid on another stream (cheat 5). If the second is clearly longer, the run is
flagged `side_stream_work` and the longer time is reported. CPU: `perf_counter_ns` around each
call, same structure, no cache flush. Runs are adaptive: at least `min_runs`, more for short
calls, bounded by `budget_s`.
"""

from __future__ import annotations

import builtins
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernel_lsp.model import Timing

# -- captured before any candidate runs ----------------------------------------------------------
_perf_counter_ns = time.perf_counter_ns
_sorted = builtins.sorted
_len = builtins.len
_sum = builtins.sum
_min = builtins.min
_max = builtins.max
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_cuda_sync = torch.cuda.synchronize
_gpu_sleep = torch.cuda._sleep
# Cycles of GPU busy-wait queued before each timed call: the start event then fires only once
# the host has enqueued the call, so Python's launch overhead (ctypes, allocations: 10-20 us)
# is not counted as kernel time, as do_bench and ncu do not count it. ~60 us at boost clock.
# The price: side-stream work that ends inside this lead is not seen by the device-wide
# measure; the static check flags side streams, and longer hidden work is still counted.
LEAD_CYCLES = 120_000
_cuda_available = torch.cuda.is_available


def captured() -> dict[str, Any]:
    """The objects this module trusts, for the Worker's tamper check."""
    return {"time.perf_counter_ns": _perf_counter_ns, "torch.cuda.Event": _Event,
            "torch.cuda.Event.record": _event_record, "torch.cuda.Event.elapsed_time": _event_elapsed,
            "torch.cuda.synchronize": _cuda_sync}


@dataclass
class BenchResult:
    timing: Timing
    samples_ms: list[float]
    event_timing: Timing | None = None   # CUDA: end - start on the launching stream
    device_timing: Timing | None = None  # CUDA: until every stream was idle, sync latency removed
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def stats(samples_ms: list[float]) -> Timing:
    """Median, min, max and IQR/median (percent) with the captured builtins."""
    s = _sorted(samples_ms)
    n = _len(s)
    if n == 0:
        return Timing(median_ms=float("nan"), min_ms=float("nan"), max_ms=float("nan"), spread_pct=float("nan"), runs=0)
    median = _quantile(s, 0.5)
    iqr = _quantile(s, 0.75) - _quantile(s, 0.25)
    spread = 100.0 * iqr / median if median > 0 else 0.0
    return Timing(median_ms=median, min_ms=s[0], max_ms=s[-1], spread_pct=spread, runs=n)


def _quantile(s: list[float], q: float) -> float:
    pos = (_len(s) - 1) * q
    lo = int(math.floor(pos))
    hi = _min(lo + 1, _len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    if device.type != "cuda":
        return None
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
    nbytes = _max(2 * l2, 8 << 20)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def time_fn(fn: Callable[..., Any], input_sets: list[list[Any]], device: torch.device | str, *,
            warmup: int = 5, min_runs: int = 20, max_runs: int = 2000, budget_s: float = 2.0,
            flush_l2: bool = True) -> BenchResult:
    """Time separate calls `fn(*input_sets[i % n])` (results discarded)."""
    device = torch.device(device)
    if not input_sets:
        input_sets = [[]]
    with torch.no_grad():
        if device.type == "cuda":
            return _time_cuda(fn, input_sets, device, warmup, min_runs, max_runs, budget_s, flush_l2)
        return _time_cpu(fn, input_sets, warmup, min_runs, max_runs, budget_s)


def _runs_for(est_ms: float, min_runs: int, max_runs: int, budget_s: float) -> int:
    if est_ms <= 0:
        return max_runs
    return int(_max(min_runs, _min(max_runs, budget_s * 1000.0 / est_ms)))


def _time_cpu(fn: Callable[..., Any], sets: list[list[Any]], warmup: int, min_runs: int,
              max_runs: int, budget_s: float) -> BenchResult:
    n = _len(sets)
    warm: list[float] = []
    for i in range(_max(1, warmup)):
        t0 = _perf_counter_ns()
        fn(*sets[i % n])
        warm.append((_perf_counter_ns() - t0) / 1e6)
    runs = _runs_for(_sorted(warm)[_len(warm) // 2], min_runs, max_runs, budget_s)
    samples: list[float] = []
    deadline = _perf_counter_ns() + int(budget_s * 1.5e9)
    for r in range(runs):
        args = sets[r % n]
        t0 = _perf_counter_ns()
        fn(*args)
        samples.append((_perf_counter_ns() - t0) / 1e6)
        if r + 1 >= min_runs and _perf_counter_ns() > deadline:
            break
    return BenchResult(timing=stats(samples), samples_ms=samples,
                       notes=["CPU: perf_counter_ns per call; caches not flushed"])


def _cuda_run(fn: Callable[..., Any], args: list[Any], flush: torch.Tensor | None,
              events: tuple[Any, Any, Any]) -> tuple[float, float]:
    start, end, done = events
    if flush is not None:
        flush.zero_()
    _cuda_sync()
    if fn is not _noop:
        _gpu_sleep(LEAD_CYCLES)
    _event_record(start)
    fn(*args)
    _event_record(end)
    _cuda_sync()   # device-wide: waits for every stream, side streams included
    _event_record(done)
    _cuda_sync()
    return _event_elapsed(start, end), _event_elapsed(start, done)


def _time_cuda(fn: Callable[..., Any], sets: list[list[Any]], device: torch.device, warmup: int,
               min_runs: int, max_runs: int, budget_s: float, flush_l2: bool) -> BenchResult:
    with torch.cuda.device(device):
        flush = l2_flush_buffer(device) if flush_l2 else None
        events = (_Event(enable_timing=True), _Event(enable_timing=True), _Event(enable_timing=True))
        # Calibrate the latency of "sync, then record" with a call that does nothing.
        idle = [_cuda_run(_noop, [], None, events) for _ in range(10)]
        sync_latency = _sorted(d - e for e, d in idle)[5]
        n = _len(sets)
        warm = [_cuda_run(fn, sets[i % n], flush, events)[0] for i in range(_max(1, warmup))]
        runs = _runs_for(_sorted(warm)[_len(warm) // 2] + 0.01, min_runs, max_runs, budget_s)
        ev_samples: list[float] = []
        dev_samples: list[float] = []
        deadline = _perf_counter_ns() + int(budget_s * 1.5e9)
        for r in range(runs):
            ev, full = _cuda_run(fn, sets[r % n], flush, events)
            ev_samples.append(ev)
            dev_samples.append(_max(0.0, full - sync_latency))
            if r + 1 >= min_runs and _perf_counter_ns() > deadline:
                break
    ev_t, dev_t = stats(ev_samples), stats(dev_samples)
    result = BenchResult(timing=ev_t, samples_ms=ev_samples, event_timing=ev_t, device_timing=dev_t)
    # Work the launching stream's events missed: the device stayed busy clearly longer.
    if dev_t.median_ms > 1.25 * ev_t.median_ms + 0.02:
        worst = [_max(e, d) for e, d in zip(ev_samples, dev_samples)]
        result.timing, result.samples_ms = stats(worst), worst
        result.flags.append("side_stream_work")
        result.notes.append(f"the device stayed busy {dev_t.median_ms:.4g} ms against {ev_t.median_ms:.4g} ms "
                            "on the launching stream: work on another stream counted")
    return result


def time_each(fn: Callable[..., Any], input_sets: list[list[Any]], device: torch.device | str,
              flush_l2: bool = True) -> list[float]:
    """One timed call per input set, no warm-up (calls on never-seen inputs), in ms."""
    device = torch.device(device)
    out: list[float] = []
    with torch.no_grad():
        if device.type == "cuda":
            with torch.cuda.device(device):
                flush = l2_flush_buffer(device) if flush_l2 else None
                events = (_Event(enable_timing=True), _Event(enable_timing=True), _Event(enable_timing=True))
                for args in input_sets:
                    ev, full = _cuda_run(fn, args, flush, events)
                    out.append(_max(ev, full))
            return out
        for args in input_sets:
            t0 = _perf_counter_ns()
            fn(*args)
            out.append((_perf_counter_ns() - t0) / 1e6)
    return out


def _noop(*_: Any) -> None:
    return None


def measured_copy_bandwidth(device: torch.device, nbytes: int = 256 << 20) -> float | None:
    """Bytes per second of a device-to-device copy (read + write), the roofline's fallback."""
    if device.type != "cuda":
        return None
    with torch.cuda.device(device):
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        res = time_fn(lambda: dst.copy_(src), [[]], device, warmup=3, min_runs=10, max_runs=20,
                      budget_s=0.5, flush_l2=False)
    ms = res.timing.min_ms
    return 2 * nbytes / (ms / 1e3) if ms > 0 else None
