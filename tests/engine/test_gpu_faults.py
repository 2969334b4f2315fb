"""On the GPU: faults end the Worker, become the right verdicts, and the next evaluation
in the same Engine succeeds. Run on the device: pytest -m gpu tests/engine/test_gpu_faults.py -s

Plain (sync) tests around asyncio.run: the device machine has pytest but not pytest-asyncio."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from kernel_lsp.engine import Engine
from kernel_lsp.engine.worker.build import build
from kernel_lsp.model import Candidate, Task

pytestmark = pytest.mark.gpu

TOY = Task(name="gpu_toy", reference_path="gpu_toy.py", reference_source="# reference\n")
FAKE = {"KERNEL_LSP_RUN_MODULE": "tests.engine.fake_run"}

# Kernels reached from a candidate's run() through the real builder (the fast .cu path).
KERNELS = r"""
#include <cuda_runtime.h>
__global__ void poke(float* p) { p[threadIdx.x] = 1.0f; }
__global__ void spin(volatile int* flag) { while (*flag == 0) { } }
extern "C" int launch_poke(unsigned long long addr) { poke<<<1, 32>>>((float*)addr); return (int)cudaGetLastError(); }
extern "C" int launch_spin(int* flag) { spin<<<1, 1>>>(flag); return (int)cudaGetLastError(); }
"""


def cand(body: str) -> Candidate:
    head = (
        "import ctypes, torch\nfrom kernel_lsp.engine.worker.build import build\n"
        f"SRC = {KERNELS!r}\n"
        "lib, res = build.load_cuda(SRC, '/tmp/kernel_lsp_faults.cu', {})\n"
        "assert lib is not None, res.log\n"
    )
    return Candidate(source=head + body, kind="python")


GOOD = cand("def run():\n    x = torch.ones(1024, device='cuda')\n    return float((x * 2).sum())\n")
ILLEGAL = cand("def run():\n    lib.launch_poke(ctypes.c_ulonglong(0xdead0000000))\n    torch.cuda.synchronize()\n")
SPIN = cand("def run():\n    flag = torch.zeros(1, dtype=torch.int32, device='cuda')\n"
            "    lib.launch_spin(ctypes.c_void_p(flag.data_ptr()))\n    torch.cuda.synchronize()\n")
OOM = cand("def run():\n    return torch.empty(10 * 2**40, dtype=torch.uint8, device='cuda').numel()\n")


def with_engine(fn):
    """Run `async def test(engine)` in a fresh event loop with its own Engine."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        async def main():
            e = Engine(timeout=60.0, env=FAKE)
            try:
                await fn(e, *args, **kwargs)
            finally:
                await e.aclose()

        asyncio.run(main())

    wrapper.__signature__ = __import__("inspect").Signature()  # pytest must not see `engine`
    return wrapper


@with_engine
async def test_illegal_memory_access_then_next_succeeds(engine):
    assert (await engine.evaluate(TOY, GOOD)).verdict == "correct"
    pid = engine.worker_pid
    ev = await engine.evaluate(TOY, ILLEGAL)
    print("illegal access:", ev.verdict, ev.message[:300])
    assert ev.verdict == "crashed" and "illegal memory access" in ev.message
    ok = await engine.evaluate(TOY, GOOD)
    assert ok.verdict == "correct" and engine.worker_pid != pid


@with_engine
async def test_infinite_loop_kernel_times_out_then_next_succeeds(engine):
    assert (await engine.evaluate(TOY, GOOD)).verdict == "correct"  # warm: build + CUDA init done
    t0 = time.monotonic()
    ev = await engine.evaluate(TOY, SPIN, timeout=5.0)
    elapsed = time.monotonic() - t0
    print(f"spin kernel: {ev.verdict} after {elapsed:.2f} s")
    assert ev.verdict == "timeout" and elapsed < 7.0
    ok = await engine.evaluate(TOY, GOOD)
    assert ok.verdict == "correct", ok.message


@with_engine
async def test_cuda_oom_then_next_succeeds(engine):
    ev = await engine.evaluate(TOY, OOM)
    print("oom:", ev.verdict, ev.message[:200])
    assert ev.verdict == "oom"
    assert (await engine.evaluate(TOY, GOOD)).verdict == "correct"


REF = """import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(4096, 4096)]
def get_init_inputs():
    return []
"""


def test_real_run_faults_then_correct(tmp_path):
    """Through CHECK's kernel_lsp.engine.worker.run: OOM and a hang in ModelNew, then a correct one."""
    asyncio.run(_real_run_faults_then_correct(tmp_path))


async def _real_run_faults_then_correct(tmp_path):
    task = Task(name="relu", reference_path=str(tmp_path / "relu.py"), reference_source=REF)
    good = Candidate(source=REF + "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                     "        return x.clamp_min(0)\n", kind="python")
    oom = Candidate(source=REF + "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                    "        torch.empty(10 * 2**40, dtype=torch.uint8, device=x.device)\n"
                    "        return x.clamp_min(0)\n", kind="python")
    hang = Candidate(source=REF + "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                     "        while True:\n            pass\n", kind="python")
    async with Engine(timeout=120.0) as e:
        first = await e.evaluate(task, good)
        print("relu good:", first.verdict, first.message, first.summary())
        assert first.verdict == "correct", first.message
        ev = await e.evaluate(task, oom)
        print("relu oom:", ev.verdict, ev.message[:200])
        assert ev.verdict == "oom"
        assert (await e.evaluate(task, good)).verdict == "correct"
        ev = await e.evaluate(task, hang, timeout=20.0)
        assert ev.verdict == "timeout"
        assert (await e.evaluate(task, good)).verdict == "correct"


@pytest.mark.slow
def test_warm_vs_cold_build_times(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    src = KERNELS.replace("1.0f", "4.0f")
    t0 = time.perf_counter()
    _, cold = build.load_cuda(src, str(tmp_path / "k.cu"), {})
    t1 = time.perf_counter()
    _, warm = build.load_cuda(src, str(tmp_path / "k.cu"), {})
    t2 = time.perf_counter()
    assert cold.ok and not cold.cached and warm.cached, cold.log
    print(f"\n.cu nvcc -shared: cold {t1 - t0:.2f} s, warm {t2 - t1:.4f} s")
    inline = (
        "import torch\nfrom torch.utils.cpp_extension import load_inline\n"
        "cuda = '''\n#include <torch/extension.h>\n__global__ void k(float* x, int n) {"
        " int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2; }\n"
        "torch::Tensor twice(torch::Tensor x) { auto y = x.clone(); int n = y.numel();"
        " k<<<(n + 255) / 256, 256>>>(y.data_ptr<float>(), n); return y; }\n'''\n"
        "cpp = 'torch::Tensor twice(torch::Tensor x);'\n"
        "ext = load_inline(name='twice_cuda', cpp_sources=[cpp], cuda_sources=[cuda], functions=['twice'])\n"
    )
    t0 = time.perf_counter()
    m, cold = build.load_python(inline, str(tmp_path / "inline.py"))
    t1 = time.perf_counter()
    m2, warm = build.load_python(inline, str(tmp_path / "inline.py"))
    t2 = time.perf_counter()
    assert cold.ok and warm.ok and warm.cached, cold.log[-3000:]
    import torch

    assert torch.equal(m2.ext.twice(torch.ones(8, device="cuda")).cpu(), torch.full((8,), 2.0))
    print(f"load_inline CUDA: cold {t1 - t0:.2f} s, warm {t2 - t1:.4f} s")
    assert t2 - t1 < 0.1
