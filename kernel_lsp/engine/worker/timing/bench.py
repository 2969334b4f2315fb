"""Time a callable the way the best harnesses do.

The timer and statistics functions are captured HERE, at import, before any candidate code
is loaded (the Worker imports this module first): a candidate that later reassigns
`time.perf_counter_ns`, `torch.cuda.Event`, `Event.elapsed_time`, `torch.cuda.synchronize`
or `builtins.sorted` changes nothing measured here.

GPU method, per run: L2 flushed (a buffer of 2x the device's L2 written), device-wide sync,
`start` event, one call on the next of several rotating input sets, `end` event, sync.
`end - start` is the event time on the launching stream.

Work the candidate hid on another stream is found from this process's OWN kernels:
a few calls run under the PyTorch profiler (CUPTI activity records: every kernel, copy and
memset of this process with its stream), each call framed by two marker kernels on the
launching stream. A kernel on any other stream inside a frame is side-stream work: the run is
flagged `side_stream_work` and the time reported is the span from the first to the last
kernel of the call over all streams. A device-wide "busy until idle" measure is not used: it
counts other processes' work (a 0.017 ms kernel read 0.42 ms on a shared GPU).

CPU: `perf_counter_ns` around each call, same structure, no cache flush. Runs are adaptive:
at least `min_runs`, more for short calls, bounded by `budget_s`.
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
LEAD_CYCLES = 120_000
# The lead grows to cover the slowest baseline's host time per call (torch.compile's guards and
# wrapper, eager's dispatch of several ops): otherwise the GPU waits between the start event and
# the kernels for the host, and that wait is counted. The same lead serves the candidate, so a
# candidate is never credited with host work the baselines are charged for; and it is capped, so
# a candidate cannot hide long CPU work behind it (docs/baselines.md).
LEAD_HEADROOM = 1.5      # lead = headroom x the slowest baseline's host time + LEAD_MARGIN_US
LEAD_MARGIN_US = 20.0
LEAD_MAX_US = 2000.0
HOST_PROBE_CALLS = 5
CPU_BLOCK = 8            # CPU: calls per turn of an interleaved timing (the first of each not counted)
MARKER = "spin_kernel"   # the kernel torch.cuda._sleep launches: frames each profiled call
SIDE_STREAM_CALLS = 5    # calls profiled to look for side-stream work
SIDE_STREAM_TIMED_CALLS = 20  # calls timed over every stream once some was found
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
    streams_timing: Timing | None = None  # CUDA, side-stream work found: first to last kernel, all streams
    side_streams: list[dict[str, Any]] = field(default_factory=list)  # the kernels seen off the timed stream
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Activity:
    """One GPU activity record of this process (CUPTI through the PyTorch profiler)."""

    name: str
    stream: int
    start_ns: int
    end_ns: int


@dataclass
class CallActivity:
    span_ms: float                       # first start to last end over every stream, 0 without kernels
    side: list[Activity]                 # records on other streams than the timed one


def frame_calls(records: list[Activity], marker: str = MARKER) -> list[CallActivity]:
    """Split a profiled run into calls: marker kernels on the timed stream come in pairs
    (before and after each call, the second after a device sync), so everything of call i
    lies between the two markers of pair i. The timed stream is the markers' stream."""
    records = _sorted(records, key=lambda r: r.start_ns)
    marks = [r for r in records if marker in r.name]
    if not marks:
        return []
    timed = marks[0].stream
    marks = [m for m in marks if m.stream == timed]
    calls: list[CallActivity] = []
    for i in range(0, _len(marks) - 1, 2):
        lo, hi = marks[i].end_ns, marks[i + 1].start_ns
        inside = [r for r in records if lo <= r.start_ns < hi and marker not in r.name]
        span = 0.0
        if inside:
            span = (_max(r.end_ns for r in inside) - _min(r.start_ns for r in inside)) / 1e6
        calls.append(CallActivity(span_ms=span, side=[r for r in inside if r.stream != timed]))
    return calls


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
            flush_l2: bool = True, side_streams: bool = True, lead_us: float | None = None) -> BenchResult:
    """Time separate calls `fn(*input_sets[i % n])` (results discarded). `side_streams`: look
    for work on other streams of this process (the candidate's; our baselines skip it).
    `lead_us`: the GPU busy-wait before each call (None: LEAD_CYCLES)."""
    device = torch.device(device)
    if not input_sets:
        input_sets = [[]]
    with torch.no_grad():
        res = _time_turns([fn], input_sets, device, warmup, min_runs, max_runs, budget_s, flush_l2, lead_us,
                          name_raiser=False)[0]
        if device.type == "cuda" and side_streams:
            _side_streams(fn, input_sets, device, res, flush_l2)
        return res


