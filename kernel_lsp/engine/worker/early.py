"""The GPU Worker's start, overlapped: CUDA's driver and the GPU's context are made in a thread
while the main thread imports torch and the evaluation modules.

A Worker's start used to be serial: import torch (3-4 s on the H200), then the ``warm`` op's
CUDA init (seconds: the driver, the GPU's primary context), then, at the first request, the
evaluation modules (dynamo, the profiler). Imports hold Python's lock; the driver calls made here
through ctypes release it, so the two run at once. torch's own init later finds the driver
initialized and the primary context (the one the CUDA runtime uses) made, and is quick.

Only the Engine's GPU Worker does this ($KERNEL_LSP_WORKER_ROLE=gpu, protocol.WORKER_ROLE_ENV);
build-pool Workers see no GPU. No candidate code has run yet: the thread ends before the
``warm`` op returns, which is before any request that loads a candidate.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

from kernel_lsp.engine import protocol

_state: dict[str, Any] = {}
_thread: list[threading.Thread] = []


def wanted(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ if env is None else env)
    return env.get(protocol.WORKER_ROLE_ENV) == protocol.GPU_ROLE and env.get("CUDA_VISIBLE_DEVICES") != ""


def _init_driver() -> None:
    t0 = time.perf_counter()
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:  # no NVIDIA driver here: torch will say so in its own words
        _state.update(state="no driver", reason=str(exc)[:200])
        return
    rc = lib.cuInit(0)
    _state["init_s"] = time.perf_counter() - t0
    if rc != 0:
        _state.update(state="failed", reason=f"cuInit returned {rc}")
        return
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        _state.update(state="no device")
        return
    dev = ctypes.c_int(0)
    ctx = ctypes.c_void_p()
    # Device 0 is torch's cuda:0 (CUDA_VISIBLE_DEVICES applies to both); torch retains the same
    # primary context when it first uses the GPU.
    if lib.cuDeviceGet(ctypes.byref(dev), 0) != 0 or lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
        _state.update(state="failed", reason="could not retain the primary context")
        return
    _state.update(state="ready", seconds=time.perf_counter() - t0)
    _state["smi_static"] = nvidia_smi(STATIC_FIELDS)  # the GPU's fixed facts, while torch still imports


STATIC_FIELDS = "driver_version,clocks.max.sm,clocks.max.mem"


def nvidia_smi(fields: str) -> list[str] | None:
    """The first GPU's values of `fields` from nvidia-smi; None where it cannot answer."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return [v.strip() for v in proc.stdout.strip().splitlines()[0].split(",")]


def static_smi() -> list[str] | None:
    """nvidia-smi's STATIC_FIELDS as the start's thread read them (after it ends); None when it
    did not (no GPU role, no driver, no nvidia-smi): the caller asks nvidia-smi itself."""
    if not _thread or _thread[0].is_alive():
        return None
    got = _state.get("smi_static")
    return list(got) if isinstance(got, list) and len(got) == 3 else None


def start() -> bool:
    """Start the driver's init in a thread (once); False where it is not wanted here."""
    if _thread or not wanted():
        return False
    t = threading.Thread(target=_init_driver, name="kernel-lsp-cuda-init", daemon=True)
    _thread.append(t)
    t.start()
    return True


def wait(timeout: float | None = None) -> dict[str, Any]:
    """Join the init thread (if one was started); what it did, for the ``warm`` answer."""
    if not _thread:
        return {}
    _thread[0].join(timeout)
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in _state.items()
           if k != "smi_static"}
    if _thread[0].is_alive():
        out["state"] = "still running"
    return out
