"""`kernel-lsp bench` keeps its GPU Worker for the next command (caller/keeper.py): the second run
reuses it and says so in --json, --timings and on stderr; --keep-worker 0 keeps nothing. The real
CLI, the real Engine and Worker on the CPU."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kernel_lsp.cli import main
from kernel_lsp.engine.caller import keeper as keeping
from tests.engine.test_keeper import end_keepers, gone_soon, ours

TASKS = Path(__file__).parent / "tasks"


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    for f in TASKS.glob("rowloop*.py"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERNEL_LSP_BASELINE_KEEP_SPREAD", "1000")
    folder = tempfile.mkdtemp(prefix="klk-", dir="/tmp")
    monkeypatch.setenv(keeping.DIR_ENV, folder)
    monkeypatch.setenv(keeping.KEEP_ENV, "60")  # tests/conftest.py turns keeping off for the rest
    yield folder
    end_keepers(folder)
    shutil.rmtree(folder, ignore_errors=True)


def bench(capsys, *flags: str) -> tuple[dict, str]:
    rc = main(["bench", "rowloop_new.py", "--json", *flags])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert rc == 0, doc
    return doc, captured.err


@pytest.mark.slow
def test_a_second_bench_reuses_the_kept_worker(workspace, capsys):
    first, err1 = bench(capsys)
    assert first["worker"]["kept"] is True and first["worker"]["reused"] is False
    assert first["worker"]["idle_s"] == 60
    assert "the GPU Worker stays for 60 s for the next run (--keep-worker 0 to stop it)" in err1
    keepers = ours(workspace)
    assert len(keepers) == 1

    second, err2 = bench(capsys, "--timings")
    assert second["worker"]["kept"] is True and second["worker"]["reused"] is True
    assert second["worker"]["pid"] == first["worker"]["pid"]
    assert "reused the kept GPU Worker" in err2
    phases = [p["phase"] for p in second["timings"]["phases"]]
    assert any(p.startswith(f"reusing the kept worker (pid {first['worker']['pid']}") for p in phases), phases
    assert "starting the Worker (spawn, torch import, CUDA init)" not in phases
    assert second["targets"][0]["verdict"] == "correct"

    # --keep-worker 0: a Worker of its own, ended with the command; the kept one is left alone.
    third, err3 = bench(capsys, "--keep-worker", "0")
    assert third["worker"] == {"kept": False, "reused": False, "idle_s": None}
    assert "stays for" not in err3
    assert ours(workspace) == keepers

    # --keep-worker 1: the newest command's idle time; the keeper then ends, and its Worker.
    fourth, _ = bench(capsys, "--keep-worker", "1")
    assert fourth["worker"]["reused"] is True and fourth["worker"]["idle_s"] == 1
    assert gone_soon(*keepers, fourth["worker"]["pid"], within=8.0)


@pytest.mark.slow
def test_a_reused_worker_does_not_wait_for_the_pools_early_build(workspace, capsys, monkeypatch):
    """The early build in the CPU pool only overlaps a Worker's start: with the kept Worker up at
    once, waiting for the pool's own start (3.8 s of a 4.8 s run on the H200) is dropped and the
    GPU Worker builds, or finds cached, the candidate itself."""
    import asyncio
    import gc
    import sys
    import time

    from kernel_lsp.cli import bench as bench_cli
    from kernel_lsp.model import Candidate

    bench(capsys)   # keeps the Worker
    started: list[float] = []

    def slow_early(engine, rows, options):
        # A real build in the CPU pool, given up while the pool's Worker still starts.
        inline = Candidate(source="from torch.utils.cpp_extension import load_inline\n"
                           "ext = load_inline(name='x', cpp_sources='', cuda_sources='__global__ void k() {}')\n",
                           kind="python")

        async def pool_still_starting() -> None:
            started.append(time.monotonic())
            await engine.prebuild(rows[0][1], inline, {"arch": "sm_90"})
            await asyncio.sleep(3600)
        return asyncio.ensure_future(pool_still_starting())

    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}"))
    monkeypatch.setattr(bench_cli, "_early_prebuild", slow_early)
    t0 = time.monotonic()
    second, err = bench(capsys, "--timings")
    gc.collect()
    assert started and time.monotonic() - t0 < 120
    assert second["worker"]["reused"] is True and second["targets"][0]["verdict"] == "correct"
    phases = [p["phase"] for p in second["timings"]["phases"]]
    assert "waiting for the early build" not in phases, phases
    # The pool Worker whose start was given up is let go of at once: nothing reaches the user's
    # terminal from the garbage collector ("Exception ignored ... Event loop is closed", seen on the H200).
    assert unraisable == [] and "Traceback" not in err, (unraisable, err[-2000:])
