"""Judge one Candidate. `evaluate()` is what the Worker calls.

Order: static scan -> compile (build the candidate) -> verify -> bench (only if correct) ->
profile. A Python exception from the candidate becomes an Evaluation with verdict "error"
here; crashes and hangs end the Worker (the client reports those).

Tamper check: every callable of the modules the judgement relies on (torch, torch.Tensor,
torch.cuda, torch.cuda.Event, torch.nn.functional, time, builtins, statistics and this
package's engine modules) is recorded before the candidate is loaded, compared after it ran
and put back. A changed timer is flagged `timer_patch` (bench uses the functions captured at
import, so the numbers stand); any other change makes the verdict "error", since the
comparisons themselves may have been faked.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import platform
import sys
import threading
from typing import Any

from kernel_lsp.engine.worker.timing import bench  # first: captures the timers before any candidate loads
import torch
import torch.profiler  # noqa: F401  imported now: lazy imports re-wrap torch functions later
import torch.utils.flop_counter  # noqa: F401
import torch.utils.deterministic  # noqa: F401
import torch.utils._python_dispatch  # noqa: F401

try:  # dynamo wraps torch.manual_seed & co. when first imported: do it before any snapshot
    import torch._dynamo  # noqa: F401
except Exception:  # pragma: no cover - a torch without dynamo still evaluates
    pass

from kernel_lsp.engine.worker.timing import baselines as kept_baselines
from kernel_lsp.engine import protocol
from kernel_lsp.engine.worker import early, notify
from kernel_lsp.engine.worker.build import build_failure, launch_limits
from kernel_lsp.engine.worker.judge import static_checks
from kernel_lsp.engine.worker.timing import dry_compile, gpu_share, light, roofline
from kernel_lsp.engine.worker.timing import profile as profile_mod
from kernel_lsp.engine.worker.options import EngineOptions, OptionsError
from kernel_lsp.engine.worker.harness import CandidateError, Harness, HarnessError, tensor_bytes
from kernel_lsp.engine.worker.judge.verify import VerifyResult, verify
from kernel_lsp.model import (
    NOISY_SPREAD_PCT,
    PYTORCH_REWRITE,
    Candidate,
    Evaluation,
    Task,
    Timing,
    disqualified_by,
)
from kernel_lsp import verdicts
from kernel_lsp.verdicts import NO_GPU, NO_GPU_TASK

# A Candidate carrying any of these is never counted as an optimized kernel.

_TIMER_NAMES = ("time.", "torch.cuda.Event", "torch.cuda.synchronize", "torch.cuda.Event.",
                "statistics.", "builtins.sorted", "builtins.min", "builtins.max", "builtins.sum")


class Integrity:
    """Identity of every callable the judgement trusts; `changed()` names the replaced ones."""

    def __init__(self) -> None:
        self.saved: dict[tuple[Any, str, str], Any] = {}
        for label, owner in self._owners():
            for name, value in list(vars(owner).items()):
                if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                    self.saved[(owner, label, name)] = value

    @staticmethod
    def _owners() -> list[tuple[str, Any]]:
        import builtins
        import time

        owners: list[tuple[str, Any]] = [
            ("torch", torch), ("torch.Tensor", torch.Tensor), ("torch.cuda", torch.cuda),
            ("torch.cuda.Event", torch.cuda.Event), ("torch.nn.functional", torch.nn.functional),
            ("time", time), ("builtins", builtins), ("torch.testing", torch.testing),
        ]
        for name in ("statistics", "kernel_lsp.engine.worker.judge.verify", "kernel_lsp.engine.worker.timing.bench",
                     "kernel_lsp.engine.worker.judge.accuracy", "kernel_lsp.engine.worker.judge.oracle",
                     "kernel_lsp.engine.worker.judge.modes", "kernel_lsp.engine.worker.judge.memory_plan",
                     "kernel_lsp.engine.worker.timing.light",
                     "kernel_lsp.engine.worker.harness", "kernel_lsp.engine.worker.run",
                     "kernel_lsp.engine.worker.timing.roofline",
                     "kernel_lsp.engine.worker.judge.static_checks", "kernel_lsp.model"):
            module = sys.modules.get(name)
            if module is not None:
                owners.append((name, module))
        return owners

    def rebase(self) -> None:
        """Trust the present state (after the candidate's part: the baselines' own lazy imports)."""
        self.saved = Integrity().saved

    def changed(self) -> list[str]:
        out = []
        for (owner, label, name), value in self.saved.items():
            now = vars(owner).get(name, _MISSING)
            if now is not value and not _wraps(now, value):
                out.append(f"{label}.{name}")
        return sorted(out)

    def restore(self) -> None:
        for (owner, _label, name), value in self.saved.items():
            if vars(owner).get(name, _MISSING) is not value:
                try:
                    setattr(owner, name, value)
                except (AttributeError, TypeError):
                    pass


_MISSING = object()


def _wraps(new: Any, old: Any) -> bool:
    """torch's own lazy wrappers (dynamo's `disable`) keep the original as __wrapped__; only
    wrappers whose code lives inside torch's package are excused."""
    code = getattr(new, "__code__", None)
    if code is None or not code.co_filename.startswith(_TORCH_DIR):
        return False
    inner = new
    for _ in range(4):
        inner = getattr(inner, "__wrapped__", None)
        if inner is old:
            return True
        if inner is None:
            return False
    return False


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _is_timer(name: str) -> bool:
    return name.startswith(_TIMER_NAMES)


# -- device facts ---------------------------------------------------------------------------------

@functools.cache
def _static_device_info(index: int) -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(),
                            "torch": torch.__version__}
    if not torch.cuda.is_available():
        info.update(cuda=False, name="cpu", note="no CUDA GPU visible: CPU only")
        return info
    p = torch.cuda.get_device_properties(index)
    roof = roofline.for_device(p.name)
    info.update(cuda=True, index=index, name=p.name, capability=list(torch.cuda.get_device_capability(index)),
                sm_count=p.multi_processor_count, memory_bytes=p.total_memory,
                l2_bytes=int(getattr(p, "L2_cache_size", 0) or 0),
                memory_bandwidth=roof.bandwidth, bandwidth_source=roof.source,
                uuid=str(getattr(p, "uuid", "") or ""))  # the GPU's machine-wide turn (caller/gpu_lock.py)
    smi = _static_smi()
    if smi:
        info.update(driver=smi[0], max_sm_clock_mhz=_num(smi[1]), max_mem_clock_mhz=_num(smi[2]))
    return info


