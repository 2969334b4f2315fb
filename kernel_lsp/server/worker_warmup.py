"""The GPU Worker, started as the server starts (when saves are measured and a GPU is here).

A first save used to pay for the Worker's start (torch import, CUDA init, the evaluation modules:
about 10 s on the H200) after its build. Here the Engine's Worker is started and warmed as soon
as the client has said `initialized`, in the background, so the first save finds it ready (a save
meanwhile waits for that start rather than making a second Worker); when saves bench, torch.compile's
one-time costs (inductor and Triton imports, its compile workers) are paid next, on a small function
of our own. Only when running code is on,
the executor is this machine, `on_save` measures (verify or bench) and nvidia-smi sees a GPU: on a
machine without one, or with measuring off, nothing starts. The Worker holds a CUDA context (about
0.5 GB of GPU memory) from then on, as it would after the first save.
`KERNEL_LSP_WARM_WORKER=0` turns it off.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernel_lsp.server.app import KernelLanguageServer

log = logging.getLogger(__name__)


def wanted(ls: "KernelLanguageServer", gpu_arch: str | None) -> tuple[bool, str]:
    """(whether to start the GPU Worker at the server's start, why not)."""
    settings = ls.settings
    if os.environ.get("KERNEL_LSP_WARM_WORKER", "1").strip().lower() in ("0", "false", "no", "off"):
        return False, "KERNEL_LSP_WARM_WORKER is off"
    if not settings.execution_enabled:
        return False, "running code is off"
    if settings.executor != "local":
        return False, f"evaluations run on the {settings.executor} executor"
    if not {"verify", "bench"} & set(settings.on_save):
        return False, "saves are not measured (on_save)"
    if gpu_arch is None:
        return False, "no GPU seen by nvidia-smi"
    return True, ""


class WorkerWarmUp:
    def __init__(self, ls: "KernelLanguageServer") -> None:
        self.ls = ls
        self.task: asyncio.Task[None] | None = None
        self.started: bool | None = None  # None: not tried; else whether the Worker came up
        self.skipped = ""                 # why nothing was started
        self.compiled: dict | None = None  # the Worker's answer to prepare_compile

    def start(self) -> None:
        """Run in the background as one of the server's jobs (not shown; cancelled at its close)."""
        if self.task is None:
            job = self.ls.jobs.start(("prepare", "gpu worker"), "Start the GPU Worker", self._run(), visible=False)
            self.task = job.task

    async def _run(self) -> None:
        from kernel_lsp.config import detect_arch
        from kernel_lsp.server.engine_host import ExecutionDisabled

        arch = await asyncio.to_thread(detect_arch)  # nvidia-smi, off the event loop
        ok, why = wanted(self.ls, arch)
        if not ok:
            self.skipped = why
            log.info("not starting the GPU Worker ahead of the first save: %s", why)
            return
        try:
            engine = self.ls.host.engine()
        except ExecutionDisabled as exc:
            self.skipped = str(exc)
            return
        self.started = await engine.start()
        log.info("GPU Worker started ahead of the first save: %s", self.started)
        if self.started and "bench" in self.ls.settings.on_save:
            # A first save's torch.compile baseline then finds inductor imported and its workers up.
            self.compiled = await engine.prepare_compile()
            log.info("torch.compile prepared: %s", self.compiled)
