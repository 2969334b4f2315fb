"""A shared GPU never blames the candidate: the same kernel timed alone and while a second
process keeps the GPU busy gets the same verdict, no side-stream flag, about the same speedup,
and the shared run says it was timed on a shared GPU.

Run on the device:  python -m pytest tests/engine/test_gpu_shared.py -m gpu -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine.worker.build import build  # noqa: E402
from kernel_lsp.engine.worker.timing import gpu_share  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.model import Candidate, Evaluation, Task  # noqa: E402
from kernel_lsp.verdicts import evaluation_reason  # noqa: E402

pytestmark = pytest.mark.gpu

CHEATS = Path(__file__).parent / "cheats"
HARNESS = CHEATS / "gpu_relu2.py"
BUSY = """
import sys, torch
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


def evaluate() -> Evaluation:
    task = Task(name="gpu_relu2", reference_path=str(HARNESS), reference_source=HARNESS.read_text(),
                cuda_path=str(CHEATS / "gpu_relu2_fast.cu"), entry="relu2")
    cand = Candidate(source=(CHEATS / "gpu_relu2_fast.cu").read_text(), kind="cuda")
    return run.evaluate(task, cand, ["compile", "verify", "bench"],
                        {"bench_seconds": 1.0, "compile_mode": "default"}, build)


def test_busy_second_process_changes_neither_verdict_nor_flags() -> None:
    alone = evaluate()
    # Not our child: a shell starts it and exits, so it is another process, as another user's
    # job would be (a process this Worker started, like a build, is never counted as sharing).
    proc = subprocess.Popen(["sh", "-c", '"$0" -c "$1" & echo $!', sys.executable, BUSY],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    busy_pid = int(proc.stdout.readline())
    proc.wait()
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        # Can this machine list GPU processes at all (NVML / nvidia-smi see this namespace)?
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        listed = gpu_share.query_processes(uuid)
        print("processes on the GPU while busy:", listed)
        shared = evaluate()
    finally:
        os.kill(busy_pid, signal.SIGKILL)
    for ev in (alone, shared):
        assert ev.verdict == "correct", ev.message
        assert "side_stream_work" not in ev.flags and "not_counted" not in ev.flags, ev.evidence
        assert ev.custom_kernel is True
    assert alone.shared_gpu is None, alone.shared_gpu
    assert alone.speedup_eager and shared.speedup_eager
    ratio = shared.speedup_eager / alone.speedup_eager
    print(f"alone {alone.time.median_ms:.4f} ms ({alone.speedup_eager:.2f}x eager, spread "
          f"{alone.time.spread_pct:.1f} %); shared {shared.time.median_ms:.4f} ms "
          f"({shared.speedup_eager:.2f}x eager, spread {shared.time.spread_pct:.1f} %)")
    assert 0.6 < ratio < 1.6, (alone.speedup_eager, shared.speedup_eager)
    if not listed or not listed[1]:
        pytest.skip("NVML / nvidia-smi list no processes here (another PID namespace): the shared GPU "
                    "cannot be named on this machine; verdict, flags and speedup were checked")
    assert shared.shared_gpu is not None and shared.shared_gpu["count"] >= 1, shared.evidence
    assert any(p["pid"] == busy_pid for p in shared.shared_gpu["processes"]) or "note" in shared.shared_gpu
    assert shared.shared_gpu["spread_pct"] is not None
    assert "timed on a shared GPU" in evaluation_reason(shared)