def _runs_for(est_ms: float, min_runs: int, max_runs: int, budget_s: float) -> int:
    if est_ms <= 0:
        return max_runs
    return int(_max(min_runs, _min(max_runs, budget_s * 1000.0 / est_ms)))


def _cuda_run(fn: Callable[..., Any], args: list[Any], flush: torch.Tensor | None,
              events: tuple[Any, Any], lead: int = LEAD_CYCLES) -> float:
    start, end = events
    if flush is not None:
        flush.zero_()
    _cuda_sync()
    _gpu_sleep(lead)
    _event_record(start)
    fn(*args)
    _event_record(end)
    _cuda_sync()
    return _event_elapsed(start, end)


class TimedCallError(Exception):
    """Callable `index` of an interleaved timing raised."""

    def __init__(self, index: int, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.index, self.exc = index, exc


def time_interleaved(fns: list[Callable[..., Any]], input_sets: list[list[Any]], device: torch.device | str, *,
                     warmup: int = 5, min_runs: int = 20, max_runs: int = 2000, budget_s: float = 2.0,
                     flush_l2: bool = True, lead_us: float | None = None,
                     settle: "Settle | None" = None) -> list[BenchResult]:
    """Time several callables call by call in turn (a, b, c, a, b, c, ...), so that a drift of
    the machine (clocks, heat, another process) lands on all of them alike. Each gets at least
    `min_runs` calls and its own share of `budget_s`; the fast ones get more calls while the
    slow ones have reached theirs. `settle`: stop early once every median is that precise.
    Raises TimedCallError naming the callable that raised."""
    device = torch.device(device)
    if not input_sets:
        input_sets = [[]]
    with torch.no_grad():
        return _time_turns(fns, input_sets, device, warmup, min_runs, max_runs, budget_s, flush_l2, lead_us,
                           name_raiser=True, settle=settle)


def _time_turns(fns: list[Callable[..., Any]], sets: list[list[Any]], device: torch.device, warmup: int,
                min_runs: int, max_runs: int, budget_s: float, flush_l2: bool, lead_us: float | None,
                name_raiser: bool, settle: "Settle | None" = None) -> list[BenchResult]:
    """The one timing loop of time_fn (one callable) and time_interleaved (several, in turn).
    `name_raiser`: a call that raises is re-raised as TimedCallError(its index)."""
    n, k = _len(sets), _len(fns)
    if device.type == "cuda":
        with torch.cuda.device(device):
            flush = l2_flush_buffer(device) if flush_l2 else None
            events = (_Event(enable_timing=True), _Event(enable_timing=True))
            lead = lead_cycles(device, lead_us)

            def one(i: int, args: list[Any]) -> float:
                try:
                    return _cuda_run(fns[i], args, flush, events, lead)
                except Exception as exc:
                    if name_raiser:
                        raise TimedCallError(i, exc) from exc
                    raise
            return _interleave(one, k, n, sets, warmup, min_runs, max_runs, budget_s, 0.01, settle=settle)

    def one_cpu(i: int, args: list[Any]) -> float:
        fn = fns[i]
        t0 = _perf_counter_ns()
        try:
            fn(*args)
        except Exception as exc:
            if name_raiser:
                raise TimedCallError(i, exc) from exc
            raise
        return (_perf_counter_ns() - t0) / 1e6
    # The CPU's caches are not flushed: a call right after another callable's would find them
    # cold, where a call timed alone (a kept baseline's candidate) finds them warm. So on the
    # CPU the turns are blocks of CPU_BLOCK calls, the first of each not counted.
    out = _interleave(one_cpu, k, n, sets, warmup, min_runs, max_runs, budget_s, 0.0,
                      block=CPU_BLOCK if k > 1 else 1, settle=settle)
    for r in out:
        r.notes.append("CPU: perf_counter_ns per call; caches not flushed")
    return out


@dataclass(frozen=True)
class Settle:
    """When a timing may stop before its budget: after `min_s` of timed calls and `min_runs` calls
    of each callable, once every median's 95 % interval is within `precision_pct` of it. More
    calls would only narrow an interval already far inside the number's shown spread
    (docs/baselines.md: what this saves and what it changes)."""

    min_s: float = 0.25
    precision_pct: float = 0.5
    min_runs: int = 100
    every: int = 25          # turns between two looks


def median_interval_pct(samples_ms: list[float]) -> float:
    """Half the width of the median's distribution-free 95 % interval (order statistics n/2 +-
    0.98 sqrt(n)), as a percent of the median; inf for fewer than 10 samples."""
    n = _len(samples_ms)
    if n < 10:
        return float("inf")
    s = _sorted(samples_ms)
    half = 0.98 * math.sqrt(n)
    lo, hi = s[_max(0, int(math.floor(n / 2 - half)))], s[_min(n - 1, int(math.ceil(n / 2 + half)))]
    median = _quantile(s, 0.5)
    return 100.0 * (hi - lo) / 2.0 / median if median > 0 else float("inf")


def _settled(samples: list[list[float]], settle: Settle, started_ns: int) -> bool:
    if (_perf_counter_ns() - started_ns) / 1e9 < settle.min_s:
        return False
    if _min(_len(x) for x in samples) < settle.min_runs:
        return False
    return all(median_interval_pct(x) <= settle.precision_pct for x in samples)


def _interleave(one: Callable[[int, list[Any]], float], k: int, n: int, sets: list[list[Any]], warmup: int,
                min_runs: int, max_runs: int, budget_s: float, pad_ms: float, block: int = 1,
                settle: Settle | None = None) -> list[BenchResult]:
    warm: list[list[float]] = [[] for _ in range(k)]
    for w in range(_max(1, warmup)):
        for i in range(k):
            warm[i].append(one(i, sets[w % n]))
    runs = [_runs_for(_sorted(ws)[_len(ws) // 2] + pad_ms, min_runs, max_runs, budget_s) for ws in warm]
    samples: list[list[float]] = [[] for _ in range(k)]
    started = _perf_counter_ns()
    deadline = started + int(budget_s * k * 1.5e9)
    r = 0
    turns = 0
    while _max(runs[i] - _len(samples[i]) for i in range(k)) > 0:
        turns += 1
        if settle is not None and turns % settle.every == 0 and _settled(samples, settle, started):
            break
        for i in range(k):
            if _len(samples[i]) >= runs[i]:
                continue
            if block > 1:
                one(i, sets[r % n])  # the block's first call warms the caches for this callable
            for b in range(block):
                if _len(samples[i]) < runs[i]:
                    samples[i].append(one(i, sets[(r + b) % n]))
        r += block
        if _min(_len(x) for x in samples) >= min_runs and _perf_counter_ns() > deadline:
            break
    out = []
    for s in samples:
        t = stats(s)
        out.append(BenchResult(timing=t, samples_ms=s, event_timing=t if pad_ms else None))
    return out


def host_us(fn: Callable[..., Any], input_sets: list[list[Any]], device: torch.device | str,
            calls: int = HOST_PROBE_CALLS) -> float:
    """The host time of one call (launching its work, not waiting for it), in microseconds:
    each call is made while the GPU is busy with a busy-wait longer than LEAD_MAX_US, so the
    call returns once its work is queued (a call that waits for the GPU reads as the cap)."""
    device = torch.device(device)
    if device.type != "cuda" or not input_sets:
        return 0.0
    n = _len(input_sets)
    out: list[float] = []
    with torch.no_grad(), torch.cuda.device(device):
        busy = lead_cycles(device, 3 * LEAD_MAX_US)
        for i in range(_max(1, calls)):
            _cuda_sync()
            _gpu_sleep(busy)
            t0 = _perf_counter_ns()
            fn(*input_sets[i % n])
            out.append((_perf_counter_ns() - t0) / 1e3)
            _cuda_sync()
    return _sorted(out)[_len(out) // 2]


def lead_for(host_times_us: list[float]) -> float:
    """The lead (us) for a comparison: covers the slowest callable's host time, within the cap."""
    base = LEAD_CYCLES / _cycles_per_us_default()
    need = LEAD_HEADROOM * _max(host_times_us or [0.0]) + LEAD_MARGIN_US
    return float(_min(LEAD_MAX_US, _max(base, need)))


_CYCLES_PER_US: dict[int, float] = {}


def _cycles_per_us_default() -> float:
    return 2000.0  # about an H100/H200's boost clock: LEAD_CYCLES is ~60 us there


def cycles_per_us(device: torch.device) -> float:
    """The busy-wait kernel's cycles per microsecond on this GPU, measured once per process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CYCLES_PER_US:
        with torch.cuda.device(device):
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            cycles = 2_000_000
            _gpu_sleep(1000)  # the first launch loads the kernel
            _cuda_sync()
            _event_record(start)
            _gpu_sleep(cycles)
            _event_record(end)
            _cuda_sync()
            ms = _event_elapsed(start, end)
        _CYCLES_PER_US[index] = cycles / (ms * 1e3) if ms > 0 else _cycles_per_us_default()
    return _CYCLES_PER_US[index]


def lead_cycles(device: torch.device, lead_us: float | None) -> int:
    if lead_us is None:
        return LEAD_CYCLES
    return int(_max(LEAD_CYCLES, lead_us * cycles_per_us(device)))


def profile_calls(fn: Callable[..., Any], sets: list[list[Any]], device: torch.device, calls: int,
                  flush: torch.Tensor | None = None) -> list[Activity]:
    """Every GPU activity record of this process over `calls` framed calls."""
    from torch.profiler import ProfilerActivity, profile

    n = _len(sets)
    with torch.cuda.device(device):
        _cuda_sync()
        # CPU activity too: some torch versions collect no GPU records without it.
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(calls):
                if flush is not None:
                    flush.zero_()
                _cuda_sync()
                _gpu_sleep(1000)      # opening marker, on the launching stream
                fn(*sets[i % n])
                _cuda_sync()          # every stream of this process done
                _gpu_sleep(1000)      # closing marker
                _cuda_sync()
    return activities(prof, torch.autograd.DeviceType.CUDA)


def activities(prof: Any, device_type: Any) -> list[Activity]:
    """The finished profiler's records on `device_type` (for CUDA, resource id = stream)."""
    out: list[Activity] = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() != device_type:
            continue
        out.append(Activity(name=e.name(), stream=int(e.device_resource_id()), start_ns=int(e.start_ns()),
                            end_ns=int(e.end_ns())))
    return out


def _side_streams(fn: Callable[..., Any], sets: list[list[Any]], device: torch.device, res: BenchResult,
                  flush_l2: bool) -> None:
    """Look for this process's work on other streams; when found, time over every stream."""
    flush = l2_flush_buffer(device) if flush_l2 else None
    try:
        calls = frame_calls(profile_calls(fn, sets, device, SIDE_STREAM_CALLS, flush))
    except Exception as exc:  # a profiler that cannot start (another one active, no CUPTI)
        res.notes.append(f"side-stream check unavailable: {type(exc).__name__}: {str(exc)[:160]}")
        return
    if not calls:
        res.notes.append("side-stream check unavailable: the profiler recorded no GPU activity")
        return
    side = [a for c in calls for a in c.side]
    if not side:
        return
    try:  # time it over every stream, on more calls than the look
        more = frame_calls(profile_calls(fn, sets, device, SIDE_STREAM_TIMED_CALLS, flush))
        calls = more or calls
    except Exception:
        pass
    res.streams_timing = stats([c.span_ms for c in calls])
    if res.streams_timing.median_ms > res.timing.median_ms:
        res.timing, res.samples_ms = res.streams_timing, [c.span_ms for c in calls]
    names = _sorted({a.name for a in side})
    res.side_streams = [{"name": a.name, "stream": a.stream, "ms": (a.end_ns - a.start_ns) / 1e6}
                        for a in side[:10]]
    res.flags.append("side_stream_work")
    events_ms = res.event_timing.median_ms if res.event_timing else float("nan")
    res.notes.append(f"the candidate ran work on another stream ({', '.join(names[:3])}): a call took "
                     f"{res.streams_timing.median_ms:.4g} ms over every stream of this process against "
                     f"{events_ms:.4g} ms on the launching stream; the longer time is reported")


def check_side_streams(fn: Callable[..., Any], input_sets: list[list[Any]], device: torch.device | str,
                       res: BenchResult, flush_l2: bool = True) -> None:
    """The side-stream look of `time_fn`, for a candidate timed by `time_interleaved`."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    with torch.no_grad():
        _side_streams(fn, input_sets or [[]], device, res, flush_l2)


def time_each(fn: Callable[..., Any], input_sets: list[list[Any]], device: torch.device | str,
              flush_l2: bool = True) -> list[float]:
    """One timed call per input set, no warm-up (calls on never-seen inputs), in ms."""
    device = torch.device(device)
    out: list[float] = []
    with torch.no_grad():
        if device.type == "cuda":
            with torch.cuda.device(device):
                flush = l2_flush_buffer(device) if flush_l2 else None
                events = (_Event(enable_timing=True), _Event(enable_timing=True))
                for args in input_sets:
                    out.append(_cuda_run(fn, args, flush, events))
            return out
        for args in input_sets:
            t0 = _perf_counter_ns()
            fn(*args)
            out.append((_perf_counter_ns() - t0) / 1e6)
    return out


def measured_copy_bandwidth(device: torch.device, nbytes: int = 256 << 20) -> float | None:
    """Bytes per second of a device-to-device copy (read + write), the roofline's fallback."""
    if device.type != "cuda":
        return None
    with torch.cuda.device(device):
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        res = time_fn(lambda: dst.copy_(src), [[]], device, warmup=3, min_runs=10, max_runs=20,
                      budget_s=0.5, flush_l2=False, side_streams=False)
    ms = res.timing.min_ms
    return 2 * nbytes / (ms / 1e3) if ms > 0 else None