@functools.cache
def _static_smi() -> list[str] | None:
    """The driver and the maximum clocks, asked once per Worker (the GPU Worker's start already
    asked, in its CUDA-init thread: worker/early.py)."""
    return early.static_smi() or early.nvidia_smi(early.STATIC_FIELDS)


def _num(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def device_info(device: str | None = None) -> dict[str, Any]:
    """Name, capability, SMs, memory, L2, bandwidth, driver, and the clocks right now."""
    index = 0
    if device and device.startswith("cuda:"):
        index = int(device.split(":", 1)[1])
    info = dict(_static_device_info(index))
    if info.get("cuda"):
        smi = early.nvidia_smi("clocks.sm,clocks.mem,temperature.gpu,power.draw")
        if smi:
            info.update(sm_clock_mhz=_num(smi[0]), mem_clock_mhz=_num(smi[1]),
                        temperature_c=_num(smi[2]), power_w=_num(smi[3]), clocks_source="nvidia-smi")
        else:
            info["clocks_source"] = "unavailable (no nvidia-smi)"
    return info


@functools.cache
def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": str(torch.version.cuda or "none")}
    try:
        out["triton"] = importlib.metadata.version("triton")  # without importing triton
    except importlib.metadata.PackageNotFoundError:
        out["triton"] = "none"
    smi = _static_smi() if torch.cuda.is_available() else None
    out["driver"] = smi[0] if smi else "none"
    return out


def _device(options: EngineOptions) -> torch.device:
    name = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# -- evaluate -------------------------------------------------------------------------------------

def evaluate(task: Task, candidate: Candidate | None, checks: list[str] | tuple[str, ...],
             options: dict[str, Any], builder: Any) -> Evaluation:
    """Compile -> verify -> bench (if correct) -> profile, as `checks` asks. Out of memory while
    other processes hold the GPU's memory: retried once when it frees, else not_run."""
    t0 = bench._perf_counter_ns()
    ev = _attempt(task, candidate, checks, options, builder)
    if ev.verdict == "oom" and (ev.device or {}).get("cuda"):
        ev = _shared_oom(ev, options, lambda: _attempt(task, candidate, checks, options, builder), t0)
    _release_after_answer()
    ev.wall_seconds = (bench._perf_counter_ns() - t0) / 1e9
    phases = (ev.evidence or {}).get("phases")
    if isinstance(phases, dict):  # the Worker's whole share of the evaluation, beside its steps
        phases["worker_total_s"] = ev.wall_seconds
    return ev


_release_pending: list[bool] = []
_answer_first: list[bool] = []   # set by the Worker's loop (answer_first): it calls after_answer


def answer_first() -> None:
    """The Worker's loop calls after_answer once each answer is written: releases wait for it."""
    _answer_first[:] = [True]


def _release_after_answer() -> None:
    """In the Worker, the GPU memory goes back once the answer is out (after_answer): its
    gc.collect costs about 0.3 s with torch and dynamo loaded, which the user would otherwise
    wait for on every save. Called in-process (tests, the CLI's CPU paths): now."""
    if _answer_first:
        _release_pending[:] = [True]
    else:
        _release_gpu_memory()


def after_answer() -> None:
    """The Worker calls this after each answer is written: what an evaluation left to do."""
    if _release_pending:
        _release_pending.clear()
        _release_gpu_memory()


def _release_gpu_memory() -> None:
    """Hand this Worker's cached GPU blocks back once an evaluation is done: an idle warm Worker
    must not hold memory another process's evaluation needs."""
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            import gc

            gc.collect()
            torch.cuda.empty_cache()
    except Exception:  # a poisoned context: the client restarts this Worker anyway
        pass


def _shared_oom(ev: Evaluation, options: dict[str, Any], again: Any, t0: int) -> Evaluation:
    """`ev` ran out of memory. If other processes hold the memory it needed, wait (bounded) for
    it to free and run once more; still out of memory while they hold it: not_run, naming them."""
    try:
        dev = _device(EngineOptions.from_dict(options))
    except OptionsError:
        return ev
    seen = gpu_share.holders(dev, ev.message)
    if seen is None:
        return ev
    source, others = seen
    free = gpu_share.free_bytes(dev)
    if not gpu_share.blames_others(ev.message, others, free):
        return ev  # alone, or the request exceeds what the others hold: the candidate's own
    elapsed = (bench._perf_counter_ns() - t0) / 1e9 - notify.paused_s()  # the caller's deadline skips turn waits
    wait_s = gpu_share.SHARED_OOM_WAIT_S
    deadline = options.get("deadline_s") if isinstance(options, dict) else None
    if isinstance(deadline, (int, float)) and deadline > 0:
        # Leave time for the retry (about as long as the first run) inside the caller's deadline.
        wait_s = max(0.0, min(wait_s, float(deadline) - 2.5 * elapsed - 5.0))
    need = gpu_share.requested_bytes(ev.message)

    def held_now() -> int | None:
        if source == "torch's out-of-memory message":
            return None  # this Worker cannot list them: free memory alone says when they let go
        if source == "free memory":
            return gpu_share.held_bytes(gpu_share.unseen_holding(dev))
        got = gpu_share.others_holding(dev)
        return None if got is None else gpu_share.held_bytes(got[1])

    freed, waited = gpu_share.wait_for_memory(need, gpu_share.held_bytes(others), wait_s,
                                              lambda: gpu_share.free_bytes(dev), held_now)
    retried = False
    first_message = ev.message
    if freed:
        retried = True
        ev = again()
        if ev.verdict != "oom":
            ev.evidence = {**(ev.evidence or {}), "shared_oom_retry": {
                "first": first_message, "waited_s": round(waited, 1), "processes": others, "source": source}}
            return ev
        again_seen = gpu_share.holders(dev, ev.message)
        others = again_seen[1] if again_seen is not None else []
        if not gpu_share.blames_others(ev.message, others, gpu_share.free_bytes(dev)):
            return ev  # they let go and it still does not fit: the candidate's own
    ev.verdict, ev.correct = "not_run", None
    ev.message = verdicts.shared_oom_reason(others, waited, retried)
    ev.evidence = {**(ev.evidence or {}), "gpu_memory_held": {
        "processes": others, "source": source, "error": first_message, "waited_s": round(waited, 1),
        "retried": retried, "requested_bytes": need}}
    return ev


def _attempt(task: Task, candidate: Candidate | None, checks: list[str] | tuple[str, ...],
             options: dict[str, Any], builder: Any) -> Evaluation:
    """One evaluation, start to end."""
    if candidate is not None and candidate.origin == "reference":
        candidate = None  # the CLI's way to time the reference alone (the protocol needs a Candidate)
    ev = Evaluation(task=task.name, candidate=candidate.id if candidate else "reference")
    try:
        opts = EngineOptions.from_dict(options)
    except OptionsError as exc:
        ev.verdict, ev.message = "error", f"harness: {exc}"
        return ev
    dev = _device(opts)
    ev.device = device_info(str(dev) if dev.type == "cuda" else None)
    ev.versions = versions()
    integrity = Integrity()
    extra: dict[str, Any] = {}
    notes: list[str] = []
    with build_failure.watch() as builds, _evaluating(ev, integrity, extra, notes):
        _evaluate(task, candidate, set(checks), opts, builder, dev, ev, integrity, extra, notes)
    if candidate is not None:  # a build that failed in __init__ or forward is a compile_error too
        build_failure.settle(ev, builds, candidate.source, _candidate_file(task, candidate), notes,
                             same_file=candidate.source == task.reference_source)
        _explain_launch(ev, candidate, dev)
    if notify.turns_taken():  # where this evaluation stopped for the GPU's turn, and for how long
        extra["turns"] = notify.turns_taken()
        extra.setdefault("phases", {})["handed_over_s"] = notify.paused_s()
    _finish(ev, extra, notes, candidate, accept_less_accurate=opts.accept_less_accurate)
    return ev


def _candidate_file(task: Task, candidate: Candidate) -> str:
    """The file name the candidate's build reports its own lines under (a .cu under #line)."""
    if candidate.kind == "cuda":
        return task.cuda_path or task.reference_path.replace(".py", ".cu")
    return ""


@contextlib.contextmanager
def _evaluating(ev: Evaluation, integrity: Integrity, extra: dict[str, Any], notes: list[str]) -> Any:
    """What the candidate raised past the stages' own handling, as the Evaluation's verdict."""
    try:
        yield
    except HarnessError as exc:
        ev.verdict, ev.correct, ev.message = "error", None, f"harness: {exc}"
    except CandidateError as exc:
        ev.verdict, ev.correct, ev.message = "error", False, str(exc)
    except torch.OutOfMemoryError as exc:
        ev.verdict, ev.correct, ev.message = "oom", False, f"out of memory: {str(exc).splitlines()[0][:200]}"
    except Exception as exc:  # anything the candidate raised past the stages' own handling
        ev.verdict, ev.correct = "error", False
        ev.message = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    finally:
        _check_integrity(integrity, ev, extra, notes)
        integrity.restore()


def _check_integrity(integrity: Integrity, ev: Evaluation, extra: dict[str, Any], notes: list[str]) -> None:
    changed = integrity.changed()
    if not changed:
        return
    extra["tampered"] = changed
    if all(_is_timer(n) for n in changed):
        ev.flags.append("timer_patch")
        notes.append("the candidate replaced timer functions (" + ", ".join(changed[:5])
                     + "); the numbers here come from timers captured before it loaded")
        return
    ev.flags.append("tampering")
    ev.verdict, ev.correct = "error", False
    ev.time = ev.eager = ev.compiled = None
    ev.message = ("the candidate replaced functions the evaluator relies on ("
                  + ", ".join(changed[:5]) + "): its results cannot be trusted")


def custom_kernel(candidate: Candidate | None, flags: list[str]) -> bool | None:
    """Does the candidate's speed come from its own kernel? False for a PyTorch rewrite, and for
    a custom kernel beside PyTorch ops doing the reference's work (partial fallback)."""
    if candidate is None:
        return None
    if "torch_fallback" in flags:
        return False
    return candidate.kind == "cuda" or static_checks.has_kernel(candidate.source)


def _finish(ev: Evaluation, extra: dict[str, Any], notes: list[str], candidate: Candidate | None = None,
            accept_less_accurate: bool = False) -> None:
    ev.flags = sorted(set(ev.flags))
    ev.custom_kernel = custom_kernel(candidate, ev.flags)
    bad = disqualified_by(ev.flags, accept_less_accurate)
    if bad:
        ev.flags.append("not_counted")
        if ev.verdict == "correct":
            ev.message += f"; not counted ({', '.join(bad)})"
    elif ev.verdict == "correct" and ev.custom_kernel is False:
        ev.message += f"; a {PYTORCH_REWRITE}"
    if notes:
        extra["notes"] = notes
    if extra:
        ev.evidence = {**(ev.evidence or {}), **extra}


def _evaluate(task: Task, candidate: Candidate | None, checks: set[str], options: EngineOptions,
              builder: Any, dev: torch.device, ev: Evaluation, integrity: Integrity,
              extra: dict[str, Any], notes: list[str]) -> None:
    seed = options.seed
    if candidate is not None:
        findings = static_checks.scan(candidate.source, candidate.kind, task.reference_source)
        if findings:
            extra["static"] = findings
            ev.flags += static_checks.flags(findings)
    if candidate is not None and candidate.kind == "cuda" and not checks & {"verify", "bench", "profile"}:
        # Only a build was asked for: the compiler is the test, no reference or harness needed
        # (repairing a compile error in a .cu that has no harness yet), and no GPU either.
        filename = task.cuda_path or task.reference_path.replace(".py", ".cu")
        lib, result = builder.load_cuda(candidate.source, filename, options.raw)
        ev.compile = result
        if lib is None:
            ev.verdict, ev.correct = "compile_error", False
            first = next((d for d in result.diagnostics if d.severity == "error"), None)
            ev.message = f"does not build: {first.message}" if first else "does not build"
        else:
            ev.verdict, ev.message = "not_run", "built" + ("" if result.ok else " with errors")
        return
    if dev.type == "cuda" and not torch.cuda.is_available():
        ev.verdict, ev.message = "not_run", NO_GPU if candidate is not None and candidate.kind == "cuda" else NO_GPU_TASK
        return
    h = Harness(task, candidate, builder, device=dev, seed=seed, build_options=options.raw)
    t_phase = bench._perf_counter_ns()
    h.load_reference()
    h.build_model()
    _phase(extra, "reference_s", t_phase)

    if candidate is None:
        ev.verdict, ev.message = "not_run", "the reference alone"
        if "bench" in checks:
            _bench(h, options, ev, extra, notes, candidate_too=False)
        if "profile" in checks:
            ev.profile = _profile(h, task, None, options, dev)
        return

    threads_before = set(threading.enumerate())
    t_phase = bench._perf_counter_ns()
    with _thread_origins():
        fn, result = h.build_candidate()
    _phase(extra, "build_candidate_s", t_phase)
    ev.compile = result
    if fn is None:
        ev.verdict, ev.correct = "compile_error", False
        first = next((d for d in result.diagnostics if d.severity == "error"), None)
        ev.message = f"does not build: {first.message}" if first else "does not build"
        return
    if candidate.kind == "cuda" and dev.type != "cuda":
        ev.verdict, ev.message = "not_run", f"built; {NO_GPU}"
        return
    if not checks & {"verify", "bench"}:
        ev.verdict, ev.message = "not_run", "built" + ("" if result.ok else " with errors")
        if "profile" in checks:
            ev.profile = _profile(h, task, candidate, options, dev)
        return

    t_phase = bench._perf_counter_ns()
    paused = notify.paused_s()
    with _thread_origins():
        vr = verify(h, options)
    _phase(extra, "verify_s", t_phase)
    extra["phases"]["verify_s"] -= notify.paused_s() - paused  # turn points inside verify: not its time
    # Python threads the candidate left running (the baselines' own compile threads come later;
    # threads torch starts for itself, like torch.compile's compile pool, are not the candidate's,
    # nor the engine's own extension-build pool once idle).
    ours = _idle_build_threads(builder)
    started = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()
               and not _started_by_torch(t) and t not in ours]
    if started:
        ev.flags.append("thread_started")
        notes.append("the candidate left threads running: work may escape the timers ("
                     + ", ".join(_thread_origin(t) for t in started[:4]) + ")")
    ev.verdict, ev.correct = vr.verdict, vr.correct
    ev.message, ev.evidence = vr.message, vr.evidence
    ev.accuracy = vr.accuracy
    ev.flags += vr.flags
    notes += vr.notes
    if vr.fallback_ops:
        extra["fallback_ops"] = vr.fallback_ops
    if vr.memory:
        extra["memory"] = vr.memory  # where verify kept its data (worker/judge/memory_plan.py)
    if vr.verdict in ("error", "oom") and vr.correct is False:
        ev.correct = False
    if ev.verdict != "correct":
        ev.correct = False
        return
    # Timers put back before timing (bench does not use them, but torch internals might).
    _check_integrity(integrity, ev, extra, notes)
    integrity.restore()
    if ev.verdict != "correct":
        return
    if checks & {"bench", "profile"}:
        _turn_point("verify", ev, extra, notes, integrity)  # the GPU may go to a waiting process
        if ev.verdict != "correct":
            return
    if "bench" in checks:
        _bench(h, options, ev, extra, notes, candidate_too=True, integrity=integrity, verified=vr)
    if "profile" in checks:
        ev.profile = _profile(h, task, candidate, options, dev)


