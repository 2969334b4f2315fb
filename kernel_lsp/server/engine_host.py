"""The server's Store and Executors, made on first use.

The local Engine runs every harness and candidate in a Worker subprocess: nothing of torch,
and no user or model code, ever runs in the server process. With `executor = "ray"` the
evaluations go to a Ray cluster instead (cluster.py: connected in the background, the local
Engine standing in while the cluster is unreachable or lost).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Callable

from kernel_lsp.model import Candidate, Task
from kernel_lsp.server.cluster import ClusterLink

if TYPE_CHECKING:
    from kernel_lsp.engine import Engine
    from kernel_lsp.server.app import KernelLanguageServer
    from kernel_lsp.store import Store

log = logging.getLogger(__name__)


class ExecutionDisabled(Exception):
    """Running code is off (setting, or an untrusted workspace)."""


class EngineHost:
    def __init__(self, ls: "KernelLanguageServer") -> None:
        self.ls = ls
        self._said_unfenced = False  # the "no sandbox here" warning is shown once
        self._store: Store | None = None
        self._engine: Engine | None = None
        self._engine_key: tuple[Any, ...] | None = None
        self.cluster = ClusterLink(self)

    @property
    def root(self) -> str:
        return self.ls.root or os.getcwd()

    def store(self) -> "Store":
        if self._store is None:
            from kernel_lsp.store import Store

            self._store = Store.for_workspace(self.root)
        return self._store

    def engine(self) -> "Engine":
        """The Engine for the current settings; a settings change makes a new one."""
        settings = self.ls.settings
        if not settings.execution_enabled:
            raise ExecutionDisabled(
                "running kernels is off (kernelLsp.execution.enabled is false, or the workspace is "
                "not trusted); compile checks still run")
        key = (settings.python, settings.device, settings.timeout, settings.effective_arch, settings.sandbox)
        if self._engine is not None and key != self._engine_key:
            old, self._engine = self._engine, None
            asyncio.get_running_loop().create_task(old.aclose())
        if self._engine is None:
            from kernel_lsp.engine import Engine, sandbox

            try:  # required without a sandbox: no candidate runs, and the user is told why
                sandbox.resolve(settings.sandbox)
            except sandbox.SandboxUnavailable as exc:
                raise ExecutionDisabled(str(exc)) from None
            st = sandbox.status()
            if settings.sandbox == "auto" and not st.available and not self._said_unfenced:
                self._said_unfenced = True  # once per server: candidates run unfenced, how to fix it
                from lsprotocol import types

                self.ls.show(f"kernel-lsp: {st.message()}", types.MessageType.Warning)

            self._engine = Engine(store=self.store(), python=settings.python, device=settings.device,
                                  timeout=settings.timeout, cwd=self.root, sandbox=settings.sandbox,
                                  options={"arch": settings.effective_arch})
            self._engine_key = key
        return self._engine

    async def executor(self, note: Callable[[str], Any] | None = None) -> Any:
        """Where evaluations and Searches run now: the Ray cluster when `executor = "ray"` and
        it is connected (waiting for a connection under way), else the local Engine."""
        settings = self.ls.settings
        if not settings.execution_enabled:
            self.engine()  # raises ExecutionDisabled with its sentence
        ray = await self.cluster.executor(note)
        return ray if ray is not None else self.engine()

    def settings_changed(self) -> None:
        """A changed `executor` / `ray_address` / `gpu` / `max_gpus` reconnects, no restart."""
        self.cluster.settings_changed()

    def task_for(self, path: str, text: str) -> tuple[Task, Candidate | None]:
        """The Task of a document, named by its path in the workspace (unique in the store)."""
        from kernel_lsp.engine import find_task

        task, candidate = find_task(path, text)
        name = os.path.relpath(task.cuda_path or path, self.root)
        return dataclasses.replace(task, name=name), candidate

    async def aclose(self) -> None:
        await self.cluster.aclose()
        if self._engine is not None:
            await self._engine.aclose()
            self._engine = None
        if self._store is not None:
            self._store.close()
            self._store = None
