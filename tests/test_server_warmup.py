"""The GPU Worker started as the server starts (server/worker_warmup.py): only where saves are
measured, running code is on, the executor is this machine and a GPU is seen; then the first
save finds the Worker up (one start, no second Worker)."""

from __future__ import annotations

import pytest

from kernel_lsp.config import Settings
from kernel_lsp.server import worker_warmup
from kernel_lsp.server.app import create_server


def _server(**settings):
    ls = create_server()
    ls.settings = Settings(**settings)
    return ls


def test_started_only_where_saves_are_measured_on_a_local_gpu(monkeypatch):
    monkeypatch.delenv("KERNEL_LSP_WARM_WORKER", raising=False)
    measured = {"on_save": ["compile", "verify", "bench"]}
    assert worker_warmup.wanted(_server(**measured), "sm_90") == (True, "")
    assert worker_warmup.wanted(_server(**measured), None) == (False, "no GPU seen by nvidia-smi")
    assert worker_warmup.wanted(_server(on_save=["compile"]), "sm_90") == (False, "saves are not measured (on_save)")
    assert worker_warmup.wanted(_server(**measured, execution_enabled=False), "sm_90") == (False, "running code is off")
    ok, why = worker_warmup.wanted(_server(**measured, executor="ray"), "sm_90")
    assert not ok and "ray" in why
    monkeypatch.setenv("KERNEL_LSP_WARM_WORKER", "0")
    assert worker_warmup.wanted(_server(**measured), "sm_90") == (False, "KERNEL_LSP_WARM_WORKER is off")


async def test_the_worker_is_up_before_the_first_save(monkeypatch, tmp_path):
    """With a GPU seen (nvidia-smi's answer given here; the Worker itself runs on the CPU), the
    Engine's Worker is started and warmed at `initialized`; without one, no Engine is made."""
    monkeypatch.delenv("KERNEL_LSP_WARM_WORKER", raising=False)
    import kernel_lsp.config as config

    ls = _server(on_save=["compile", "verify", "bench"], sandbox="off")
    monkeypatch.chdir(tmp_path)  # the workspace (no client here: the current folder)
    monkeypatch.setattr(config, "detect_arch", lambda: "sm_90")
    warm = worker_warmup.WorkerWarmUp(ls)
    warm.start()
    await warm.task
    try:
        assert warm.started is True, warm.skipped
        engine = ls.host._engine
        assert engine is not None and engine.worker_pid is not None and engine._worker.warm is not None
        assert engine.restarts == 0
        assert warm.compiled is not None and warm.compiled["state"] == "compiled", warm.compiled
    finally:
        await ls.host.aclose()

    ls = _server(on_save=["compile", "verify", "bench"], sandbox="off")
    monkeypatch.setattr(config, "detect_arch", lambda: None)
    warm = worker_warmup.WorkerWarmUp(ls)
    warm.start()
    await warm.task
    assert warm.started is None and warm.skipped == "no GPU seen by nvidia-smi" and ls.host._engine is None