def _turn_point(stage: str, ev: Evaluation, extra: dict[str, Any], notes: list[str],
                integrity: Integrity | None) -> float:
    """A safe point between stages, where the caller may hand the GPU's machine-wide turn to a
    waiting process (notify.turn_point; only when the request asked for it). Never inside a
    timing run or a tamper-check window: the candidate ran nothing since the last check, and a
    thread of its own that changed something while this Worker waited is caught by the check
    made right after. The seconds waited (0 when the request did not ask); `_attempt` puts the
    turn points' record (notify.turns_taken) in the evidence."""
    waited = notify.turn_point(stage)
    if waited is None:
        return 0.0
    if integrity is not None:
        _check_integrity(integrity, ev, extra, notes)
        integrity.restore()
    return waited


def _phase(extra: dict[str, Any], name: str, t0_ns: int) -> None:
    """Seconds a step of this evaluation took (evidence["phases"]: where an evaluation's time goes)."""
    extra.setdefault("phases", {})[name] = (bench._perf_counter_ns() - t0_ns) / 1e9


def _explain_launch(ev: Evaluation, candidate: Candidate, dev: torch.device) -> None:
    """A failed launch that asked for too much shared memory: say which limit it passed."""
    if dev.type != "cuda" or ev.verdict not in ("error", "unwritten_output"):
        return
    try:
        props = torch.cuda.get_device_properties(dev)
        limits = launch_limits.Limits(
            per_block=int(getattr(props, "shared_memory_per_block", 48 << 10) or 48 << 10),
            per_block_optin=int(getattr(props, "shared_memory_per_block_optin", 0)
                                or getattr(props, "shared_memory_per_block", 48 << 10) or 48 << 10),
            device=str(props.name))
    except Exception:
        return
    static = {r.kernel: r.shared_bytes for r in (ev.compile.resources if ev.compile else [])}
    why = launch_limits.explain(ev.message, candidate.source, static, limits,
                                definite_only=ev.verdict == "unwritten_output")
    if why:
        ev.message = (f"{ev.message} - {why}" if ev.verdict == "error"
                      else f"{ev.message}; likely cause: {why}")
        ev.evidence = {**(ev.evidence or {}), "launch_limits": why}


