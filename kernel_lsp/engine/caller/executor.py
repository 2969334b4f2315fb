"""Executors: where Workers live, behind one small interface (executor_api.py).

The CLI, the server and the agent ask ``open_executor`` for an engine-like object and use
only what ``Executor`` names: ``evaluate``, ``prebuild``, ``profile``, ``device_info``,
``aclose``, plus ``kind``, ``concurrency`` (evaluations worth running at once: the
Search's batch width) and ``status()`` (for the editor's "cluster connected / lost").

- ``LocalExecutor``: the existing ``Engine`` (a Worker subprocess on this machine); the default.
- ``RayExecutor`` (ray_executor.py, the optional extra ``kernel-lsp[ray]``): one actor per
  GPU of a Ray cluster, each holding a warm local Engine on its node.

An Executor that cannot start (no ``ray`` package, an unreachable address, no GPU of the
asked kind) raises ``ExecutorUnavailable`` with one clear sentence: the CLI exits 2 on it,
and the server keeps working with the local Executor.
"""

from __future__ import annotations

import os

from typing import Any

from kernel_lsp.engine.caller.client import Engine
from kernel_lsp.engine.caller.executor_api import EXECUTORS, Executor, ExecutorUnavailable, StatusCallback

__all__ = ["EXECUTORS", "Executor", "ExecutorUnavailable", "StatusCallback"]


class LocalExecutor(Engine):
    """The Engine as an Executor: one Worker subprocess here, one evaluation on the GPU at a time
    (its Evaluations carry executor="local", the model's default)."""

    kind = "local"

    @property
    def concurrency(self) -> int:
        return 1

    def status(self) -> dict[str, Any]:
        return {"executor": "local", "state": "connected", "address": None, "gpus": 1, "nodes": [],
                "message": "Workers run as subprocesses on this machine"}


async def open_executor(
    kind: str | None = "local",
    *,
    ray_address: str | None = None,
    gpu: str | None = None,
    max_gpus: int | None = None,
    store: Any = None,
    python: str | None = None,
    device: int | str | None = None,
    timeout: float = 120.0,
    options: dict[str, Any] | None = None,
    on_status: StatusCallback | None = None,
    connect_timeout: float = 30.0,
    baselines: Any = None,
    keep_worker: float | None = None,
) -> Executor:
    """The Executor for settings (``executor``, ``ray_address``, ``gpu``, ``max_gpus``).
    Raises ExecutorUnavailable when a Ray cluster cannot be used. ``keep_worker``: seconds the local
    GPU Worker stays for the next command (caller/keeper.py; the CLI's bench), ignored by Ray."""
    kind = (kind or "local").lower()
    if kind == "local":
        return LocalExecutor(store=store, python=python, device=device, timeout=timeout, options=options,
                             baselines=baselines, keep_worker=keep_worker)
    if kind != "ray":
        raise ExecutorUnavailable(f"unknown executor {kind!r} (use one of: {', '.join(EXECUTORS)})")
    from kernel_lsp.engine.caller.ray_executor import RayExecutor  # noqa: PLC0415 - ray only when asked for

    ex = RayExecutor(ray_address, store=store, gpu=gpu, max_gpus=max_gpus, timeout=timeout,
                     python=python, options=options, on_status=on_status, connect_timeout=connect_timeout)
    await ex.connect()
    return ex


def executor_settings(settings: Any, ns: Any = None) -> dict[str, Any]:
    """``open_executor`` keywords from Settings (``executor``, ``ray_address``, ``gpu``,
    ``max_gpus``), with command-line flags (``--executor``, ``--ray-address``) laid over them;
    ``--ray-address`` alone means the Ray executor."""
    flag_kind = getattr(ns, "executor", None)
    flag_address = getattr(ns, "ray_address", None)
    kind = flag_kind or ("ray" if flag_address else None) or getattr(settings, "executor", None) or "local"
    address = flag_address or getattr(settings, "ray_address", None)
    max_gpus = getattr(settings, "max_gpus", 0) or None
    return {"kind": kind, "ray_address": address, "gpu": getattr(settings, "gpu", None), "max_gpus": max_gpus,
            "connect_timeout": ray_connect_timeout(30.0)}


def ray_connect_timeout(default: float) -> float:
    """`default`, or KERNEL_LSP_RAY_CONNECT_TIMEOUT (seconds) for a slow cluster: the same variable
    for the command line and the server (a Ray Client's first connection can take tens of seconds
    on a loaded head)."""
    try:
        return max(1.0, float(os.environ.get("KERNEL_LSP_RAY_CONNECT_TIMEOUT") or default))
    except ValueError:
        return default


async def open_or_local(kind: str | None = "local", **kw: Any) -> tuple[Executor, str | None]:
    """For the server: the asked Executor, or, when a Ray cluster cannot be used, the local one
    and the sentence saying why (show it; local evaluations keep working meanwhile)."""
    try:
        return await open_executor(kind, **kw), None
    except ExecutorUnavailable as exc:
        if (kind or "local") == "local":
            raise
        local_kw = {k: kw[k] for k in ("store", "python", "device", "timeout", "options", "baselines") if k in kw}
        return LocalExecutor(**local_kw), f"{exc}; running on this machine instead"
