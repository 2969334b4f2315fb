"""``Engine``: asks a Worker for work and waits for it (no torch here, never blocks the loop).

The Engine starts a Worker subprocess on demand (``python -m kernel_lsp.engine.worker``,
through ``process.WorkerProcess``: allowlisted environment, sandbox), keeps it warm, and
sends it one request at a time. A request past its deadline, a Worker that dies, or a
cancelled caller ends that Worker (its whole process group and sandbox: it may be
mid-kernel or mid-nvcc); the next request starts a fresh one. Candidate faults come back
as Evaluations, never as exceptions; ``sandbox.SandboxUnavailable`` (``sandbox =
"required"`` where none can run) is raised, as no candidate may run then.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import hashlib
import inspect
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from kernel_lsp.engine import protocol
from kernel_lsp.engine.caller import baselines as kept_baselines
from kernel_lsp.engine.caller import gpu_lock
from kernel_lsp.engine.caller import keeper as keeping
from kernel_lsp.engine.caller import sandbox as sandboxing
from kernel_lsp.engine.caller.pool import BuildPool
from kernel_lsp.engine.caller.process import (  # noqa: F401 - re-exported: callers import them from here
    ENV_ALLOW_EXACT,
    ENV_ALLOW_PREFIX,
    SECRET_WORDS,
    EngineTimeout,
    WorkerDied,
    WorkerProcess,
    WorkerRaised,
    compile_failure,
    default_python,
    looks_secret,
    worker_environment,
)
from kernel_lsp.model import Candidate, CompileResult, Evaluation, Task
from kernel_lsp.toolchain.nvcc import capability_arch

if TYPE_CHECKING:
    from kernel_lsp.store import Store

log = logging.getLogger(__name__)

Progress = Callable[[str], Any]
# Engine.evaluate's `early(partial Evaluation)`: the verdict and the eager ratio while
# torch.compile compiles (protocol.EARLY_RESULT); sync or async.
EarlyCallback = Callable[[Evaluation], Any]
# The partial-result handler of the evaluate under way in this asyncio task: read where the
# Worker is called (_call_now), so the request path between them needs no new parameter.
_ON_PARTIAL: contextvars.ContextVar[Callable[[str, dict[str, Any]], Any] | None] = \
    contextvars.ContextVar("kernel_lsp_on_partial", default=None)
# The requests that use the GPU: each takes the GPU's machine-wide turn (caller/gpu_lock.py).
PREBUILT_KEPT = 16  # builds done ahead whose results wait for their evaluation (Engine._prebuilt)
# Sizing a Task on the meta device before its turn (run.task_need) takes well under a second; a
# reference that takes longer is evaluated with its need unknown.
TASK_NEED_DEADLINE_S = 30.0
GPU_OPS = frozenset({"evaluate", "profile", "extract", "prepare_reference", "prepare_compile", "inductor_code"})
# Where an evaluation hands the GPU over (the Worker's turn points, protocol.YIELD_TURNS), for
# the progress line "handed the GPU to ... <where>; waiting for it back".
TURN_STAGES = {"verify_set": "between two of verify's input sets",
               "verify": "between verify and timing",
               "early_timing": "between the early timing and torch.compile",
               "torch_compile": "between torch.compile and the final timing"}

class Engine:
    """Runs Candidates in a Worker that owns one GPU (docs/architecture.md)."""

    def __init__(
        self,
        store: "Store | None" = None,
        python: str | None = None,
        device: int | str | None = None,
        timeout: float = 120.0,
        *,
        start_timeout: float = 300.0,
        warm: bool = True,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        pool: "BuildPool | None" = None,
        options: dict[str, Any] | None = None,
        prebuild: bool = True,
        sandbox: "str | sandboxing.Sandbox | None" = None,
        baselines: "Store | None" = None,
        keep_worker: float | None = None,
    ) -> None:
        self.store = store
        # Where eager and torch.compile times are kept between evaluations (caller/baselines.py):
        # the store's, unless a caller that records nothing (the CLI's bench) names one.
        self.baseline_store = baselines if baselines is not None else store
        self.python = python or default_python()
        self.device = device
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.warm = warm
        self.extra_env = dict(env or {})
        self.cwd = cwd
        self.options = dict(options or {})  # passed to every evaluate (e.g. {"arch": "sm_90"})
        self._pool = pool
        self._own_pool = pool is None
        # Compile in the CPU pool before taking the GPU: the build is off the deadline and
        # off the GPU queue, so concurrent evaluations overlap compiling with timing.
        self.auto_prebuild = prebuild
        self._worker: "WorkerProcess | keeping.KeptWorker | None" = None
        self._lock = asyncio.Lock()  # one GPU, one request at a time; waiters queue here
        self._reaping: set[asyncio.Task[None]] = set()
        self._device_info: dict[str, Any] | None = None
        self._prebuilds: dict[tuple[str, ...], list[Any]] = {}  # builds in flight: [future, waiters]
        # A reference's GPU need and data (one input set and its outputs) from run.task_need, by its source.
        self._needs: dict[str, tuple[int | None, int | None]] = {}
        # Builds done ahead (bench's early build and next files, a Search's batch) whose result
        # no evaluation has taken yet: the first ask after the build gets it, steps and all (the
        # pool would answer a second build with a cache hit, which says nothing of what it cost).
        self._prebuilt: collections.OrderedDict[tuple[str, ...], CompileResult] = collections.OrderedDict()
        self.restarts = 0
        self.prepare_skipped = 0  # references not compiled ahead because the GPU was busy (_get_ready)
        self.last_stderr = ""
        # The sandbox setting (None: the workspace's, from pyproject.toml, else auto), resolved
        # at the first Worker start: "required" without a sandbox raises SandboxUnavailable there.
        self.sandbox_mode = sandbox
        self._sandbox: sandboxing.Sandbox | None = None
        self._sandbox_resolved = False
        self._readable: list[str] = []   # task folders the Workers must read (a workspace in HOME)
        self.sandboxed = False           # whether the latest Worker ran sandboxed
        self._gpu: str | None = None     # the GPU's uuid for its machine-wide turn ("" for none)
        self._readying: set[asyncio.Task[Any]] = set()  # Worker starts and reference compiles ahead of need
        self._evaluations = 0                            # evaluate requests that took the Worker
        self._prepared: set[str] = set()                 # references whose torch.compile was prepared
        self.gpu_waited = 0.0            # seconds the latest GPU request waited for its turn
        self.gpu_handed = 0.0            # ... and spent without it, handed over at its turn points
        # Seconds the GPU Worker outlives this Engine for the next command (caller/keeper.py);
        # None or 0: a Worker of its own, ended at aclose. The CLI's bench asks for it.
        self.keep_worker = keep_worker if keep_worker and keep_worker > 0 else None
        self.worker_keeping: dict[str, Any] | None = None  # the latest GPU Worker: kept? reused?

    # -- the Worker -------------------------------------------------------------

    @property
    def worker_pid(self) -> int | None:
        return self._worker.pid if self._worker and self._worker.alive else None

    async def _ensure(self, progress: Progress | None, warm: bool) -> "WorkerProcess | keeping.KeptWorker":
        """The live Worker (started and warmed now if need be)."""
        w = self._worker
        if w is not None and not w.alive:
            self._discard(w)
            w = None
        if w is not None and not sandboxing.shows(w.sandbox, w.cwd, self._readable):
            if isinstance(w, keeping.KeptWorker):  # still good for its own folders: leave it kept
                self._worker = None
                await w.close()
            else:
                self._discard(w)  # a task from a folder this Worker's sandbox does not show
            w = None
        if w is None:
            w = await self._start_worker(progress)
            self._worker = w
        self.sandboxed = w.sandboxed
        if warm and w.warm is None:
            await _report(progress, "warming worker")
            try:
                w.warm, _ = await asyncio.wait_for(w.call("warm"), self.start_timeout)
            except asyncio.TimeoutError:
                self._discard(w)
                raise EngineTimeout(f"warming the Worker took more than {self.start_timeout:.0f} s") from None
            except BaseException:
                if not w.alive:
                    self._discard(w)
                raise
        return w

    async def _start_worker(self, progress: Progress | None) -> "WorkerProcess | keeping.KeptWorker":
        """A new GPU Worker, or this configuration's kept one (``keep_worker``), started."""
        role = {protocol.WORKER_ROLE_ENV: protocol.GPU_ROLE}  # overlapped CUDA init (worker/early.py)
        env = worker_environment(self.device, {**role, **self.extra_env})
        spec = self._sandbox_spec()
        if self.keep_worker:
            kept = keeping.KeptWorker(self.python, env, self.cwd, sandbox=spec, idle=self.keep_worker)
            try:
                info = await kept.attach(self.start_timeout)
            except keeping.KeeperUnavailable as exc:
                log.info("no kept Worker: %s", exc)
                self.worker_keeping = {"kept": False, "reused": False, "idle_s": None, "why": str(exc)}
            else:
                if kept.reused:
                    idle = f", idle {kept.idle_for:.0f} s" if kept.idle_for is not None else ""
                    await _report(progress, f"reusing the kept worker (pid {info.get('worker_pid')}{idle})")
                else:
                    await _report(progress, "starting worker")
                try:
                    await kept.finish_start(self.start_timeout)
                except WorkerDied as exc:
                    self.last_stderr = exc.stderr_tail
                    raise
                except BaseException:  # cancelled (or timed out) while it started: end it
                    kept.kill()
                    raise
                self.worker_keeping = kept.describe()
                return kept
        else:
            self.worker_keeping = {"kept": False, "reused": False, "idle_s": None}
        await _report(progress, "starting worker")
        w = WorkerProcess(self.python, env, self.cwd, sandbox=spec)
        try:
            await w.start(self.start_timeout)
        except WorkerDied as exc:
            self.last_stderr = exc.stderr_tail
            raise
        return w

    def _discard(self, w: WorkerProcess) -> None:
        w.kill()
        self.last_stderr = w.stderr_tail()
        if self._worker is w:
            self._worker = None
            self.restarts += 1
        task = asyncio.get_running_loop().create_task(w.reap())
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def request(
        self, op: str, params: dict[str, Any] | None = None, *, timeout: float | None = None,
        warm: bool = False, progress: Progress | None = None,
    ) -> Any:
        """Send one op to the Worker. Raises EngineTimeout, WorkerDied, WorkerRaised; on
        a timeout, death, fatal error or cancellation the Worker is gone afterwards."""
        result, _ = await self._call(op, params, timeout=timeout, warm=warm, progress=progress)
        return result

    async def _call(
        self, op: str, params: dict[str, Any] | None, *, timeout: float | None,
        warm: bool, progress: Progress | None, resume: str | None = None,
        build_first: dict[str, Any] | None = None,
    ) -> tuple[Any, bool]:
        """(result, fatal): fatal when the Worker answered and then had to go. ``build_first``:
        the params of a ``build`` the Worker does before the GPU turn is taken (its own
        deadline), so that nvcc in this process never holds the GPU while others wait; the
        op's build is then a cache hit inside the turn."""
        deadline = self.timeout if timeout is None else timeout
        said: list[str] = []
        if resume and progress is not None:  # report `resume` after a start, warm-up or GPU wait was reported
            outer = progress

            def progress(step: str, *rest: Any) -> Any:  # type: ignore[no-redef]
                said.append(step)
                return outer(step, *rest)
        key = await self._gpu_key(progress) if op in GPU_OPS else None
        async with self._lock:
            origin_ns = time.time_ns()  # this evaluation's start, for its place among the GPU's turns
            if op == "evaluate":
                self._evaluations += 1
            w = await self._ensure(progress, warm)
            built: dict[str, float] | None = None
            if build_first is not None and key is not None:
                built = await self._build_before_turn(w, build_first, deadline, progress)
                if not w.alive:  # the build took the Worker with it: a fresh one for the op
                    w = await self._ensure(progress, warm)
            needs, data = None, None
            if op == "evaluate" and key is not None:
                needs, data = await self._task_need(w, params, key)
                if not w.alive:  # the sizing took the Worker with it: a fresh one for the op
                    w = await self._ensure(progress, warm)
            async with gpu_lock.gpu_turn(key, op, progress=progress, needs_bytes=needs, origin_ns=origin_ns,
                                         expect_s=None if data is None else gpu_lock.expected_gpu_s(data)) as turn:
                self.gpu_waited = turn.waited  # the deadline starts now: waiting is never a timeout
                self.gpu_handed = 0.0
                if said:
                    await _report(progress, resume)  # type: ignore[arg-type]
                if op == "evaluate" and key is not None:
                    # Bounded turns: the evaluation stops between its stages and this caller hands
                    # the GPU to a waiting process there (_hand_over).
                    params = {**(params or {}), "options": {**((params or {}).get("options") or {}),
                                                            protocol.YIELD_TURNS: True}}
                    data, fatal = await self._call_now(w, op, params, deadline, turn=turn, progress=progress,
                                                       resume=resume)
                    if built and isinstance(data, dict):  # where the build before the turn went
                        data["evidence"] = {**(data.get("evidence") or {}), "build_steps": built}
                    return data, fatal
                return await self._call_now(w, op, params, deadline)

    async def _task_need(self, w: "WorkerProcess | keeping.KeptWorker", params: dict[str, Any] | None,
                         key: str) -> tuple[int | None, int | None]:
        """What this evaluation needs on the GPU, said while it waits for the turn so that a
        holder with much live data may still let it in (gpu_lock.may_hand_over), and its Task's
        data (one input set and its outputs), from which its GPU work is expected
        (gpu_lock.expected_gpu_s): the Worker sizes the Task on the meta device (run.task_need).
        Asked only when another process holds or waits for the GPU (alone, nobody reads them);
        kept per reference. None: unknown."""
        task = (params or {}).get("task") or {}
        source = str(task.get("reference_source") or "")
        known = hashlib.sha256(source.encode()).hexdigest()
        if known in self._needs:
            return self._needs[known]
        if not gpu_lock.busy(key):
            return None, None
        try:
            got, _ = await self._call_now(w, "task_need", {"task": task, "options": (params or {}).get("options")},
                                          TASK_NEED_DEADLINE_S)
        except (EngineTimeout, WorkerDied, WorkerRaised) as exc:  # an older Worker, a reference that hangs
            got = {"why": str(exc)}
        got = got if isinstance(got, dict) else {"why": repr(got)}
        need = got.get("need_bytes")
        sizes = [got.get("input_bytes"), got.get("output_bytes")]
        data = int(sum(sizes)) if all(isinstance(b, (int, float)) and b >= 0 for b in sizes) else None
        if isinstance(need, (int, float)) and need >= 0:
            self._needs[known] = (int(need), data)
        else:
            self._needs[known] = (None, data)
            log.info("the Task's GPU need is unknown: %s", got.get("why"))
        return self._needs[known]

    async def _build_before_turn(self, w: "WorkerProcess | keeping.KeptWorker", params: dict[str, Any],
                                 deadline: float, progress: Progress | None) -> dict[str, float] | None:
        """The candidate's build in the GPU Worker, outside the GPU turn (CPU work: nvcc, g++).
        Advisory, as a prebuild is: a failure here leaves the op to build and report it (a
        Worker that died or ran past the deadline is replaced by the caller; the op then
        builds inside its turn, under its own deadline)."""
        await _report(progress, "compiling")
        t0 = time.perf_counter()
        try:
            built, _ = await self._call_now(w, "build", params, deadline)
        except (EngineTimeout, WorkerDied, WorkerRaised) as exc:
            log.info("the build before the GPU turn failed: %s", exc)
            return None
        steps = built.get("steps") if isinstance(built, dict) else None
        # Its steps (device, host, link, load), as a pool build tells them: None for a cache hit.
        return {**steps, "worker_s": round(time.perf_counter() - t0, 3)} if steps else None

    async def _call_now(self, w: WorkerProcess, op: str, params: dict[str, Any] | None,
                        deadline: float, *, turn: "gpu_lock.Turn | None" = None,
                        progress: Progress | None = None, resume: str | None = None) -> tuple[Any, bool]:
        """The request, under its deadline; with `turn`, its turn points hand the GPU over when
        others wait (the time without the GPU is not counted in the deadline)."""
        clock = _Deadline(deadline)
        on_turn = None
        if turn is not None:
            async def on_turn(data: dict[str, Any], release: Callable[[], Any]) -> None:
                await self._hand_over(turn, data, release, clock, progress, resume)
        try:
            call = w.call(op, params, on_partial=_ON_PARTIAL.get(), on_turn=on_turn)
            result, fatal = await clock.run(call)
        except asyncio.TimeoutError:
            fence = w.fence_report()
            self._discard(w)
            message = f"{op} ran past its {deadline:g} s deadline; the Worker was restarted"
            raise EngineTimeout(f"{fence}: {message}" if fence else message, fence=fence) from None
        except WorkerDied:
            self._discard(w)
            raise
        except WorkerRaised as exc:
            if exc.fatal or not w.alive:
                self._discard(w)
            raise
        except BaseException:  # cancelled: the Worker may be mid-kernel, end it now
            self._discard(w)
            raise
        if fatal:
            self._discard(w)
        return result, fatal

    async def _hand_over(self, turn: "gpu_lock.Turn", data: dict[str, Any], release: Callable[[], Any],
                         clock: "_Deadline", progress: Progress | None, resume: str | None) -> None:
        """A turn point of the Worker's evaluation: when another process waits for this GPU, the
        Worker frees its cached GPU memory (`release`), the other process gets the GPU, and this
        one waits for it back, the deadline paused meanwhile; then (the Worker's continue line
        is written by the caller of this) the evaluation goes on."""
        stage = str(data.get("stage") or "")
        if stage in (protocol.TURN_CPU_START, protocol.TURN_CPU_END):
            await self._lend(turn, stage, data, release, clock, progress, resume)
            return
        if not turn.to_hand_over(stage, data.get("held_bytes"), data.get("total_bytes"), data.get("data_bytes")):
            return  # nobody ahead (or not yet: the turn's quantum), or too much live data: it goes on
        where = TURN_STAGES.get(stage, f"after {stage}" if stage else "")
        clock.pause()
        try:
            await release()
            self.gpu_handed += await turn.hand_over(where, progress, held_bytes=data.get("held_bytes"))
        finally:
            clock.resume()
        if resume:
            await _report(progress, resume)

    async def _lend(self, turn: "gpu_lock.Turn", stage: str, data: dict[str, Any], release: Callable[[], Any],
                    clock: "_Deadline", progress: Progress | None, resume: str | None) -> None:
        """The turn points around the Worker's CPU-only compile: lent to a process waiting now at
        the first (unless this evaluation's live data is too big to share the GPU beside it), taken
        back at the second, the deadline paused while it waits for it."""
        if stage == protocol.TURN_CPU_START:
            if turn.to_lend(data.get("held_bytes"), data.get("total_bytes")):
                await release()
                await turn.lend("while torch.compile compiles", progress, held_bytes=data.get("held_bytes"))
                if resume:
                    await _report(progress, resume)
            return
        if turn.held:
            return
        clock.pause()
        try:
            self.gpu_handed += await turn.take_back(progress)
        finally:
            clock.resume()
        if resume:
            await _report(progress, resume)

    async def _gpu_key(self, progress: Progress | None = None) -> str | None:
        """This Engine's GPU (its uuid, from the Worker) for the machine-wide turn; None on a
        CPU, without a uuid, or with the turn turned off."""
        if not gpu_lock.enabled():
            return None
        if self._gpu is None:
            info = await self.device_info(progress=progress)
            self._gpu = str(info.get("uuid") or "") if info.get("cuda") else ""
        return self._gpu or None

    # -- the API ------------------------------------------------------------------

    async def ping(self, timeout: float = 30.0) -> dict[str, Any]:
        return await self.request("ping", timeout=timeout)

    async def evaluate(
        self,
        task: Task,
        candidate: Candidate,
        checks: Iterable[str] = ("compile", "verify", "bench"),
        progress: Progress | None = None,
        timeout: float | None = None,
        options: dict[str, Any] | None = None,
        early: EarlyCallback | None = None,
    ) -> Evaluation:
        """Evaluate a Candidate; every candidate fault is an Evaluation, not an exception.
        `early`: given the partial Evaluation (`compiled_pending`) when the Worker knows the
        verdict and the eager ratio before torch.compile's baseline is compiled (none kept);
        the Evaluation returned is the complete one."""
        t0 = time.monotonic()
        deadline = self.timeout if timeout is None else timeout
        self._see(task)
        checks = list(checks)
        params = {
            "task": task.to_dict(), "candidate": candidate.to_dict(), "checks": checks,
            # deadline_s: how long a shared-GPU out-of-memory may wait for memory to free
            "options": await kept_baselines.with_kept_async(self.baseline_store, task, checks,
                                                            {"deadline_s": deadline, **self.options,
                                                             **(options or {})}),
        }
        if early is not None:
            params["options"][protocol.EARLY_RESULT] = True

        def failed(verdict: str, message: str, **extra: Any) -> Evaluation:
            return Evaluation(task=task.name, candidate=candidate.id, verdict=verdict, correct=None,
                              message=message, device=dict(self._device_info) if self._device_info else None,
                              sandboxed=self.sandboxed, **extra)

        build_steps: dict[str, float] | None = None
        # Builds run outside the GPU turn: in the CPU pool (prebuild), else in the GPU Worker
        # just before the turn is taken (a kept Worker that builds for itself, a prebuild that
        # could not run). A prebuild that ran and failed is not tried again before the turn.
        build_first: dict[str, Any] | None = None
        if needs_build(candidate):
            build_first = {"kind": candidate.kind, "source": candidate.source,
                           "filename": build_filename(task, candidate), "options": dict(params["options"])}
        try:
            if self.auto_prebuild and needs_build(candidate):
                await _report(progress, "compiling")
                # Meanwhile the GPU Worker starts and compiles the reference's torch.compile
                # baseline, when none is kept: neither waits for the build.
                self._ahead(self._get_ready(task, checks, params["options"], deadline))
                try:
                    built = await self.prebuild(task, candidate, options)
                    build_steps = {**built.steps, "pool_s": round(built.seconds, 3)} if built.steps else None
                    build_first = None  # built (or failed) in the pool: the Worker's is a cache hit
                except Exception:  # noqa: BLE001 - advisory: the Worker builds it anyway
                    log.debug("prebuild failed", exc_info=True)
            await _report(progress, "evaluating")
            token = _ON_PARTIAL.set(self._early_handler(early, t0) if early is not None else None)
            try:
                data, fatal = await self._call("evaluate", params, timeout=deadline, warm=self.warm,
                                               progress=progress, resume="evaluating",
                                               build_first=build_first)
            finally:
                _ON_PARTIAL.reset(token)
            ev = Evaluation.from_dict(data)
            if build_steps:  # where the CPU pool's build of this save went (device, host, link, load)
                ev.evidence = {**(ev.evidence or {}), "build_steps": build_steps}
            if self.gpu_waited >= 0.05:  # other kernel-lsp processes had the GPU first
                ev.evidence = {**(ev.evidence or {}), "gpu_wait_s": round(self.gpu_waited, 2)}
            if self.gpu_handed > 0:  # ... or had it at this evaluation's turn points
                ev.evidence = {**(ev.evidence or {}), "gpu_handed_over_s": round(self.gpu_handed, 2)}
            ev.sandboxed = self.sandboxed  # the caller's word, not the Worker's
            if fatal and ev.verdict not in ("crashed", "oom", "timeout", sandboxing.VIOLATION):
                # The candidate left a sticky CUDA error: the context died with it.
                ev.verdict, ev.correct = "crashed", None
                if protocol.is_illegal_access(ev.message):
                    ev.message = "illegal memory access: " + ev.message
        except EngineTimeout as exc:
            ev = failed(sandboxing.VIOLATION if exc.fence else "timeout", str(exc))
        except WorkerDied as exc:
            verdict, message = protocol.classify_death(exc.returncode, exc.stderr_tail, sandboxed=self.sandboxed)
            ev = failed(verdict, _with_tail(message, exc.stderr_tail), evidence={"stderr": exc.stderr_tail[-4000:]})
        except OSError as exc:  # no interpreter, no fork: nothing could run
            ev = failed("not_run", f"cannot start the Worker ({self.python}): {exc}")
        except gpu_lock.GPUBusy as exc:  # other kernel-lsp processes kept the GPU: not the candidate's fault
            ev = failed("not_run", str(exc))
        except WorkerRaised as exc:
            err = exc.error
            if err.get("fence"):
                ev = failed(sandboxing.VIOLATION, f"{err['fence']}: {err.get('type')}: {err.get('message')}"[:2000])
            elif protocol.is_oom_error(err):
                ev = failed("oom", f"out of memory: {err.get('message', '')}"[:2000])
            elif exc.fatal:
                msg = str(err.get("message", ""))
                named = "illegal memory access: " if protocol.is_illegal_access(msg) else ""
                ev = failed("crashed", f"{named}{err.get('type')}: {msg}"[:2000])
            else:
                ev = failed("error", f"{err.get('type')}: {err.get('message')}"[:2000],
                            evidence={"traceback": str(err.get("traceback", ""))[-4000:]})
        ev.wall_seconds = time.monotonic() - t0
        await kept_baselines.keep_async(self.baseline_store, ev)
        if self._device_info is None and isinstance(ev.device, dict) and ev.device.get("capability"):
            self._device_info = dict(ev.device)  # prebuild then targets this GPU's arch
        await self._record(task, candidate, ev, progress)
        await _report(progress, "done")
        return ev

    async def _record(self, task: Task, candidate: Candidate, ev: Evaluation, progress: Progress | None) -> None:
        await record(self.store, task, candidate, ev, progress)

    def _early_handler(self, early: EarlyCallback, t0: float) -> Callable[[str, dict[str, Any]], Any]:
        """The Worker's partial evaluation, as an Evaluation, to `early` (never stored)."""
        def handle(kind: str, data: dict[str, Any]) -> Any:
            if kind != protocol.PARTIAL_EVALUATION:
                return None
            part = Evaluation.from_dict(data)
            part.compiled_pending, part.sandboxed = True, self.sandboxed  # the caller's word
            part.wall_seconds = time.monotonic() - t0
            return early(part)
        return handle

    async def profile(
        self, task: Task, candidate: Candidate | None = None, timeout: float | None = None,
        options: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A profile of the candidate (or of the reference). Faults come back as
        ``{"error": ..., "verdict": ...}``."""
        self._see(task)
        params = {"task": task.to_dict(), "candidate": candidate.to_dict() if candidate else None,
                  "options": {**self.options, **(options or {})}}
        try:
            result = await self.request("profile", params, timeout=timeout, warm=self.warm)
        except EngineTimeout as exc:
            return {"verdict": sandboxing.VIOLATION if exc.fence else "timeout", "error": str(exc)}
        except WorkerDied as exc:
            verdict, message = protocol.classify_death(exc.returncode, exc.stderr_tail, sandboxed=self.sandboxed)
            return {"verdict": verdict, "error": _with_tail(message, exc.stderr_tail)}
        except WorkerRaised as exc:
            return {"verdict": "oom" if protocol.is_oom_error(exc.error) else "error",
                    "error": f"{exc.error.get('type')}: {exc.error.get('message')}"}
        except gpu_lock.GPUBusy as exc:
            return {"verdict": "not_run", "error": str(exc)}
        return result if isinstance(result, dict) else {"result": result}

    async def start(self) -> bool:
        """Start and warm the Worker now (the server does at its start, in the background), so
        that the first evaluation finds it ready. False, and logged, when it could not start:
        the first request then starts one and reports why."""
        try:
            async with self._lock:
                await self._ensure(None, self.warm)
            return True
        except Exception as exc:  # noqa: BLE001 - advisory; the request that needs it says why
            log.info("the Worker did not start ahead of need: %s", exc)
            return False

    async def prepare_compile(self) -> dict[str, Any]:
        """Pay torch.compile's one-time costs in the Worker now (inductor, Triton, the compile
        workers), before an evaluation measures a torch.compile baseline. Advisory: a failure
        is returned as {"state": "failed", ...}."""
        try:
            result = await self.request("prepare_compile", {"options": dict(self.options)},
                                        timeout=self.start_timeout, warm=self.warm)
        except Exception as exc:  # noqa: BLE001
            return {"state": "failed", "why": f"{type(exc).__name__}: {exc}"[:300]}
        return result if isinstance(result, dict) else {"state": "failed", "why": repr(result)[:200]}

    def get_ready_ahead(self, task: Task, checks: Iterable[str], options: dict[str, Any] | None = None,
                        timeout: float | None = None) -> None:
        """Before a Task's first evaluation, while its candidate builds elsewhere (the CLI's early
        build): start the Worker and compile the reference's torch.compile baseline in the
        background (`_get_ready`; closing the Engine cancels it), so that the evaluation does
        not start it only after the build."""
        self._see(task)
        deadline = self.timeout if timeout is None else timeout
        checks = list(checks)

        async def ready() -> None:
            opts = await kept_baselines.with_kept_async(self.baseline_store, task, checks,
                                                        {"deadline_s": deadline, **self.options, **(options or {})})
            await self._get_ready(task, checks, opts, deadline)
        self._ahead(ready())

    def _ahead(self, work: Any) -> None:
        """Run ``work`` (a coroutine) in the background; closing the Engine cancels it. Not
        cancelled with the evaluation that started it: a newer save needs the same Worker."""
        task = asyncio.ensure_future(work)
        self._readying.add(task)
        task.add_done_callback(self._readying.discard)

    async def _get_ready(self, task: Task, checks: list[str], options: dict[str, Any], deadline: float) -> None:
        """Start the Worker, then (a separate turn of the lock: a prebuild's device_info may come
        first) compile the reference's torch.compile baseline if the evaluation will time it."""
        seen = self._evaluations
        if not await self.start():
            return
        if "bench" not in checks or options.get("baselines") is False:
            return
        if options.get(protocol.CACHED_BASELINES) and not options.get(protocol.REMEASURE_BASELINES):
            return  # this reference's baselines are kept: the evaluation will not compile it
        ref = kept_baselines.reference_hash(task)
        if ref in self._prepared:
            return  # a Search's batch: prepared (or being prepared) once per reference
        self._prepared.add(ref)
        params = {"task": task.to_dict(), "options": options}
        try:
            key = await self._gpu_key(None)
            async with self._lock:
                if self._evaluations != seen:
                    return  # the build was quicker: the evaluation compiles it itself, once
                w = await self._ensure(None, self.warm)
                # Only on an idle GPU: behind other processes it would take one more turn in the
                # queue and hold the GPU while it compiles (CPU work), and the evaluation compiles
                # it again anyway (six benches at once on an H100: "prepare_reference, for 15 s"
                # held the GPU while five others waited).
                async with gpu_lock.gpu_turn_if_free(key, "prepare_reference") as turn:
                    if turn is None:
                        self.prepare_skipped += 1
                        log.info("the reference of %s is not prepared ahead: other processes use the GPU", task.name)
                        return
                    if turn.key:
                        # Taken on an idle GPU, it may be asked for later: the Worker compiles
                        # between the turn points that lend the GPU to a process waiting then
                        # (_lend), and takes it back, queued, before running the compiled model.
                        params["options"] = {**options, protocol.YIELD_TURNS: True}
                    result, _ = await self._call_now(w, "prepare_reference", params, deadline,
                                                     turn=turn if turn.key else None)
            log.debug("reference prepared: %s", result)
        except Exception as exc:  # noqa: BLE001 - advisory: the evaluation compiles it anyway
            log.info("preparing the reference of %s failed: %s", task.name, exc)

    async def device_info(self, timeout: float | None = None, progress: Progress | None = None) -> dict[str, Any]:
        if self._device_info is None:
            self._device_info = await self.request("device_info", timeout=timeout or self.start_timeout,
                                                   warm=self.warm, progress=progress)
        return dict(self._device_info)

    def _arch(self) -> str | None:
        if self.options.get("arch"):
            return str(self.options["arch"])
        info = self._device_info or {}
        # The Worker's own target (sm_90a where nvcc compiles it), not the base sm_90: a pool
        # build under another arch is another cache key, and the Worker would build again.
        return capability_arch(info.get("capability")) or info.get("arch") or os.environ.get("KERNEL_LSP_ARCH")

    async def prebuild(self, task: Task, candidate: Candidate, options: dict[str, Any] | None = None,
                       timeout: float | None = None, ahead: bool = False) -> CompileResult:
        """Compile a Candidate in the CPU build pool (not on the GPU Worker), so that
        its later evaluate finds the build in the cache. Its result is advisory: a
        candidate that touches the GPU at import fails here but may run on the Worker.
        ``ahead``: built for an evaluation to come (same options), which then gets this
        result, with the build's steps, instead of the pool's cache hit."""
        self._see(task)
        pool = self._build_pool()
        opts = {**self.options, **(options or {})}
        if "arch" not in opts:
            arch = self._arch()
            if arch is None and self._worker is not None and self._worker.warm:
                arch = self._worker.warm.get("arch")
            if arch is None and self._device_info is None:
                # The arch is part of the cache key: build for the GPU the Worker will load on.
                with contextlib.suppress(Exception):
                    await self.device_info()
                arch = self._arch()
            if arch:
                opts["arch"] = arch
        filename = build_filename(task, candidate)
        # One build per Candidate at a time: the Search prebuilds a batch and each evaluate asks
        # again; a second ask waits for the first build instead of taking another pool slot.
        key = (candidate.kind, candidate.source, filename, repr(sorted(opts.items())))
        done = self._prebuilt.pop(key, None)
        if done is not None:
            return done
        entry = self._prebuilds.get(key)
        if entry is None:
            job = asyncio.ensure_future(pool.build(candidate.kind, candidate.source, filename, opts,
                                                   timeout=timeout, readable=self._readable))
            entry = self._prebuilds[key] = [job, 0, ahead]
            job.add_done_callback(lambda j, k=key: self._finished(k, j))
        elif not ahead:
            entry[2] = False  # an evaluation joined it: the result is taken
        entry[1] += 1
        try:
            return await asyncio.shield(entry[0])
        except asyncio.CancelledError:
            if entry[1] == 1 and not entry[0].done():
                entry[0].cancel()  # the last one waiting: the build is moot
                self._prebuilds.pop(key, None)  # and the next ask starts one, not joins this one
            raise
        finally:
            entry[1] -= 1

    def _finished(self, key: tuple[str, ...], job: "asyncio.Future[CompileResult]") -> None:
        """A prebuild is done: out of the in-flight table; a build ahead that no evaluation has
        joined keeps its result for the next ask (the newest PREBUILT_KEPT of them)."""
        entry = self._prebuilds.get(key)
        if entry is None or entry[0] is not job:
            return
        self._prebuilds.pop(key, None)
        if entry[2] and not job.cancelled() and job.exception() is None:
            self._prebuilt[key] = job.result()
            while len(self._prebuilt) > PREBUILT_KEPT:
                self._prebuilt.popitem(last=False)

    async def prepare_builds(self, announce: Any = None, timeout: float | None = None) -> dict[str, Any]:
        """Make the fast build's precompiled torch headers now, in a build-pool Worker, so that
        the first build does not (``BuildPool.prepare``)."""
        kw = {"timeout": timeout} if timeout else {}
        return await self._build_pool().prepare(announce, {k: v for k, v in self.options.items() if k == "nvcc"},
                                                **kw)

    async def prebuild_binding(self, source: str) -> dict[str, Any]:
        """A Python file's load_inline main.cpp compiled (by table or signature) in a free build-pool slot,
        before its first build (``BuildPool.prebuild_binding``; nothing of the file runs)."""
        return await self._build_pool().prebuild_binding(source, {k: v for k, v in self.options.items() if k == "nvcc"})

    def _build_pool(self) -> BuildPool:
        """The CPU build pool (made at first need, with the Workers' sandbox)."""
        if self._pool is None:
            self._pool = BuildPool(python=self.python, env=self.extra_env, cwd=self.cwd,
                                   sandbox=self._sandbox_spec())
        return self._pool

    # -- the sandbox --------------------------------------------------------------

    def builds_sandboxed(self) -> bool:
        """Whether the build pool's processes (which run a .py's module code) are fenced."""
        try:
            return self._sandbox_spec() != "off"
        except sandboxing.SandboxUnavailable:
            return False

    def _sandbox_spec(self) -> "sandboxing.Sandbox | str":
        """The resolved sandbox with the task folders Workers must read; "off" for none.
        Raises SandboxUnavailable for ``required`` where no sandbox can run."""
        if not self._sandbox_resolved:
            mode = self.sandbox_mode if self.sandbox_mode is not None else sandboxing.configured_mode(self.cwd)
            self._sandbox = sandboxing.resolve(mode)
            self._sandbox_resolved = True
        if self._sandbox is None:
            return "off"
        return self._sandbox.with_readable(*self._readable)

    def see(self, tasks: Iterable[Task]) -> None:
        """Name the Tasks to come before the Worker starts: its sandbox then shows their folders
        from the start, and the first evaluation does not start a second Worker that does."""
        for task in tasks:
            self._see(task)

    def _see(self, task: Task) -> None:
        """Remember the projects of a task's files: a sandboxed Worker gets them read-only."""
        env = {**os.environ, **self.extra_env}
        for path in (task.reference_path, task.cuda_path):
            if path and os.path.isabs(path):
                folder = sandboxing.workspace_of(path, env)
                if folder not in self._readable and sandboxing.hidden(folder, env):
                    self._readable.append(folder)

    async def restart(self) -> None:
        async with self._lock:
            if self._worker is not None:
                self._discard(self._worker)

    async def aclose(self) -> None:
        for t in list(self._readying):
            t.cancel()
        if self._readying:
            await asyncio.gather(*list(self._readying), return_exceptions=True)
        w, self._worker = self._worker, None
        if w is not None:
            if self._lock.locked():  # a request is in flight on its pipes: no polite shutdown
                w.kill()
                await w.reap()
            else:
                await w.close()
        if self._pool is not None and self._own_pool:
            await self._pool.aclose()
        if self._reaping:
            await asyncio.gather(*list(self._reaping), return_exceptions=True)

    async def __aenter__(self) -> "Engine":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Deadline:
    """A request's deadline that stops counting while paused (the GPU handed over at a turn
    point: another process's time is never this request's timeout)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.t0 = time.monotonic()
        self.paused = 0.0
        self._since: float | None = None

    def pause(self) -> None:
        self._since = time.monotonic()

    def resume(self) -> None:
        if self._since is not None:
            self.paused += time.monotonic() - self._since
            self._since = None

    def left(self) -> float | None:
        """Seconds left; None while paused."""
        if self._since is not None:
            return None
        return self.seconds - (time.monotonic() - self.t0 - self.paused)

    async def run(self, work: Any) -> Any:
        """Await `work` (a coroutine) within the deadline: asyncio.TimeoutError past it (and
        `work` cancelled, as asyncio.wait_for does)."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                left = self.left()
                if left is not None and left <= 0:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    raise asyncio.TimeoutError
                done, _ = await asyncio.wait({task}, timeout=1.0 if left is None else left)
                if done:
                    return task.result()
        except BaseException:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            raise


