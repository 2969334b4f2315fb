"""The CPU build pool: compiles the next Candidates while the GPU Worker times this one.

Each slot is a Worker process started with no GPU (``CUDA_VISIBLE_DEVICES=""``) and
the same allowlisted environment as the GPU Worker, and answers ``build`` ops
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
import os
from typing import Any

from kernel_lsp.engine import protocol
from kernel_lsp.engine.client import (
    EngineTimeout,
    WorkerDied,
    WorkerProcess,
    WorkerRaised,
    compile_failure,
    default_python,
    worker_environment,
)
from kernel_lsp.model import CompileResult


class BuildPool:
    def __init__(
        self,
        size: int | None = None,
        python: str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 900.0,
        start_timeout: float = 120.0,
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

    def _env(self) -> dict[str, str]:
        # device="" hides every GPU: a build needs nvcc, not a device. Nothing is timed
        # here, so the bench preload (and its torch import) is skipped.
        return worker_environment(device="", extra={"KERNEL_LSP_WORKER_PRELOAD": "", **self.extra_env})

    async def _acquire(self) -> WorkerProcess:
        while self._idle:
            w = self._idle.pop()
            if w.alive:
                return w
            await w.reap()
        w = WorkerProcess(self.python, self._env(), self.cwd)
        await w.start(self.start_timeout)
        return w

    async def build(
        self, kind: str, source: str, filename: str, options: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> CompileResult:
        """Build one Candidate's source ("cuda" for a .cu, "python" for a .py)."""
        if self._closed:
            raise RuntimeError("the build pool is closed")
        deadline = self.timeout if timeout is None else timeout
        async with self._slots:
            w: WorkerProcess | None = None
            try:
                w = await self._acquire()
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
                self._drop(w)
                w = None
                _, message = protocol.classify_death(exc.returncode, exc.stderr_tail)
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
