"""The fast build's precompiled torch headers, made in the background as the server starts.

Without this, the first save of a KernelBench-format candidate on a machine (or after a torch
upgrade) pays for them in the middle of the save, with no word about it (about a minute). Here a
build-pool Worker makes them as soon as the client has said `initialized`, under a work-done
progress titled "preparing the CUDA build cache, once per torch version"; a save meanwhile waits
for that work (their lock) instead of starting it again. Nothing runs in the server process, and
nothing is shown when the headers are already there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from kernel_lsp.server.progress import WorkProgress

if TYPE_CHECKING:
    from kernel_lsp.server.app import KernelLanguageServer

log = logging.getLogger(__name__)


class BuildCachePreparation:
    def __init__(self, ls: "KernelLanguageServer") -> None:
        self.ls = ls
        self.task: asyncio.Task[None] | None = None
        self.result: dict[str, Any] | None = None  # the Worker's answer ("ready", "made", ...)
        self.skipped = ""                           # why nothing was started

    def start(self) -> None:
        """Run in the background as one of the server's jobs (not shown; cancelled at its close)."""
        if self.task is None:
            job = self.ls.jobs.start(("prepare", "build cache"), "Prepare the CUDA build cache", self._run(),
                                     visible=False)
            self.task = job.task

    async def _run(self) -> None:
        from kernel_lsp.engine.caller.pool import PREPARE_TITLE, preparing_wanted
        from kernel_lsp.server.engine_host import ExecutionDisabled

        settings = self.ls.settings
        wanted, why = preparing_wanted()
        if not settings.execution_enabled:
            wanted, why = False, "running code is off"
        elif settings.executor != "local":
            wanted, why = False, f"builds run on the {settings.executor} executor"
        if not wanted:
            self.skipped = why
            log.info("not preparing the CUDA build cache: %s", why)
            return
        try:
            engine = self.ls.host.engine()
        except ExecutionDisabled as exc:
            self.skipped = str(exc)
            return
        progress: WorkProgress | None = None
        t0 = time.monotonic()

        async def announce(check: dict[str, Any]) -> None:
            nonlocal progress
            if progress is not None:  # waited for another process, which failed: now this one makes them
                progress.report("making them here (about a minute)")
                return
            progress = WorkProgress(self.ls, PREPARE_TITLE)
            if check.get("state") == "waiting":  # once per machine: another kernel-lsp process makes them
                await progress.begin(f"torch {check.get('torch', '')}: {check.get('who', 'another kernel-lsp process')} "
                                     "is making them; a save meanwhile waits for them")
                return
            await progress.begin(f"torch {check.get('torch', '')}: precompiled headers for fast builds "
                                 "(about a minute; a save meanwhile waits for them)")

        try:
            self.result = await engine.prepare_builds(announce)
        except Exception as exc:  # noqa: BLE001 - a failure here only costs the first build the time
            self.result = {"state": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        state = self.result.get("state")
        if progress is not None:
            if state == "made":
                progress.end(f"ready in {time.monotonic() - t0:.0f} s")
            elif state == "ready":
                progress.end(f"ready (made by kernel-lsp pid {self.result.get('prepared_by', '?')}; "
                             f"waited {time.monotonic() - t0:.0f} s)")
            else:
                progress.end(f"not made ({self.result.get('reason', state)}); a build makes them when it "
                             "needs them")
        log.info("CUDA build cache: %s", self.result)
