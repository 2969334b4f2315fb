"""Issue 20's edges on a real GPU: a race on a stream made in CUDA text is never credited; a
build failing in ModelNew.__init__ is a compile_error with its line through torch's own build;
out of memory while another process holds the GPU's memory is retried when it frees, else
"could not run" naming it; four kernel-lsp benches at once on one GPU take turns instead of
running each other out of memory.

Run on the device:  python -m pytest tests/engine/test_gpu_edges.py -m gpu -q -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.cli import main  # noqa: E402
from kernel_lsp.engine.worker.build import build  # noqa: E402
from kernel_lsp.engine.worker.timing import gpu_share  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.model import Candidate, Task  # noqa: E402
from kernel_lsp.verdicts import GPU_MEMORY_HELD  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
CHEATS = Path(__file__).parent / "cheats"
GIB = 1 << 30


# -- a race on a stream the candidate makes ------------------------------------------------------

def test_a_load_inline_kernel_on_its_own_stream_is_not_credited(tmp_path, monkeypatch, capsys):
    path = tmp_path / "inline_side_stream.py"
    path.write_text((CHEATS / "inline_side_stream.py").read_text())
    monkeypatch.chdir(tmp_path)
    code = main(["bench", str(path), "--json"])
    (t,) = json.loads(capsys.readouterr().out)["targets"]
    print("\n", {k: t.get(k) for k in ("verdict", "flags", "speedup_eager", "label", "message")})
    assert "side_stream" in t["flags"], t
    lines = {f["line"] for f in t["evidence"]["static"] if f["flag"] == "side_stream"}
    assert lines == {20, 21}, t["evidence"]["static"]   # where it makes the stream, where it launches on it
    if t["verdict"] == "correct":                       # the race may also show as a wrong answer
        assert "not_counted" in t["flags"] and t["custom_kernel"] is True
    assert code == 1 and t["status"] == 1                # never exit 0 crediting it


# -- a build failing in __init__, through torch's own build ---------------------------------------

IN_INIT = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f)
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="relu_in_init_gpu", cpp_sources="torch::Tensor relu_cuda(torch::Tensor x);",
                               cuda_sources=cuda_source, functions=["relu_cuda"])

    def forward(self, x):
        return self.ext.relu_cuda(x)
'''
RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return []
'''


def relu_task(tmp_path: Path, reference: str = RELU) -> Task:
    ref = tmp_path / "relu.py"
    ref.write_text(reference)
    return Task(name="relu", reference_path=str(ref), reference_source=reference)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-build", "torch-build"])
def test_a_build_failing_in_init_is_a_compile_error_with_its_line(tmp_path, monkeypatch, fast):
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_fast_inline", fast)
    ev = run.evaluate(relu_task(tmp_path), Candidate(source=IN_INIT, kind="python"), ["compile", "verify"],
                      {"baselines": False}, build)
    print("\n", ev.verdict, ev.message)
    assert ev.verdict == "compile_error", ev.message
    assert ev.message.startswith("does not build: line 9 (cuda.cu:8 as compiled): error: expected a \";\""), ev.message


# -- out of memory while another process holds the GPU -------------------------------------------

HOLDER = """
import sys, time, torch
keep_free = int(float(sys.argv[1]) * (1 << 30))
free, _ = torch.cuda.mem_get_info()
block = torch.empty(max(0, free - keep_free), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", block.numel() >> 30, flush=True)
time.sleep(float(sys.argv[2]))
"""
NEEDS_16_GIB = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        scratch = torch.empty(16 << 30, dtype=torch.uint8, device=x.device)  # 16 GiB of workspace
        scratch[:1] = 0
        return torch.relu(x)
'''


def hold(keep_free_gib: float, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(keep_free_gib), str(seconds)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("holding")
    return proc


def _evaluate_16_gib(tmp_path: Path):
    torch.cuda.empty_cache()
    return run.evaluate(relu_task(tmp_path), Candidate(source=NEEDS_16_GIB, kind="python"), ["compile", "verify"],
                        {"baselines": False}, build)


def test_memory_held_by_another_process_is_waited_for_and_retried(tmp_path):
    holder = hold(keep_free_gib=8, seconds=8)   # frees its memory after 8 s (the wait allows 60 s)
    try:
        ev = _evaluate_16_gib(tmp_path)
    finally:
        holder.kill()
        holder.wait(30)
    print("\n", ev.verdict, ev.message, (ev.evidence or {}).get("shared_oom_retry"))
    assert ev.verdict == "correct", ev.message
    retry = ev.evidence["shared_oom_retry"]
    assert retry["waited_s"] >= 3 and any(p["memory_mib"] > 64 * 1024 for p in retry["processes"]), retry


def test_memory_that_stays_held_is_could_not_run_naming_the_process(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_share, "SHARED_OOM_WAIT_S", 5.0)
    holder = hold(keep_free_gib=8, seconds=120)
    try:
        ev = _evaluate_16_gib(tmp_path)
    finally:
        holder.kill()
        holder.wait(30)
    print("\n", ev.verdict, ev.message)
    assert ev.verdict == "not_run" and ev.message.startswith(GPU_MEMORY_HELD), ev.message
    held = ev.evidence["gpu_memory_held"]
    assert held["retried"] is False and held["processes"], held
    seen = gpu_share.query_processes(str(torch.cuda.get_device_properties(0).uuid))
    if seen and any(p["pid"] == holder.pid for p in seen[1]):  # same PID namespace: named exactly
        assert f"pid {holder.pid} " in ev.message, ev.message


def test_out_of_memory_alone_is_the_candidates(tmp_path):
    src = NEEDS_16_GIB.replace("16 << 30", "4096 << 30")  # 4 TiB: more than any GPU holds
    ev = run.evaluate(relu_task(tmp_path), Candidate(source=src, kind="python"), ["compile", "verify"],
                      {"baselines": False}, build)
    assert ev.verdict == "oom", ev.message


# -- four benches at once take turns ---------------------------------------------------------------

SOFTMAX = '''import torch
import torch.nn as nn

batch_size = 4096
dim = 393216  # KernelBench level 1 problem 23's current size: 6 GiB per tensor


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


class ModelNew(nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
'''


def test_four_benches_at_once_take_turns_instead_of_running_out_of_memory(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), "KERNEL_LSP_GPU_LOCK_DIR": str(tmp_path / "locks")}
    # Each bench's progress goes to a file as it comes ($KERNEL_LSP_GPU_TEST_LOGS: where
    # benchmarks/gpu_steps.sh keeps its logs), so a run cut by its time cap still says where it was.
    logs = Path(os.environ.get("KERNEL_LSP_GPU_TEST_LOGS") or tmp_path)
    logs.mkdir(parents=True, exist_ok=True)
    procs, errs = [], []
    for i in range(4):
        folder = tmp_path / f"b{i}"
        folder.mkdir()
        (folder / "softmax.py").write_text(SOFTMAX)
        errs.append(open(logs / f"four_benches_{i}.timings.txt", "w+"))
        procs.append(subprocess.Popen([sys.executable, "-m", "kernel_lsp.cli", "bench", "softmax.py", "--json",
                                       "--timings", "--timeout", "600"], cwd=folder, env=env, stdout=subprocess.PIPE,
                                      stderr=errs[-1], text=True))
    t0 = time.monotonic()
    outs = []
    for p, e in zip(procs, errs):
        out, _ = p.communicate(timeout=1500)
        e.seek(0)
        outs.append((out, e.read()))
        e.close()
    for (out, err), p in zip(outs, procs):  # a bench that printed no JSON: show why
        assert out.strip().startswith("{"), f"exit {p.returncode}: {err[-3000:]}"
    docs = [json.loads(out) for out, _ in outs]
    targets = [d["targets"][0] for d in docs]
    print(f"\n4 benches in {time.monotonic() - t0:.0f} s:",
          [(t["verdict"], (t.get("evidence") or {}).get("gpu_wait_s"), t["message"][:80]) for t in targets])
    assert [t["verdict"] for t in targets] == ["correct"] * 4, [(t["verdict"], t["message"]) for t in targets]
    waited = [(t.get("evidence") or {}).get("gpu_wait_s") for t in targets]
    assert sum(1 for w in waited if w) >= 2, waited  # they overlapped, and took turns
