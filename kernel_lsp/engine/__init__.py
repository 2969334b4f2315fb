"""The engine: Tasks, the Worker, verify, bench, profile (docs/architecture.md, `engine/`).

Two rooms, one per process role:

- ``caller/``: what runs in the process that asks for work (the server, the CLI, the agent,
  a Ray actor): the ``Engine`` client, the executors (local and Ray), the build pool, the
  Worker process and its sandbox, Task discovery. No torch, and no candidate code, here.
- ``worker/``: what runs inside the sandboxed Worker process, where a Candidate is built,
  imported and run: build, harness, verify, bench, profile, extract, the Worker's main.
- ``protocol.py``, the wire between them, is the only module both rooms import (besides the
  records in ``kernel_lsp.model``). tests/test_architecture.py holds the line.

The public names below are the caller side's, loaded lazily so that the Worker, which runs
``python -m kernel_lsp.engine.worker``, pulls in none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernel_lsp.engine.caller import sandbox
    from kernel_lsp.engine.caller.client import Engine, EngineTimeout, WorkerDied, WorkerRaised
    from kernel_lsp.engine.caller.pool import BuildPool
    from kernel_lsp.engine.caller.process import WorkerProcess, worker_environment
    from kernel_lsp.engine.caller.sandbox import SandboxUnavailable
    from kernel_lsp.engine.caller.tasks import compile_task, find_task

_LAZY = {
    "Engine": "kernel_lsp.engine.caller.client",
    "EngineTimeout": "kernel_lsp.engine.caller.client",
    "WorkerDied": "kernel_lsp.engine.caller.client",
    "WorkerRaised": "kernel_lsp.engine.caller.client",
    "worker_environment": "kernel_lsp.engine.caller.process",
    "WorkerProcess": "kernel_lsp.engine.caller.process",
    "SandboxUnavailable": "kernel_lsp.engine.caller.sandbox",
    "BuildPool": "kernel_lsp.engine.caller.pool",
    "find_task": "kernel_lsp.engine.caller.tasks",
    "compile_task": "kernel_lsp.engine.caller.tasks",
}
_MODULES = {"sandbox": "kernel_lsp.engine.caller.sandbox"}  # `from kernel_lsp.engine import sandbox`

__all__ = sorted([*_LAZY, *_MODULES])


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'kernel_lsp.engine' has no attribute {name!r}")
    globals()[name] = value
    return value