_BUILD_MARKERS = ("cpp_extension", "load_inline")


def build_filename(task: Task, candidate: Candidate) -> str:
    """The file name the harness gives the builder for a candidate (the .cu's folder is in the
    build's key): a build under it is the one the Worker's evaluate finds in the cache."""
    ref = task.reference_path or f"{task.name}.py"
    if candidate.kind == "cuda":
        return task.cuda_path or ref.replace(".py", ".cu")
    return ref.replace(".py", "_candidate.py")


def needs_build(candidate: Candidate) -> bool:
    """A .cu, or a .py that builds an extension: worth compiling in the CPU pool first."""
    return candidate.kind == "cuda" or any(m in candidate.source for m in _BUILD_MARKERS)


def _with_tail(message: str, tail: str, lines: int = 8) -> str:
    kept = [ln for ln in tail.strip().splitlines() if ln.strip()][-lines:]
    return message + ("\n" + "\n".join(kept) if kept else "")


async def _report(progress: Progress | None, phase: str) -> None:
    if progress is None:
        return
    try:
        out = progress(phase)
        if inspect.isawaitable(out):
            await out
    except Exception:  # noqa: BLE001 - a broken progress callback must not stop an evaluation
        log.debug("progress callback failed", exc_info=True)


async def record(store: "Store | None", task: Task, candidate: Candidate, ev: Evaluation,
                 progress: Progress | None = None) -> None:
    """Write an Evaluation to the store (``Store.record``) off the event loop. A cancelled caller
    must not lose the record: the write is shielded. A failing store is logged, not raised: the
    caller still gets its Evaluation."""
    if store is None:
        return
    await _report(progress, "recording")
    try:
        await asyncio.shield(asyncio.to_thread(store.record, task, candidate, ev))
    except Exception:  # noqa: BLE001
        log.warning("could not record the evaluation of %s in the store", candidate.id, exc_info=True)
