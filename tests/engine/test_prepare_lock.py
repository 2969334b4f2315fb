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
from kernel_lsp.engine.caller.pool import PREPARE_TITLE
from tests.needs import needs_nvcc

ROOT = Path(__file__).resolve().parents[2]
# Holds the preparation lock of argv[1] for argv[2] seconds (or until the file argv[2] exists); with
# argv[3] == "make", first makes
# the light headers' files as a preparation would (empty: only their presence is looked at).
HOLD = """
import sys, time
from pathlib import Path
from kernel_lsp.engine.caller import prepare_lock

fd = prepare_lock.try_take(prepare_lock.lock_path(sys.argv[1]))
assert fd is not None
print("held", flush=True)
try:
    time.sleep(float(sys.argv[2]))
except ValueError:  # a file to wait for: the test says when
    t0 = time.time()
    while not Path(sys.argv[2]).exists() and time.time() - t0 < 120:
        time.sleep(0.05)
if sys.argv[3] == "make":
    from kernel_lsp.engine.worker.build import build, fastbuild
    flags = fastbuild.torch_flags(build._find_nvcc(None))
    for text in fastbuild.LIGHT_HEADERS.values():
        d = fastbuild.pch_dir(flags, text)
        d.mkdir(parents=True, exist_ok=True)
        (d / "klsp_torch.h.gch").write_bytes(b"")
prepare_lock.release(fd)
print("released", flush=True)
"""


def hold(root: Path, seconds: "float | Path", make: bool = False, env: dict[str, str] | None = None) -> subprocess.Popen:
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
    go_on = tmp_path / "go"

    def announce(check: dict) -> None:
        said.append(check)
        go_on.touch()  # seen waiting: the other process now makes the headers and lets go

    async def go():
        pool = BuildPool(size=1, sandbox="off")
        try:
            return await pool.prepare(announce)
        finally:
            await pool.aclose()

    # The other process holds the lock and makes the headers while this one's pool waits.
    other = hold(cache / "pch", go_on, make=True)
    result = asyncio.run(go())
    assert other.wait(60) == 0
    assert result["state"] == "ready", result
    assert result["prepared_by"] == other.pid and result["waited_s"] > 0, result
    # Told once, that the other process prepares; never told "preparing" itself (it did nothing).
    assert [c["state"] for c in said] == ["waiting"], said
    assert f"kernel-lsp pid {other.pid}" in said[0]["who"]
    assert not any((p / "made.json").exists() for p in (cache / "pch").iterdir() if p.is_dir())


@needs_nvcc
@pytest.mark.slow
async def test_the_server_says_who_prepares_and_waits_for_it(tmp_path):
    """The editor's progress names the process that prepares the cache, and ends when its headers
    are there: this server makes nothing."""
    pytest.importorskip("torch")
    from lsprotocol import types
    from pytest_lsp import client_capabilities

    from tests.lsp_client import config, wait_for

    cache = tmp_path / "cache"
    env = {**os.environ, "KERNEL_LSP_CACHE": str(cache), "KERNEL_LSP_PREPARE_BUILDS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("KERNEL_LSP_PCH_CACHE", None)
    go = tmp_path / "go"
    other = hold(cache / "pch", go, make=True, env={"KERNEL_LSP_CACHE": str(cache)})
    lsp = await config(env=env).start()
    try:
        await lsp.initialize_session(types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"), root_uri=tmp_path.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=tmp_path.as_uri(), name="ws")]))

        def reports(kind: str):
            for values in lsp.progress_reports.values():
                if any(getattr(v, "title", "") == PREPARE_TITLE for v in values):
                    return next((v for v in values if getattr(v, "kind", "") == kind), None)
            return None

        begun = await wait_for(lambda: reports("begin"), timeout=120, what="the preparation's progress")
        go.touch()  # the other process has been seen preparing: now it makes the headers and lets go
        end = await wait_for(lambda: reports("end"), timeout=120, interval=0.2, what="its end")
    finally:
        await lsp.shutdown_session()
        await lsp.stop()
        other.wait(60)
    assert f"kernel-lsp pid {other.pid}" in (begun.message or ""), begun.message
    assert end.message.startswith(f"ready (made by kernel-lsp pid {other.pid}"), end.message
    assert not list((cache / "pch").glob("*/made.json"))  # nothing made here


@needs_nvcc
@pytest.mark.slow
def test_the_command_line_says_it_waits_for_the_process_that_prepares(tmp_path, monkeypatch):
    """`kernel-lsp bench` / `optimize` (cli/prepare.py): one line naming who prepares, one when it
    is ready; never "preparing the CUDA build cache" of its own."""
    pytest.importorskip("torch")
    import io

    from kernel_lsp.cli import prepare
    from kernel_lsp.engine import Engine
    from kernel_lsp.model import Candidate

    cache = tmp_path / "cache"
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(cache))
    monkeypatch.delenv("KERNEL_LSP_PCH_CACHE", raising=False)
    monkeypatch.setenv("KERNEL_LSP_PREPARE_BUILDS", "1")
    go_on = tmp_path / "go"
    other = hold(cache / "pch", go_on, make=True)
    err = io.StringIO()

    async def go():
        async with Engine(timeout=60.0, sandbox="off") as engine:
            task = prepare.start(engine, [Candidate(source="# load_inline\n", kind="python")], err)
            assert task is not None
            while "waiting for the CUDA build cache" not in err.getvalue() and not task.done():
                await asyncio.sleep(0.05)
            go_on.touch()
            await asyncio.wait_for(task, 120)

    asyncio.run(go())
    assert other.wait(60) == 0
    lines = err.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("kernel-lsp: waiting for the CUDA build cache") and f"pid {other.pid}" in lines[0]
    assert lines[1].startswith(f"kernel-lsp: CUDA build cache ready (made by kernel-lsp pid {other.pid}; waited")
