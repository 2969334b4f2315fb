"""Test-only Worker ops (crash, sleep, echo, raise, environ, run_python), registered when
a test starts the Worker with ``KERNEL_LSP_WORKER_TEST_OPS=tests.engine.worker_ops``.
They are not in the production op table: a Worker in use answers only real ops."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

from kernel_lsp.engine.worker.build import build

ENV = {"KERNEL_LSP_WORKER_TEST_OPS": "tests.engine.worker_ops"}


def op_environ(params: dict[str, Any]) -> dict[str, Any]:
    return {"keys": sorted(os.environ), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def op_run_python(params: dict[str, Any]) -> dict[str, Any]:
    """Load a source with build.load_python and optionally call one of its functions."""
    module, result = build.load_python(params["source"], params.get("filename") or "<candidate>")
    value = None
    if module is not None and params.get("call"):
        value = getattr(module, params["call"])(*params.get("args", []))
    return {"compile": result.to_dict(), "value": value}


def op_sleep(params: dict[str, Any]) -> dict[str, Any]:
    time.sleep(float(params.get("seconds", 1.0)))
    return {"slept": params.get("seconds", 1.0)}


def op_crash(params: dict[str, Any]) -> None:
    how = params.get("how", "abort")
    if how == "segfault":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(int(params.get("code", 3)))
    os.abort()


def op_echo(params: dict[str, Any]) -> dict[str, Any]:
    # Writes to stdout on purpose: it must not reach the protocol channel.
    print(params.get("print", "noise on stdout"), flush=True)
    os.write(1, b"raw fd 1 noise\n")
    return params


def op_raise(params: dict[str, Any]) -> None:
    kinds: dict[str, type[BaseException]] = {"MemoryError": MemoryError, "ValueError": ValueError,
                                             "RuntimeError": RuntimeError}
    raise kinds.get(params.get("type", "RuntimeError"), RuntimeError)(params.get("message", "raised on request"))


def register(worker: Any) -> None:
    worker.ops.update({"environ": op_environ, "run_python": op_run_python, "sleep": op_sleep,
                       "crash": op_crash, "echo": op_echo, "raise": op_raise})
