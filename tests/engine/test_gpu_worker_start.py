"""The loop's start on a real GPU (issue 21): the GPU Worker initializes CUDA while it imports,
`kernel-lsp bench` of a cached candidate starts one Worker, and the reference's torch.compile
prepared while the pool builds makes the evaluation's own compile short.

Run on the device:  python -m pytest tests/engine/test_gpu_worker_start.py -m gpu -q -s
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine import Engine, protocol  # noqa: E402
from kernel_lsp.engine.caller.tasks import find_task  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.editor_loop import GELU  # noqa: E402


async def _ready_s(env: dict[str, str]) -> tuple[float, dict]:
    t0 = time.monotonic()
    async with Engine(timeout=300.0, warm=True, env=env, sandbox="off") as engine:
        info = await engine.device_info()
        seconds = time.monotonic() - t0
        return seconds, {"warm": engine._worker.warm, "info": info}  # type: ignore[union-attr]


async def test_the_gpu_worker_initializes_cuda_while_it_imports():
    serial_s, serial = await _ready_s({protocol.WORKER_ROLE_ENV: "serial"})
    early_s, early = await _ready_s({})
    print(f"\nWorker ready with device_info: serial {serial_s:.2f} s, overlapped {early_s:.2f} s; "
          f"early CUDA: {early['warm'].get('early_cuda')}")
    assert early["warm"]["early_cuda"]["state"] == "ready", early["warm"]
    assert "early_cuda" not in serial["warm"]
    assert early["info"]["cuda"] and early["info"].get("driver") == serial["info"].get("driver")
    assert early["info"].get("max_sm_clock_mhz") == serial["info"].get("max_sm_clock_mhz")
    assert early_s < serial_s + 1.0  # never slower (page cache and clocks vary a little)


def _bench(folder: Path, name: str, env: dict[str, str]) -> tuple[float, dict]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "bench", name, "--json", "--timings"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    return time.monotonic() - t0, json.loads(proc.stdout)


def test_cli_bench_of_a_cached_candidate_starts_one_worker(tmp_path):
    """In a folder under /tmp (which the sandbox hides unless bound in): the second run, with
    its build and baselines kept, starts the Worker once, before the evaluation."""
    (tmp_path / "gelu.py").write_text(GELU)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    _bench(tmp_path, "gelu.py", env)
    seconds, doc = _bench(tmp_path, "gelu.py", env)
    phases = [(p["phase"], p["seconds"]) for p in doc["timings"]["phases"]]
    print(f"\nkernel-lsp bench of a cached candidate: {seconds:.1f} s wall")
    for name, secs in phases:
        print(f"  {name:<60} {secs:7.3f}")
    target = doc["targets"][0]
    assert target["verdict"] == "correct" and target["baselines_cached"] is True, target
    assert not [n for n, _ in phases if n.endswith(("starting worker", "warming worker"))], phases


async def test_the_reference_compiled_ahead_shortens_the_evaluations_compile(tmp_path):
    path = tmp_path / "gelu.py"
    path.write_text(GELU)
    task, cand = find_task(str(path), GELU)
    async with Engine(timeout=600.0, sandbox="off") as engine:
        got = await engine.request("prepare_reference", {"task": task.to_dict(), "options": {}},
                                   timeout=600.0, warm=True)
        assert got["state"] == "compiled", got
        ev = await engine.evaluate(task, cand)
    compile_s = ev.evidence["phases"]["torch_compile_s"]
    print(f"\nreference compiled ahead in {got['seconds']:.2f} s; the evaluation's own compile {compile_s:.2f} s")
    assert ev.verdict == "correct", ev.message
    assert compile_s < got["seconds"]


def _descendants(pid: int) -> list[str]:
    """The command lines of a process's descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/cmdline", "rb") as fh:
                out.append(fh.read().replace(b"\0", b" ").decode(errors="replace").strip())
        except OSError:
            continue
    return out


async def test_a_worker_compiles_without_a_pool_of_compile_processes():
    """Inductor's default starts a compile subprocess per CPU at a process's first torch.compile;
    a Worker compiles on one thread (caller/process.py), so six benches at once do not start 96."""
    async with Engine(timeout=300.0, sandbox="off") as engine:
        t0 = time.monotonic()
        got = await engine.prepare_compile()
        seconds = time.monotonic() - t0
        pid = engine.worker_pid
        assert pid is not None
        await asyncio.sleep(1.0)  # a pool, if one were started, would be up by now
        kids = _descendants(pid)
    print(f"\nprepare_compile in {seconds:.2f} s: {got}; the Worker's descendants: {kids}")
    assert got.get("state") == "compiled", got
    assert not [k for k in kids if "compile_worker" in k or "multiprocessing" in k], kids