_STDLIB_DIR = os.path.dirname(threading.__file__) + os.sep


@contextlib.contextmanager
def _thread_origins() -> Any:
    """Record on each Thread started meanwhile where it was started from."""
    import traceback

    real = threading.Thread.start

    def start(self: threading.Thread, *args: Any, **kw: Any) -> Any:
        self._kernel_lsp_origin = traceback.extract_stack(limit=64)  # type: ignore[attr-defined]
        return real(self, *args, **kw)

    threading.Thread.start = start  # type: ignore[method-assign]
    try:
        yield
    finally:
        threading.Thread.start = real  # type: ignore[method-assign]


def _idle_build_threads(builder: Any) -> set[threading.Thread]:
    """The builder's own extension-build threads (build.idle_own_threads): a load_inline built
    during the candidate's load starts them, and they stay, idle. Every corpus candidate built
    in-process was flagged thread_started (not counted) before this, on the H200."""
    own = getattr(builder, "idle_own_threads", None)
    return set(own()) if own is not None else set()


def _started_by_torch(t: threading.Thread) -> bool:
    """The innermost caller outside the standard library (threading, concurrent.futures) that
    started `t` is torch's own code."""
    origin = getattr(t, "_kernel_lsp_origin", None)
    if not origin:
        return False
    for frame in reversed(origin[:-1]):  # [-1] is the recording wrapper itself
        if frame.filename.startswith(_STDLIB_DIR):
            continue
        return frame.filename.startswith(_TORCH_DIR)
    return False


