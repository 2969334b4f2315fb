"""One evaluation on a GPU at a time, machine-wide: a file lock per GPU (caller side, no torch).

Several kernel-lsp processes share a GPU (a CLI bench beside the editor's server, four benches
started at once): each Engine's own lock orders only its own requests, and two evaluations of
large Tasks at once can run the GPU out of memory, a verdict against a candidate that alone
fits. So the GPU phase of an evaluation (the Worker's requests in client.GPU_OPS: evaluate,
profile, extract and the torch.compile preparations) takes `gpu_turn(key)` first: an exclusive
`flock` on `<lock dir>/<GPU uuid>.lock`, where the lock dir is `$KERNEL_LSP_GPU_LOCK_DIR`, else
`<temp dir>/kernel-lsp-gpu-locks` (one per machine, not per cache folder, so processes with
different caches still take turns). The kernel drops the lock when its holder dies; nothing is
left to clean up.

The wait is polled from the event loop (never a blocked thread), shown through `progress`
with who holds the GPU, and bounded: past `wait_s` it raises GPUBusy (the evaluation could not
run, exit 2). The Worker's deadline starts once the turn is taken, so waiting is never a
candidate's timeout. Timings gain too: two evaluations timed at once slow each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import sys
import tempfile
import time
from typing import Any, AsyncIterator, Awaitable, Callable

# How often a waiter tries the lock; a turn handed over costs at most this much idle GPU time.
POLL_S = 0.05
# Waiting longer than this for another process's evaluations is "could not run". Each holder's
# turn ends within its own deadline (120-300 s by default), so this lets a few queue ahead.
DEFAULT_WAIT_S = 900.0


class GPUBusy(Exception):
    """The GPU stayed held by other kernel-lsp evaluations past the wait: could not run."""


def lock_dir() -> str:
    return os.environ.get("KERNEL_LSP_GPU_LOCK_DIR") or os.path.join(tempfile.gettempdir(), "kernel-lsp-gpu-locks")


def lock_path(key: str) -> str:
    return os.path.join(lock_dir(), re.sub(r"[^\w.-]", "_", key)[:120] + ".lock")


def open_lock(path: str) -> int:
    """An fd on the lock file `path`, its folder made (shared by every user of the machine)."""
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o1777)  # shared by every user of the machine, like /tmp
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)
    return fd


def holder(path: str) -> dict[str, Any] | None:
    """What the process holding the lock wrote about itself (pid, command, since), if anything."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def describe(info: dict[str, Any] | None) -> str:
    if not info:
        return "another kernel-lsp process"
    held = time.time() - float(info.get("since") or time.time())
    return f"kernel-lsp pid {info.get('pid')} ({info.get('command', '?')}: {info.get('op', '?')}, for {held:.0f} s)"


@contextlib.asynccontextmanager
async def gpu_turn(key: str | None, what: str = "", wait_s: float | None = None,
                   progress: Callable[[str], Awaitable[Any] | Any] | None = None) -> AsyncIterator[float]:
    """Hold the GPU `key` (its uuid) for the block; yields the seconds waited. `key` None: no
    lock (CPU work, or a GPU without a uuid)."""
    if not key:
        yield 0.0
        return
    if wait_s is None:
        wait_s = float(os.environ.get("KERNEL_LSP_GPU_WAIT_S") or DEFAULT_WAIT_S)
    path = lock_path(key)
    fd = await asyncio.to_thread(open_lock, path)
    t0 = time.monotonic()
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            waited = time.monotonic() - t0
            if waited > wait_s:
                raise GPUBusy(f"the GPU stayed busy with {describe(holder(path))} for more than {wait_s:.0f} s "
                              "(kernel-lsp runs one evaluation per GPU at a time)")
            if not told and progress is not None:
                told = True
                await tell(progress, f"waiting for the GPU: {describe(holder(path))} is using it")
            await asyncio.sleep(POLL_S)
        waited = time.monotonic() - t0
        stamp(fd, what or "?")
        try:
            yield waited
        finally:
            unlock(fd)
    finally:
        os.close(fd)


async def tell(callback: Callable[[Any], Awaitable[Any] | Any] | None, what: Any) -> None:
    """A waiter's announcement (sync or async): what it raises must not stop the wait."""
    if callback is None:
        return
    with contextlib.suppress(Exception):
        out = callback(what)
        if asyncio.iscoroutine(out):
            await out


def stamp(fd: int, what: str) -> None:
    """Write who holds the lock (read by `holder`) into the file of `fd`, which holds it."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "op": what, "command": _command(),
                                  "since": time.time()}).encode(), 0)


def unlock(fd: int) -> None:
    """Clear the stamp, then let the lock go (the fd stays open)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)


def _command() -> str:
    argv = [os.path.basename(a) for a in sys.argv[:3]]
    return " ".join(argv) or "python"


def enabled() -> bool:
    """$KERNEL_LSP_GPU_LOCK=0 turns the machine-wide turn off (each process then uses the GPU
    as it likes, as before)."""
    return os.environ.get("KERNEL_LSP_GPU_LOCK", "1").strip().lower() not in ("0", "false", "no", "off")
