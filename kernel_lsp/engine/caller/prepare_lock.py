"""One process prepares the CUDA build cache, machine-wide; the others wait for it (caller side).

Six `kernel-lsp bench` started at once on a fresh machine each found the fast build's precompiled
torch headers missing, each told its user "preparing the CUDA build cache ... about a minute", and
each sent a build-pool Worker to make them (the headers' own lock made five of them wait inside
g++'s turn, with nothing said about who worked). Here the first process to find them missing takes
an exclusive `flock` on `<precompiled header folder>/.prepare.lock` (the folder the Worker named:
one per cache folder, so every process sharing the cache shares the lock) and prepares; the others
see it held, say who prepares ("kernel-lsp pid N (bench: ...)"), and poll it from the event loop
(never a blocked thread) without holding a build slot. When it frees they look again: the headers
are there (nothing to do), or the holder died or failed, and the first of them to take the lock
prepares. The kernel drops the lock with its holder; nothing is left to clean up.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from typing import Any, Awaitable, Callable

from kernel_lsp.engine.caller import gpu_lock

# How often a waiter looks at the lock: a wait ends at most this much after the preparation.
POLL_S = 0.2
WHAT = "preparing the CUDA build cache"


def lock_path(pch_root: str) -> str:
    return os.path.join(pch_root, ".prepare.lock")


def try_take(path: str) -> int | None:
    """The lock's fd, held and stamped with who holds it; None when another process holds it."""
    fd = gpu_lock.open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    gpu_lock.stamp(fd, WHAT)
    return fd


def release(fd: int) -> None:
    with contextlib.suppress(OSError):
        gpu_lock.unlock(fd)
    os.close(fd)


async def take(path: str, wait_s: float,
               on_wait: Callable[[dict[str, Any] | None], Awaitable[Any] | Any] | None = None
               ) -> tuple[int | None, float, dict[str, Any] | None]:
    """(fd or None past ``wait_s``, seconds waited, who held it when the wait began: None when
    it was free at once). ``on_wait``
    is called once, with the holder's stamp, when the lock is found held."""
    t0 = time.monotonic()
    held_by: dict[str, Any] | None = None
    told = False
    while True:
        fd = await asyncio.to_thread(try_take, path)  # open + mkdir may touch a slow disk
        if fd is not None:
            return fd, time.monotonic() - t0, held_by
        if not told:
            told = True
            held_by = gpu_lock.holder(path) or {}  # {}: held, by someone not yet stamped
            await gpu_lock.tell(on_wait, held_by)
        if time.monotonic() - t0 > wait_s:
            return None, time.monotonic() - t0, gpu_lock.holder(path) or held_by
        await asyncio.sleep(POLL_S)
