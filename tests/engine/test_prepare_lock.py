"""The CUDA build cache is prepared once per machine: one process prepares, the others say who and
wait (engine/caller/prepare_lock.py, BuildPool.prepare). Real processes contend for the lock; the
pool test runs a real build-pool Worker (torch, nvcc) against a holder that "makes" the headers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lsp.engine.caller import prepare_lock
from tests.needs import needs_nvcc

ROOT = Path(__file__).resolve().parents[2]
# Holds the preparation lock of argv[1] for argv[2] seconds; with argv[3] == "make", first makes
# the light headers' files as a preparation would (empty: only their presence is looked at).
HOLD = """
import sys, time
from pathlib import Path
from kernel_lsp.engine.caller import prepare_lock

fd = prepare_lock.try_take(prepare_lock.lock_path(sys.argv[1]))
assert fd is not None
print("held", flush=True)
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "make":
    from kernel_lsp.engine.worker import build, fastbuild
    flags = fastbuild.torch_flags(build._find_nvcc(None))
    for text in fastbuild.LIGHT_HEADERS.values():
        d = fastbuild.pch_dir(flags, text)
        d.mkdir(parents=True, exist_ok=True)
        (d / "klsp_torch.h.gch").write_bytes(b"")
prepare_lock.release(fd)
print("released", flush=True)
"""


def hold(root: Path, seconds: float, make: bool = False, env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, **(env or {}),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root), str(seconds), "make" if make else "no"],
                            env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_waits_for_the_one_preparing_and_is_told_who(tmp_path):
    other = hold(tmp_path, 1.0)
    told: list[object] = []

    async def go():
        return await prepare_lock.take(prepare_lock.lock_path(str(tmp_path)), 30.0, told.append)

    fd, waited, holder = asyncio.run(go())
    assert fd is not None
    prepare_lock.release(fd)
    assert other.wait(10) == 0 and other.stdout.readline().strip() == "released"
    assert waited >= 0.5 and holder and holder["pid"] == other.pid
    assert told == [holder] and holder["op"] == prepare_lock.WHAT
    # Free: taken at once, nobody to wait for, nothing said.
    fd, waited, holder = asyncio.run(go())
    prepare_lock.release(fd)
    assert holder is None and len(told) == 1


def test_a_wait_past_its_bound_gives_up_and_a_dead_holder_frees_the_lock(tmp_path):
    other = hold(tmp_path, 30.0)

    async def go(wait_s: float):
        return await prepare_lock.take(prepare_lock.lock_path(str(tmp_path)), wait_s)

    fd, waited, holder = asyncio.run(go(0.3))
    assert fd is None and holder and holder["pid"] == other.pid
    other.kill()
    other.wait(10)
    t0 = time.monotonic()
    fd, _, _ = asyncio.run(go(30.0))
    assert fd is not None and time.monotonic() - t0 < 10  # the kernel dropped the dead holder's lock
    prepare_lock.release(fd)


@needs_nvcc
@pytest.mark.slow
def test_the_pool_waits_for_another_process_and_does_not_prepare_again(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from kernel_lsp.engine.caller.pool import BuildPool

    cache = tmp_path / "cache"
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(cache))
    monkeypatch.delenv("KERNEL_LSP_PCH_CACHE", raising=False)
    said: list[dict] = []

    async def go():
        pool = BuildPool(size=1, sandbox="off")
        try:
            return await pool.prepare(said.append)
        finally:
            await pool.aclose()

    # The other process holds the lock and makes the headers while this one's pool looks.
    other = hold(cache / "pch", 4.0, make=True)
    result = asyncio.run(go())
    assert other.wait(60) == 0
    assert result["state"] == "ready", result
    assert result["prepared_by"] == other.pid and result["waited_s"] > 0.5, result
    # Told once, that the other process prepares; never told "preparing" itself (it did nothing).
    assert [c["state"] for c in said] == ["waiting"], said
    assert f"kernel-lsp pid {other.pid}" in said[0]["who"]
    assert not any((p / "made.json").exists() for p in (cache / "pch").iterdir() if p.is_dir())
