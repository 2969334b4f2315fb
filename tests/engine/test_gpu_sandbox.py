"""CUDA inside the sandbox, on a real GPU: device nodes, nvcc, a load_inline build (in the
sandboxed build pool, then loaded by the sandboxed GPU Worker), a .cu through `nvcc -shared`,
Nsight Compute where it runs, and the fences still holding for a GPU candidate.

Run on the device (bwrap on PATH):  python -m pytest -q -m gpu tests/engine/test_gpu_sandbox.py
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from kernel_lsp.engine import Engine, find_task
from kernel_lsp.model import Candidate, Task
from tests.needs import needs_sandbox

ROOT = Path(__file__).resolve().parents[2]
CHEATS = Path(__file__).parent / "cheats"
FAST = {"baselines": False, "bench_seconds": 0.5}

pytestmark = [pytest.mark.gpu,
              needs_sandbox]


async def test_load_inline_candidate_builds_and_runs_in_the_sandbox():
    task, cand = find_task(str(ROOT / "examples" / "relu_scale_inline.py"))
    assert cand is not None
    async with Engine(timeout=900.0, sandbox="required") as engine:
        ev = await engine.evaluate(task, cand, checks=("compile", "verify", "bench"), options=FAST)
        assert engine._pool is not None  # built first in the (sandboxed) CPU pool
    assert ev.verdict == "correct", ev.message
    assert ev.sandboxed and ev.device and ev.device.get("cuda")
    assert ev.compile is not None and ev.compile.ok and ev.time is not None


async def test_cu_candidate_through_nvcc_in_the_sandbox():
    harness = CHEATS / "gpu_relu2.py"
    cu = CHEATS / "gpu_relu2_fast.cu"
    task = Task(name="gpu_relu2", reference_path=str(harness), reference_source=harness.read_text(),
                cuda_path=str(cu), entry="relu2")
    async with Engine(timeout=600.0, sandbox="required") as engine:
        ev = await engine.evaluate(task, Candidate(source=cu.read_text(), kind="cuda"),
                                   checks=("compile", "verify", "bench"), options=FAST)
    assert ev.verdict == "correct", ev.message
    assert ev.sandboxed and ev.time is not None


async def test_a_gpu_candidate_still_meets_the_fences():
    task, cand = find_task(str(ROOT / "examples" / "relu_scale_inline.py"))
    assert cand is not None
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        head, new = cand.source.split("class ModelNew", 1)
        hostile = head + "class ModelNew" + new.replace(
            "super().__init__()",
            f"super().__init__()\n        import socket\n        torch.ones(1, device='cuda')\n"
            f"        socket.create_connection(('127.0.0.1', {port}), timeout=5)", 1)
        assert hostile.count("create_connection") == 1
        async with Engine(timeout=900.0, sandbox="required") as engine:
            ev = await engine.evaluate(task, Candidate(source=hostile, kind="python"), checks=("compile", "verify"))
        server.settimeout(0.1)
        with pytest.raises(OSError):
            server.accept()
    assert ev.verdict == "sandbox_violation" and "network" in ev.message, ev.message


@pytest.mark.skipif(shutil.which("ncu") is None and not os.path.exists("/usr/local/cuda/bin/ncu"),
                    reason="no ncu")
async def test_ncu_profile_in_the_sandbox_matches_outside():
    harness = CHEATS / "gpu_relu2.py"
    cu = CHEATS / "gpu_relu2_fast.cu"
    task = Task(name="gpu_relu2", reference_path=str(harness), reference_source=harness.read_text(),
                cuda_path=str(cu), entry="relu2")
    cand = Candidate(source=cu.read_text(), kind="cuda")
    results = {}
    for mode in ("off", "required"):
        async with Engine(timeout=600.0, sandbox=mode) as engine:
            results[mode] = await engine.profile(task, cand)
    outside = (results["off"].get("candidate") or {}).get("kernels")
    inside = (results["required"].get("candidate") or {}).get("kernels")
    # Nsight Compute runs on the H200 (--clock-control none): it sees the candidate's kernel outside
    # the sandbox, and the same kernels inside it.
    assert outside, results["off"].get("candidate")
    assert inside, results["required"].get("candidate")
    names = sorted(k["kernel"] for k in outside)
    assert sorted(k["kernel"] for k in inside) == names and any("relu2" in n for n in names), (names, inside)
