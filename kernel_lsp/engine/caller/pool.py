"""The CPU build pool: compiles the next Candidates while the GPU Worker times this one.

Each slot is a Worker process started with no GPU (``CUDA_VISIBLE_DEVICES=""``) and
the same allowlisted environment and sandbox (``sandbox.py``) as the GPU Worker, and
answers ``build`` ops
(``build.build_cuda`` / ``build.build_python``). Builds land in the shared
content-hash cache, so the GPU Worker's later ``load_cuda`` / ``load_python`` is
a cache hit.

Why Worker processes and not a ``ProcessPoolExecutor``: building a Python
candidate means executing its module code (that is where ``load_inline`` is
called). That is untrusted code: it must not inherit the server's secrets, it
needs a deadline, and a crash must cost one slot, not break the whole pool
(``BrokenProcessPool``). Slots are started lazily and stay warm (torch imported
once), up to ``size`` (default: the CPU count).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from kernel_lsp.engine import protocol
from kernel_lsp.engine.caller import gpu_lock, prepare_lock
from kernel_lsp.engine.caller import sandbox as sandboxing
from kernel_lsp.engine.caller.process import (
    EngineTimeout,
    WorkerDied,
    WorkerProcess,
    WorkerRaised,
    compile_failure,
    default_python,
    worker_environment,
)
from kernel_lsp.model import Candidate, CompileResult

log = logging.getLogger(__name__)

# What the user reads while the precompiled torch headers are made (docs/fast-builds.md).
PREPARE_TITLE = "preparing the CUDA build cache, once per torch version"
PREPARE_TIMEOUT = 900.0  # two light headers at once: 21-33 s on the H200, 25-60 s on 2 busy cores here
_TORCH_EXTENSION = ("cpp_extension", "load_inline", "PYBIND11_MODULE", "TORCH_LIBRARY", "torch/extension.h")


class BuildPool:
    def __init__(
        self,
        size: int | None = None,
        python: str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 900.0,
        start_timeout: float = 120.0,
        sandbox: "str | sandboxing.Sandbox | None" = "auto",
    ) -> None:
        self.size = max(1, size or os.cpu_count() or 1)
        self.python = python or default_python()
        self.extra_env = dict(env or {})
        self.cwd = cwd
        self.timeout = timeout
        self.start_timeout = start_timeout
        self._idle: list[WorkerProcess] = []
        self._busy: set[WorkerProcess] = set()
        self._slots = asyncio.Semaphore(self.size)
        self._closed = False
        self.sandbox_mode = sandbox  # each slot resolves it (see process.WorkerProcess)

    def _env(self) -> dict[str, str]:
        # device="" hides every GPU: a build needs nvcc, not a device. Nothing is timed
        # here, so the bench preload (and its torch import) is skipped.
        return worker_environment(device="", extra={"KERNEL_LSP_WORKER_PRELOAD": "", **self.extra_env})

    async def _acquire(self, readable: list[str]) -> WorkerProcess:
        while self._idle:
            w = self._idle.pop()
            if w.alive and sandboxing.shows(w.sandbox, w.cwd, readable):
                return w
            w.kill()  # dead, or its sandbox does not show this task's folder
            await w.reap()
        mode = self.sandbox_mode
        if readable and mode != "off":
            spec = mode if isinstance(mode, sandboxing.Sandbox) else sandboxing.resolve(mode)
            mode = spec.with_readable(*readable) if spec is not None else "off"
        w = WorkerProcess(self.python, self._env(), self.cwd, sandbox=mode)
        await w.start(self.start_timeout)
        return w

    async def build(
        self, kind: str, source: str, filename: str, options: dict[str, Any] | None = None,
        timeout: float | None = None, readable: list[str] | None = None,
    ) -> CompileResult:
        """Build one Candidate's source ("cuda" for a .cu, "python" for a .py).
        ``readable``: folders a sandboxed slot must be able to read (the task's)."""
        if self._closed:
            raise RuntimeError("the build pool is closed")
        deadline = self.timeout if timeout is None else timeout
        async with self._slots:
            w: WorkerProcess | None = None
            try:
                w = await self._acquire(list(readable or []))
                self._busy.add(w)
                params = {"kind": kind, "source": source, "filename": filename, "options": options or {}}
                result, _ = await asyncio.wait_for(w.call("build", params), deadline)
                return CompileResult.from_dict(result)
            except asyncio.TimeoutError:
                self._drop(w)
                w = None
                return compile_failure(f"the build ran past its {deadline:g} s deadline", filename)
            except EngineTimeout as exc:
                return compile_failure(str(exc), filename)
            except WorkerDied as exc:
                sandboxed = w is not None and w.sandboxed
                self._drop(w)
                w = None
                _, message = protocol.classify_death(exc.returncode, exc.stderr_tail, sandboxed)
                return compile_failure(f"the build process crashed: {message}", filename)
            except WorkerRaised as exc:
                if exc.fatal:
                    self._drop(w)
                    w = None
                return compile_failure(f"{exc.error.get('type')}: {exc.error.get('message')}", filename)
            except BaseException:
                self._drop(w)  # cancelled mid-build: nvcc may still run; end the group
                w = None
                raise
            finally:
                if w is not None:
                    self._release(w)

    async def prepare(self, announce: Any = None, options: dict[str, Any] | None = None,
                      timeout: float = PREPARE_TIMEOUT) -> dict[str, Any]:
        """Make the precompiled torch headers of the fast build in a slot (no candidate runs):
        first ask whether there is work, then take the machine-wide preparation lock
        (``prepare_lock``), call ``announce(check)`` (awaited if it is a coroutine) and make them.
        Another process preparing them: ``announce`` gets ``{"state": "waiting", "holder": ...}``,
        this one waits for it without a slot, then looks again (``{"state": "ready", "waited_s",
        "prepared_by"}`` when it made them). A build that needs them meanwhile waits on their lock
        in its own slot and finds them made. Never raises for a Worker's fault: {"state":
        "failed", ...}."""
        if self._closed:
            return {"state": "unavailable", "reason": "the build pool is closed"}
        params: dict[str, Any] = {"check_only": True, "options": options or {}}
        check = await self._prepare_call(params, self.start_timeout)
        if check.get("state") != "needed":
            return check
        if not check.get("pch_root"):  # an older Worker that does not say where: no lock, as before
            await _announce(announce, check)
            return await self._prepare_call({**params, "check_only": False}, timeout)

        def waiting(holder: dict[str, Any] | None) -> Any:
            return _announce(announce, {**check, "state": "waiting", "holder": holder,
                                        "who": gpu_lock.describe(holder)})

        path = prepare_lock.lock_path(str(check["pch_root"]))
        try:
            fd, waited, holder = await prepare_lock.take(path, timeout, waiting)
        except OSError as exc:  # an unwritable cache folder: prepare without the lock
            log.info("no build cache preparation lock (%s): %s", path, exc)
            await _announce(announce, check)
            return await self._prepare_call({**params, "check_only": False}, timeout)
        if fd is None:
            return {**check, "state": "failed", "reason": f"waited {waited:.0f} s for "
                    f"{gpu_lock.describe(holder)}, which is {prepare_lock.WHAT}"}
        try:
            if holder is not None:
                # Another process had it: look again (made now, unless it died or failed).
                check = await self._prepare_call(params, self.start_timeout)
                if check.get("state") != "needed":
                    return {**check, "waited_s": round(waited, 2), "prepared_by": holder.get("pid")}
            await _announce(announce, check)
            return await self._prepare_call({**params, "check_only": False}, timeout)
        finally:
            prepare_lock.release(fd)

    async def prebuild_binding(self, source: str, options: dict[str, Any] | None = None,
                               timeout: float = 300.0) -> dict[str, Any]:
        """A Python file's main.cpp compiled (by table or signature) ahead of its first build (the Worker's
        ``prebuild_binding``: its load_inline calls read from the syntax tree, nothing run). Only
        in a free slot: a build never waits behind it ({"state": "busy"} then)."""
        if self._closed:
            return {"state": "unavailable", "reason": "the build pool is closed"}
        if self._slots.locked():
            return {"state": "busy", "reason": "every build slot is in use"}
        return await self._prepare_call({"source": source, "options": options or {}, "timeout": timeout},
                                        timeout, op="prebuild_binding")

    async def _prepare_call(self, params: dict[str, Any], timeout: float, op: str = "prepare_build") -> dict[str, Any]:
        """One ``prepare_build`` (or ``op``) request in a slot (released after: a waiter holds no slot)."""
        async with self._slots:
            w: WorkerProcess | None = None
            try:
                w = await self._acquire([])
                self._busy.add(w)
                result, _ = await asyncio.wait_for(w.call(op, params), timeout)
                return result if isinstance(result, dict) else {"state": "failed", "reason": repr(result)[:200]}
            except asyncio.TimeoutError:
                self._drop(w)
                w = None
                return {"state": "failed", "reason": f"ran past {timeout:g} s"}
            except (EngineTimeout, WorkerDied, WorkerRaised, OSError) as exc:
                if not isinstance(exc, WorkerRaised) or exc.fatal:
                    self._drop(w)
                    w = None
                return {"state": "failed", "reason": f"{type(exc).__name__}: {exc}"[:300]}
            except BaseException:
                self._drop(w)  # cancelled: g++ may still run; end the group (the lock frees with it)
                w = None
                raise
            finally:
                if w is not None:
                    self._release(w)  # warm (torch imported) for the first build

    def _release(self, w: WorkerProcess) -> None:
        """A slot's Worker back to the idle list, or ended when it died or the pool closed."""
        self._busy.discard(w)
        if w.alive and not self._closed:
            self._idle.append(w)
        else:
            w.kill()

    def _drop(self, w: WorkerProcess | None) -> None:
        if w is None:
            return
        self._busy.discard(w)
        w.kill()

    async def aclose(self) -> None:
        self._closed = True
        workers = self._idle + list(self._busy)
        self._idle = []
        for w in workers:
            w.kill()
        await asyncio.gather(*(w.reap() for w in workers), return_exceptions=True)


async def _announce(announce: Any, check: dict[str, Any]) -> None:
    if announce is None:
        return
    out = announce(check)
    if asyncio.iscoroutine(out):
        await out


def needs_torch_headers(candidate: Candidate | None) -> bool:
    """A Candidate whose build is a torch extension (the fast build's precompiled headers help)."""
    return candidate is not None and any(m in candidate.source for m in _TORCH_EXTENSION)


def preparing_wanted() -> tuple[bool, str]:
    """(whether to make the headers ahead, why not): $KERNEL_LSP_PREPARE_BUILDS=0 turns it off."""
    from kernel_lsp.toolchain.nvcc import find_nvcc  # noqa: PLC0415

    if os.environ.get("KERNEL_LSP_PREPARE_BUILDS", "1").strip().lower() in ("0", "false", "no", "off"):
        return False, "KERNEL_LSP_PREPARE_BUILDS is off"
    if os.environ.get("KERNEL_LSP_FAST_INLINE", "1").strip().lower() in ("0", "false", "no", "off"):
        return False, "the fast build is off (KERNEL_LSP_FAST_INLINE=0)"
    if find_nvcc() is None:  # CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda, as the Worker looks
        return False, "no nvcc (CUDA toolkit) here"
    return True, ""