def _thread_origin(t: threading.Thread) -> str:
    """A thread's name and the file its code runs in (where it was started from is gone)."""
    import traceback

    frame = sys._current_frames().get(t.ident or -1)
    files = [f.filename for f in traceback.extract_stack(frame)] if frame is not None else []
    return f"{t.name} in {files[0] if files else '?'}"


def _timing_sets(h: Harness, options: EngineOptions) -> list[list[Any]]:
    first = h.make_inputs(h.seed)
    per_set = max(1, tensor_bytes(first.values))
    limit = options.rotate_bytes
    n = max(1, min(options.rotate_sets, limit // per_set))
    return [first.values] + [h.make_inputs(h.seed + i).values for i in range(1, n)]


def _bench(h: Harness, options: EngineOptions, ev: Evaluation, extra: dict[str, Any], notes: list[str],
           candidate_too: bool, integrity: Integrity | None = None, verified: VerifyResult | None = None) -> None:
    """Time the candidate (when `candidate_too`) and the baselines. `verified`: the candidate's
    verify, whose facts (bytes, FLOPs, sets checked) the speed of light uses."""
    if h.device.type != "cpu":
        return _bench_on(h, options, ev, extra, notes, candidate_too, integrity, verified)
    # CPU: a fixed thread count for candidate and baselines alike; on a busy machine intra-op
    # barriers otherwise stall for whole scheduler slices (30-60 ms outliers seen on 2 cores).
    before = torch.get_num_threads()
    torch.set_num_threads(options.cpu_threads)
    try:
        return _bench_on(h, options, ev, extra, notes, candidate_too, integrity, verified)
    finally:
        torch.set_num_threads(before)


def _settle(options: EngineOptions, baselines_too: bool) -> bench.Settle | None:
    """When the timing may stop early (bench.Settle); baselines that will be kept get twice the
    minimum time. None: the whole budget (bench_precision_pct = 0)."""
    if options.bench_precision_pct <= 0:
        return None
    return bench.Settle(min_s=options.bench_min_seconds * (2.0 if baselines_too else 1.0),
                        precision_pct=options.bench_precision_pct)


def _bench_on(h: Harness, options: EngineOptions, ev: Evaluation, extra: dict[str, Any], notes: list[str],
              candidate_too: bool, integrity: Integrity | None = None,
              verified: VerifyResult | None = None) -> None:
    dev = h.device
    t_phase = bench._perf_counter_ns()
    sets = _timing_sets(h, options)
    _phase(extra, "timing_inputs_s", t_phase)  # seconds on the host for the largest Tasks' draws
    assert h.model is not None
    sharing = gpu_share.Watch(dev)   # other processes on this GPU while we time
    phases = extra.setdefault("phases", {})
    t_phase = bench._perf_counter_ns()
    paused = 0.0  # seconds waited at a turn point inside torch_compile_s's span
    # Baselines are the reference's: kept ones are used as they are (no torch.compile at all);
    # measured ones are timed interleaved with the candidate, so drift shows in both.
    plan = kept_baselines.plan(h.task.reference_source, h.init_inputs, sets, dev, options)
    use_kept = options.baselines and plan.match is not None
    measure = options.baselines and not use_kept
    if measure and candidate_too and options.early_result and notify.active() and plan.key not in _COMPILED_AHEAD:
        # torch.compile's first compilation (10-40 s for a new reference) is all that is left to
        # know: the verdict and the eager ratio go to the caller now (kept baselines: nothing
        # is pending, the answer comes at once). Not when this Worker compiled the same baselines
        # ahead (prepare_reference): the compile is then a cache hit of about a second, less than
        # the early timing would add to the complete answer (KernelBench's LayerNorm on an H100:
        # early timing 1.22 s, torch.compile 1.30 s).
        _early_result(h, sets, options, ev, extra, notes, integrity)
        if ev.verdict != "correct":
            return
        paused += _turn_point("early_timing", ev, extra, notes, integrity)
        if ev.verdict != "correct":
            return
    # torch.compile compiles here, after verify, not in a thread while verify runs: dynamo's
    # tracing would run beside candidate code in this one process (its frame hook and lazy
    # imports land inside the tamper check's window, and a candidate's fault would be blamed on
    # either), and its first calls and autotuning would share the GPU with verify's runs and
    # memory plan. The server compiles a new reference ahead in the Worker's idle time instead
    # (prepare_reference); a kept baseline skips it altogether.
    waited_before = notify.paused_s()
    compiled_fn = _compile_reference(h, sets, options, notes, ev) if measure else None
    paused += notify.paused_s() - waited_before  # the GPU lent while it compiled, waited for back
    phases["torch_compile_s"] = (bench._perf_counter_ns() - t_phase) / 1e9 - paused  # not the GPU handed over
    extra["torch_compile_ran"] = measure  # False: kept baselines, torch.compile never called (a fact, not a time)
    if integrity is not None:  # torch.compile's lazy imports are ours; the candidate ran nothing since verify
        integrity.rebase()
    if measure:  # torch.compile took its seconds (10-40 s for a new reference): a turn point
        _turn_point("torch_compile", ev, extra, notes, integrity)
        if integrity is not None and ev.verdict != "correct":
            return
    lead_us = _lead_us(h, sets, dev, plan, compiled_fn)
    fns: list[Any] = ([h.candidate_fn] if candidate_too else []) + ([h.model] if measure else []) \
        + ([compiled_fn] if compiled_fn is not None else [])
    t_phase = bench._perf_counter_ns()
    results: list[bench.BenchResult | None] = []
    while fns:
        try:
            results = list(bench.time_interleaved(
                fns, sets, dev, warmup=options.warmup, min_runs=options.runs, max_runs=options.max_runs,
                budget_s=options.bench_seconds, lead_us=lead_us, settle=_settle(options, measure)))
            break
        except bench.TimedCallError as exc:
            if candidate_too and exc.index == 0:
                ev.verdict = "oom" if isinstance(exc.exc, torch.OutOfMemoryError) else "error"
                ev.correct = False
                ev.message = f"the candidate raised while timed: {type(exc.exc).__name__}: {str(exc.exc)[:200]}"
                return
            if compiled_fn is not None and fns[exc.index] is compiled_fn:  # reported, not fatal
                notes.append(f"torch.compile baseline failed while timed: {exc}"[:300])
                ev.flags.append("compile_baseline_failed")
                fns.remove(compiled_fn)
                compiled_fn = None
                continue
            raise exc.exc  # the reference itself raised: a harness error
    phases["timing_s"] = (bench._perf_counter_ns() - t_phase) / 1e9
    if candidate_too:
        res = results.pop(0)
        assert res is not None and h.candidate_fn is not None
        bench.check_side_streams(h.candidate_fn, sets, dev, res)
        ev.time = res.timing
        ev.flags += res.flags
        notes += res.notes
        if "side_stream_work" in res.flags and "side_stream" not in ev.flags:
            # Seen running, whatever the source scan missed (a stream made in a prebuilt library):
            # work off the caller's stream races with it, and is not credited.
            ev.flags.append("side_stream")
        sharing.sample()
        if res.timing.spread_pct > NOISY_SPREAD_PCT:  # a warning on the number, not on the candidate
            ev.flags.append("noisy")
            notes.append(f"the timing's spread is {res.timing.spread_pct:.1f} % (above {NOISY_SPREAD_PCT:.0f} %): "
                         "the speedup is not a reliable number")
        if res.event_timing and res.streams_timing:
            extra["timing_methods"] = {"events_ms": res.event_timing.median_ms,
                                       "all_streams_ms": res.streams_timing.median_ms}
            extra["side_streams"] = res.side_streams
        t_probe = bench._perf_counter_ns()
        _cache_probe(h, res.timing, options, ev, notes)
        _phase(extra, "cache_probe_s", t_probe)
        if integrity is not None:  # the candidate's part ends here
            _check_integrity(integrity, ev, extra, notes)
            integrity.restore()
            integrity.rebase()
            if ev.verdict != "correct":
                return
    elif results and dev.type != "cuda":
        notes += results[0].notes
    if use_kept:
        ev.eager, ev.compiled = plan.eager, plan.compiled
        ev.baselines = kept_baselines.used(plan)
        for flag in ev.baselines.get("flags") or []:
            if flag not in ev.flags:
                ev.flags.append(flag)
        notes += list(ev.baselines.get("notes") or [])
    elif measure:
        ev.eager = results[0].timing if results else None
        ev.compiled = results[1].timing if compiled_fn is not None and len(results) > 1 else None
        failed = [f for f in ev.flags if f == "compile_baseline_failed"]
        b_notes = [n for n in notes if n.startswith("torch.compile baseline failed")]
        ev.baselines = {**kept_baselines.record(plan, ev.eager, ev.compiled, lead_us, b_notes, failed,
                                                interleaved=candidate_too),
                        "cached": False, "keep": plan.key is not None, "why": plan.why}
        noisy = kept_baselines.too_noisy(ev.eager, ev.compiled, options)
        if noisy:
            ev.baselines["keep"], ev.baselines["why"] = False, noisy
    elif candidate_too:
        ev.baselines = None  # not asked for (a Search's later candidates)
    shared = sharing.finish()
    if shared is not None:
        # Their work slows ours and widens the spread; it says nothing about the candidate.
        timed = ev.time or ev.eager
        shared["spread_pct"] = timed.spread_pct if timed is not None else None
        ev.shared_gpu = shared
        if ev.baselines is not None and not ev.baselines.get("cached"):
            ev.baselines["keep"] = False  # measured beside other processes: not a number to keep
            ev.baselines["why"] = "not kept: other processes used the GPU while they were timed"
        notes.append(f"timed on a shared GPU: {shared['count']} other process(es) used it "
                     f"({shared['source']})" + (f"; spread {shared['spread_pct']:.1f} %"
                                                if shared["spread_pct"] is not None else ""))
    if dev.type == "cuda" and ev.eager is not None and ev.eager.median_ms < 0.02:
        ev.flags.append("launch_overhead_sized")
        notes.append("the reference takes under 20 us: launch overhead dominates, speedups mean little")
    if dev.type == "cuda" and (ev.time is not None if candidate_too else ev.eager is not None):
        # Speed of light, the bytes floor and the algebraic shortcut (worker/timing/light.py).
        if verified is None:
            read, written, flops = light.reference_traffic(h)
            own, sets_checked = None, 0
        else:
            read, written = verified.read_bytes or verified.input_bytes, verified.output_bytes
            flops, own, sets_checked = verified.flops, verified.candidate_flops, verified.sets_checked
        light.assess(h, ev, extra, notes, _first_dtype(h, sets), candidate_too, read, written, flops, own,
                     sets_checked)


def _early_result(h: Harness, sets: list[list[Any]], options: EngineOptions, ev: Evaluation,
                  extra: dict[str, Any], notes: list[str], integrity: Integrity | None) -> None:
    """Time the candidate and eager now, before torch.compile compiles, and send the caller a
    partial Evaluation: its verdict, message, both timings with their spreads, and
    `compiled_pending`. Timed as the final numbers are (the same interleaved loop: CUDA events,
    L2 flushed, the same warm-up, runs, budget and settle rule); the GPU lead covers eager's
    host time, where the final one also covers torch.compile's (not known yet). The final
    timing is not changed by this one: it runs afterwards, as it would without it."""
    dev = h.device
    t_phase = bench._perf_counter_ns()
    lead_us = bench.lead_for([bench.host_us(h.model, sets, dev)]) if dev.type == "cuda" else None
    try:
        cand, eager = bench.time_interleaved(
            [h.candidate_fn, h.model], sets, dev, warmup=options.warmup, min_runs=options.runs,
            max_runs=options.max_runs, budget_s=options.bench_seconds, lead_us=lead_us,
            settle=_settle(options, True))
    except bench.TimedCallError:
        return  # the final timing meets it again and reports it, as it does today
    finally:
        _phase(extra, "early_timing_s", t_phase)
    if integrity is not None:  # the candidate ran: judged now, before torch.compile's imports are rebased
        _check_integrity(integrity, ev, extra, notes)
        integrity.restore()
        if ev.verdict != "correct":
            return
    part = Evaluation.from_dict(ev.to_dict())
    part.time, part.eager, part.compiled, part.compiled_pending = cand.timing, eager.timing, None, True
    part.flags = list(part.flags) + [f for f in cand.flags if f not in part.flags]
    if cand.timing.spread_pct > NOISY_SPREAD_PCT:
        part.flags.append("noisy")
    part.baselines = {"cached": False, "interleaved": True, "keep": False, "pending": ["torch.compile"],
                      "why": "torch.compile pending (compiling)"}
    _finish(part, dict(extra), list(notes) + list(cand.notes), h.candidate,
            accept_less_accurate=options.accept_less_accurate)
    sent = notify.send(protocol.PARTIAL_EVALUATION, part.to_dict())
    extra["early_result"] = {"sent": sent, "time_ms": cand.timing.median_ms, "eager_ms": eager.timing.median_ms,
                             "lead_us": lead_us}


def _first_dtype(h: Harness, sets: list[list[Any]]) -> str:
    """The Task's dtype: its first parameter's, else its first floating input's (of a timing set
    already drawn: drawing one more costs seconds on the largest Tasks)."""
    for p in list(h.model.parameters())[:1] if h.model is not None else []:
        return str(p.dtype)
    for v in sets[0] if sets else []:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return str(v.dtype)
    return "torch.float32"


def _cache_probe(h: Harness, timing: Timing, options: EngineOptions, ev: Evaluation, notes: list[str]) -> None:
    """Calls on never-seen inputs should take about as long as the timed ones; a cache keyed on
    values makes the rotated, repeated timing inputs look much faster."""
    if not options.cache_probe or h.candidate_fn is None:
        return
    # Never-seen inputs interleaved with an already-timed set: bursts of machine noise hit both.
    seen = h.make_inputs(h.seed).values
    # Seven fresh sets; fewer above 1 GiB of inputs a set (at least 2): a 6 GiB softmax's seven
    # would hold 42 GiB and take a minute to make on the CPU.
    per_set = max(1, tensor_bytes(seen))
    fresh = [h.make_inputs(h.seed + 50_000 + i).values for i in range(max(2, min(7, (7 << 30) // per_set)))]
    order = [s for f in fresh for s in (f, seen)]
    samples = bench.time_each(h.candidate_fn, order, h.device)
    new_ms = sorted(samples[0::2])[len(fresh) // 2]
    old_ms = sorted(samples[1::2])[len(fresh) // 2]
    if new_ms > 3 * old_ms + 0.05:
        ev.flags.append("result_cache_suspected")
        notes.append(f"calls on new inputs took {new_ms:.4g} ms against {old_ms:.4g} ms on a repeated "
                     "input set: results look cached by value")


def _compile_reference(h: Harness, sets: list[list[Any]], options: EngineOptions, notes: list[str],
                       ev: Evaluation) -> Any:
    """torch.compile of the reference, compiled (and run once on every timing set, so no
    recompile lands in the timed calls) before any timing; None when it fails (reported).
    Inside an evaluation's GPU turn (its request asked for turn points), compiled first without
    running anything, between the turn points that let the caller lend the GPU meanwhile
    (worker/timing/dry_compile.py)."""
    mode = options.compile_mode
    try:
        import torch._inductor.config as inductor_config

        from kernel_lsp.engine.worker.inductor_code import mode_threads

        # torch.compile compiles at the first call: max-autotune's GEMM precompile on all CPUs
        with torch.no_grad(), inductor_config.patch(mode_threads(mode)):
            compiled = None
            if sets and h.device.type == "cuda" and notify.turns_asked() and not dry_compile.why_not(mode):
                compiled = _compile_without_gpu(h, mode, sets[0], notes)
            if compiled is None:
                compiled = torch.compile(h.model, mode=None if mode == "default" else mode)
            for args in sets:
                compiled(*args)
        return compiled
    except Exception as exc:  # a compile failure is reported, not fatal
        notes.append(f"torch.compile baseline failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        ev.flags.append("compile_baseline_failed")
        return None


def _compile_without_gpu(h: Harness, mode: str, args: list[Any], notes: list[str]) -> Any:
    """torch.compile of the reference, its first graph compiled with the GPU lent (TURN_CPU_START)
    and taken back (TURN_CPU_END) before anything runs on it; live once returned. None, with a
    note, when that compile failed: the caller then compiles the plain way inside the turn, which
    reports a failure of the reference's own as before. No tamper check at these two points: the
    candidate ran nothing since verify's last one, and torch.compile's own imports are rebased
    right after (_bench_on). A forward that dynamo does not trace at all runs its ops here, with
    the GPU lent (rare: KernelBench references trace; noted when it happens)."""
    if os.environ.get(dry_compile.OFF_ENV) == "0":
        return None
    notify.turn_point(protocol.TURN_CPU_START)
    try:
        dry = dry_compile.DryRun(mode)
        compiled = torch.compile(h.model, backend=dry)
        compiled(*args)
    except dry_compile.NotRun:
        dry.live = True
        return compiled
    except Exception as exc:  # noqa: BLE001 - the plain compile follows and says what it says
        notes.append(f"torch.compile compiled inside the GPU's turn: compiling without it failed "
                     f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})")
        return None
    finally:
        notify.turn_point(protocol.TURN_CPU_END)
    dry.live = True  # no graph at all (a forward dynamo skips): nothing held back, and it ran
    notes.append("torch.compile found no graph in the reference's forward: it ran once while the GPU was lent")
    return compiled


def _lead_us(h: Harness, sets: list[list[Any]], dev: torch.device, plan: Any, compiled_fn: Any) -> float | None:
    """The GPU busy-wait before each timed call: the kept one (the candidate is then timed as
    its baselines were), else enough for the slowest baseline's host time (bench.lead_for)."""
    if dev.type != "cuda":
        return None
    if plan.match is not None and isinstance(plan.match.get("lead_us"), (int, float)):
        return float(plan.match["lead_us"])
    hosts = [bench.host_us(h.model, sets, dev)]
    if compiled_fn is not None:
        hosts.append(bench.host_us(compiled_fn, sets, dev))
    return bench.lead_for(hosts)


def _profile(h: Harness, task: Task, candidate: Candidate | None, options: EngineOptions,
             dev: torch.device) -> dict[str, Any]:
    top = options.top
    inputs = h.make_inputs(h.seed).values
    out: dict[str, Any] = {}
    assert h.model is not None
    try:
        out["reference"] = profile_mod.hot_ops(h.model, inputs, dev, top=top)
    except Exception as exc:
        out["reference"] = {"note": f"torch.profiler failed: {type(exc).__name__}: {exc}"}
    if candidate is None:
        return out
    if dev.type == "cuda" and options.ncu:
        out["candidate"] = profile_mod.ncu_profile(task, candidate, options.raw)
        if out["candidate"].get("kernels"):
            return out
    if h.candidate_fn is not None:
        try:
            hot = profile_mod.hot_ops(h.candidate_fn, inputs, dev, top=top)
            if "candidate" in out:
                hot["note"] = out["candidate"].get("note", "")
            out["candidate"] = hot
        except Exception as exc:
            out["candidate"] = {"note": f"torch.profiler failed: {type(exc).__name__}: {exc}"}
    return out


def prepare_compile(options: dict[str, Any]) -> dict[str, Any]:
    """torch.compile's one-time costs, paid before any save needs them (the server asks right
    after the Worker starts): inductor and Triton imported and their caches warm, by compiling a
    small function of our own and running it once (in-process: a Worker compiles on one thread,
    caller/process.py says why). Nothing of a Task is touched."""
    t0 = bench._perf_counter_ns()
    dev = _device(EngineOptions.from_dict(options))
    if dev.type == "cuda" and not torch.cuda.is_available():
        return {"state": "skipped", "why": NO_GPU_TASK}
    try:
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2.0 + 1.0)
        with torch.no_grad():
            fn(torch.randn(1024, device=dev))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception as exc:  # noqa: BLE001 - a baseline that cannot compile says so when it is timed
        return {"state": "failed", "why": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"state": "compiled", "seconds": (bench._perf_counter_ns() - t0) / 1e9}


def _reference_only(task: Task, opts: EngineOptions, builder: Any, device: Any) -> Harness | None:
    """A Harness of the Task's reference alone, for the Worker's requests outside an evaluation:
    a file that also holds a ModelNew is loaded with only the reference's statements
    (protocol.reference_only_source), so no candidate is built or run. None when it does not parse."""
    import dataclasses

    from kernel_lsp.engine.protocol import reference_only_source

    own = reference_only_source(task.reference_source)
    if own is None:
        return None
    return Harness(dataclasses.replace(task, reference_source=own), None, builder, device=device, seed=opts.seed,
                   build_options=opts.raw)


def task_need(task: Task, options: dict[str, Any], builder: Any) -> dict[str, Any]:
    """The Worker's `task_need` request, sent before the GPU turn while another process holds
    it: what this Task's evaluation needs on the GPU (memory_plan.turn_need) from its sizes on
    the meta device, which the waiter shows the holder (caller/gpu_lock.may_hand_over). Only the
    reference's statements run (_reference_only), and no tensor is made; whatever they replaced
    of the functions the judgement trusts is put back. {"why": ...} when it cannot say."""
    from kernel_lsp.engine.worker.judge import memory_plan

    try:
        opts = EngineOptions.from_dict(options)
    except OptionsError as exc:
        return {"why": str(exc)}
    if _device(opts).type != "cuda":
        return {"why": "not a GPU Task"}
    h = _reference_only(task, opts, builder, "meta")
    if h is None:
        return {"why": "the reference does not parse"}
    integrity = Integrity()
    try:
        sizes = h.meta_sizes()
    except HarnessError as exc:
        return {"why": str(exc)[:300]}
    finally:
        integrity.restore()
    if sizes is None:
        return {"why": "get_inputs() does not run on the meta device"}
    return {**sizes, "need_bytes": memory_plan.turn_need(sizes["input_bytes"], sizes["output_bytes"],
                                                         sizes["param_bytes"])}


# Baseline keys (timing/baselines.plan) whose torch.compile this Worker compiled ahead
# (prepare_reference): its caches hold their graphs and kernels, so an evaluation's own compile of
# them is short and no early result is sent first (_bench_on).
_COMPILED_AHEAD: set[str] = set()


def prepare_reference(task: Task, options: dict[str, Any], builder: Any) -> dict[str, Any]:
    """The Worker's `prepare_reference` request, sent while the CPU pool builds a candidate: the
    reference's torch.compile baseline compiled and run once on the timing inputs, then dropped.
    The evaluation that follows makes its own (a fresh model, compiled again, nothing of this one
    reused) but finds dynamo and inductor imported and their caches (FX graphs, Triton kernels)
    filled. Nothing is timed and no ModelNew is built: a file that also holds one is loaded with
    only the reference's statements (protocol.reference_only_source), and whatever its code
    replaced of the functions the judgement trusts is put back. Skipped when a kept baseline
    matches."""
    t0 = bench._perf_counter_ns()
    opts = EngineOptions.from_dict(options)
    if not opts.baselines:
        return {"state": "skipped", "why": "baselines are off"}
    dev = _device(opts)
    if dev.type == "cuda" and not torch.cuda.is_available():
        return {"state": "skipped", "why": NO_GPU_TASK}
    h = _reference_only(task, opts, builder, dev)
    if h is None:
        return {"state": "skipped", "why": "the reference does not parse"}
    integrity = Integrity()
    try:
        h.load_reference()
        h.build_model()
        sets = _timing_sets(h, opts)
        plan = kept_baselines.plan(task.reference_source, h.init_inputs, sets, dev, opts)
        if plan.match is not None:
            return {"state": "skipped", "why": "a kept baseline matches"}
        notes: list[str] = []
        compiled = _compile_reference(h, sets, opts, notes, Evaluation(task=task.name, candidate="reference"))
        state = "compiled" if compiled is not None else "failed"
        if compiled is not None and plan.key is not None:
            _COMPILED_AHEAD.add(plan.key)
        return {"state": state, "notes": notes, "seconds": (bench._perf_counter_ns() - t0) / 1e9}
    finally:
        integrity.restore()
        h = None  # noqa: F841 - the model and inputs go before the memory is handed back
        _release_after_answer()


def profile(task: Task, candidate: Candidate | None, options: dict[str, Any], builder: Any) -> dict[str, Any]:
    """The Worker's `profile` request: hot ops of the reference, and the candidate's kernels."""
    ev = evaluate(task, candidate, ["compile", "profile"], options, builder)
    if ev.profile is None:
        return {"verdict": ev.verdict, "message": ev.message}
    return ev.profile
