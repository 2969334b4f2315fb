"""Tasks, the Worker, verify, bench, profile (docs/architecture.md, `engine/`).

Caller side: ``Engine`` (client.py) and ``find_task`` (tasks.py). Names are loaded
lazily so that the Worker, which imports ``kernel_lsp.engine.worker``, pulls in no
caller-side module it does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernel_lsp.engine.client import Engine, EngineTimeout, WorkerDied, WorkerRaised
    from kernel_lsp.engine.pool import BuildPool
    from kernel_lsp.engine.tasks import compile_task, find_task

_LAZY = {
    "Engine": "kernel_lsp.engine.client",
    "EngineTimeout": "kernel_lsp.engine.client",
    "WorkerDied": "kernel_lsp.engine.client",
    "WorkerRaised": "kernel_lsp.engine.client",
    "worker_environment": "kernel_lsp.engine.client",
    "BuildPool": "kernel_lsp.engine.pool",
    "find_task": "kernel_lsp.engine.tasks",
    "compile_task": "kernel_lsp.engine.tasks",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernel_lsp.engine' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
