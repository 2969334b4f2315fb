"""On the GPU: split candidates build the fast way, load, and compute what the full build computes;
a source that cannot be split takes the full build and says why (issue 9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = Path(__file__).parent / "inline_sources"

SPLIT_OK = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

template <typename scalar_t>
__global__ void row_softmax_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int cols) {
    extern __shared__ unsigned char smem_raw[];
    scalar_t* smem = reinterpret_cast<scalar_t*>(smem_raw);
    const scalar_t* row = x + (size_t)blockIdx.x * cols;
    scalar_t m = -1e30;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = max(m, row[c]);
    smem[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] = max(smem[threadIdx.x], smem[threadIdx.x + s]);
        __syncthreads();
    }
    m = smem[0];
    __syncthreads();
    scalar_t sum = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += exp(row[c] - m);
    smem[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] += smem[threadIdx.x + s];
        __syncthreads();
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[(size_t)blockIdx.x * cols + c] = exp(row[c] - m) / smem[0];
}

__global__ void add_bias_kernel(float* y, const float* b, int rows, int cols) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) y[i] += b[i % cols];
}

torch::Tensor softmax_bias(torch::Tensor x, torch::Tensor b) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2, "x: a 2-D CUDA tensor");
    auto y = torch::empty_like(x);
    const int rows = x.size(0), cols = x.size(1), threads = 256;
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "softmax_bias", ([&] {
        row_softmax_kernel<scalar_t><<<rows, threads, threads * sizeof(scalar_t), stream>>>(
            x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), cols);
    }));
    if (x.scalar_type() == torch::kFloat) {
        add_bias_kernel<<<(rows * cols + 255) / 256, 256, 0, stream>>>(y.data_ptr<float>(), b.data_ptr<float>(), rows, cols);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

ext = load_inline(name="klsp_gpu_softmax_bias", cpp_sources="torch::Tensor softmax_bias(torch::Tensor x, torch::Tensor b);",
                  cuda_sources=cuda_src, functions=["softmax_bias"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x, b):
        return ext.softmax_bias(x, b)
'''

FALLBACK = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""CUDA"""
ext = load_inline(name="klsp_gpu_poly", cpp_sources="torch::Tensor poly(torch::Tensor x, torch::Tensor c);",
                  cuda_sources=cuda_src, functions=["poly"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x, c):
        return ext.poly(x, c)
'''.replace("CUDA", (SOURCES / "constant_from_host.cu").read_text())

CHILD = textwrap.dedent('''
    import json, sys, torch
    from kernel_lsp.engine.worker.build import build
    path, out = sys.argv[1], sys.argv[2]
    module, result = build.load_python(open(path).read(), path)
    assert module is not None, result.log[-3000:]
    torch.manual_seed(0)
    x = torch.randn(64, 1000, device="cuda")
    b = torch.randn(1000, device="cuda")
    c = torch.tensor([0.5, -1.0, 0.25, 0.0], device="cuda")
    model = module.ModelNew()
    y = model(x, b) if "softmax" in open(path).read() else model(x, c)
    y64 = model(x.double(), b.double()) if "softmax" in open(path).read() else None
    torch.save({"y": y.cpu(), "y64": None if y64 is None else y64.cpu()}, out + ".pt")
    json.dump({"fast_path": result.fast_path, "fallback_reason": result.fallback_reason,
               "seconds": result.seconds}, open(out + ".json", "w"))
''')


def _build_and_run(tmp: Path, name: str, source: str, fast: bool, child: str = CHILD, suffix: str = ".py") -> dict:
    src = tmp / f"{name}{suffix}"
    src.write_text(source)
    env = dict(os.environ, KERNEL_LSP_CACHE=str(tmp / f"cache-{name}"), KERNEL_LSP_FAST_INLINE="1" if fast else "0",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("KERNEL_LSP_PCH_CACHE", str(tmp / "pch"))
    proc = subprocess.run([sys.executable, "-c", child, str(src), str(tmp / name)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp / f"{name}.json").read_text())


@pytest.mark.gpu
@pytest.mark.slow
def test_fast_build_matches_the_full_build_and_a_fallback_says_why(tmp_path):
    import torch

    jobs = [("fast", SPLIT_OK, True), ("full", SPLIT_OK, False), ("fallback", FALLBACK, True)]
    with ThreadPoolExecutor(3) as pool:  # the three builds at once: about one full build's time
        fast, full, fallback = pool.map(lambda j: _build_and_run(tmp_path, *j), jobs)
    assert fast["fast_path"] is True and fast["fallback_reason"] == ""
    assert full["fast_path"] is False and full["fallback_reason"] == "fast_inline is off"
    assert fallback["fast_path"] is False
    assert fallback["fallback_reason"] == "host code uses __constant__ coeffs (line 13)"
    f, g = torch.load(tmp_path / "fast.pt"), torch.load(tmp_path / "full.pt")
    assert torch.equal(f["y"], g["y"]) and torch.equal(f["y64"], g["y64"])  # same kernels, same bits
    torch.manual_seed(0)
    x = torch.randn(64, 1000, device="cuda")
    b = torch.randn(1000, device="cuda")
    torch.testing.assert_close(f["y"], (torch.softmax(x, 1) + b).cpu(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(f["y64"], torch.softmax(x.double(), 1).cpu(), rtol=1e-9, atol=1e-9)
    p = torch.load(tmp_path / "fallback.pt")["y"]
    torch.testing.assert_close(p, (0.5 + x * (-1.0 + x * 0.25)).cpu(), rtol=1e-5, atol=1e-5)
    assert fast["seconds"] < full["seconds"]


# -- load(): a .cu and a .cpp (with a header beside it) as source files ----------------------------------

LOAD_CANDIDATE = '''
import os
import torch.nn as nn
from torch.utils.cpp_extension import load

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ext")
ext = load(name="klsp_gpu_scale_add", sources=[os.path.join(HERE, "scale_kernel.cu"), os.path.join(HERE, "bindings.cpp")],
           extra_cflags=["-O2", "-DKLSP_CPP_FLAG=7"],
           extra_cuda_cflags=["-O3", "-DKLSP_BIAS=0.5f", "-Xcompiler", "-DKLSP_HOST_ONLY=1"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.scale_add(x, 1.5)
'''

SCALE_ADD_CHILD = textwrap.dedent('''
    import json, sys, torch
    from kernel_lsp.engine.worker.build import build
    path, out = sys.argv[1], sys.argv[2]
    source = open(path).read()
    facts = {}
    if path.endswith(".cu"):  # the engine's build of a saved .cu
        lib, result = build.load_cuda(source, path)
        assert lib is not None, result.log[-3000:]
        run = lambda x: lib.scale_add(x, 1.5)
    else:  # a candidate whose ModelNew calls load()
        module, result = build.load_python(source, path)
        assert module is not None, result.log[-3000:]
        run = module.ModelNew()
        facts = {"cpp_flag": module.ext.cpp_flag(), "ops_version": module.ext.ops_version}
    torch.manual_seed(0)
    x = torch.randn(1 << 20, device="cuda")
    torch.save({"y": run(x).cpu(), "y64": run(x.double()).cpu()}, out + ".pt")
    json.dump({"fast_path": result.fast_path, "fallback_reason": result.fallback_reason, "seconds": result.seconds,
               **facts}, open(out + ".json", "w"))
''')


@pytest.mark.gpu
@pytest.mark.slow
def test_load_of_source_files_built_fast_matches_the_full_build(tmp_path):
    import shutil

    import torch

    shutil.copytree(Path(__file__).parent / "load_sources" / "ext", tmp_path / "ext")
    jobs = [("load_fast", LOAD_CANDIDATE, True, SCALE_ADD_CHILD), ("load_full", LOAD_CANDIDATE, False, SCALE_ADD_CHILD)]
    with ThreadPoolExecutor(2) as pool:
        fast, full = pool.map(lambda j: _build_and_run(tmp_path, *j), jobs)
    assert fast["fast_path"] is True and fast["fallback_reason"] == "", fast
    assert full["fast_path"] is False and full["fallback_reason"] == "fast_inline is off"
    for r in (fast, full):  # extra_cflags reached the .cpp; its header was found beside it
        assert r["cpp_flag"] == 7 and r["ops_version"] == 3
    f, g = torch.load(tmp_path / "load_fast.pt"), torch.load(tmp_path / "load_full.pt")
    assert torch.equal(f["y"], g["y"]) and torch.equal(f["y64"], g["y64"])  # same kernels, same bits
    torch.manual_seed(0)
    x = torch.randn(1 << 20, device="cuda")
    torch.testing.assert_close(f["y"], (x * 1.5 + 0.5).cpu())
    torch.testing.assert_close(f["y64"], (x.double() * 1.5 + 0.5).cpu())
    assert fast["seconds"] < full["seconds"]


# -- a .cu of the user's own with PYBIND11_MODULE (the engine's build of a saved .cu) ---------------------

USER_CU = (Path(__file__).parent / "load_sources" / "one_file_ext.cu").read_text()


@pytest.mark.gpu
@pytest.mark.slow
def test_a_users_torch_extension_cu_built_fast_matches_the_full_build(tmp_path):
    import torch

    jobs = [("cu_fast", USER_CU, True, SCALE_ADD_CHILD, ".cu"), ("cu_full", USER_CU, False, SCALE_ADD_CHILD, ".cu")]
    with ThreadPoolExecutor(2) as pool:
        fast, full = pool.map(lambda j: _build_and_run(tmp_path, *j), jobs)
    assert fast["fast_path"] is True and fast["fallback_reason"] == "", fast
    assert full["fast_path"] is False and full["fallback_reason"] == "fast_inline is off"
    f, g = torch.load(tmp_path / "cu_fast.pt"), torch.load(tmp_path / "cu_full.pt")
    assert torch.equal(f["y"], g["y"]) and torch.equal(f["y64"], g["y64"])
    torch.manual_seed(0)
    x = torch.randn(1 << 20, device="cuda")
    torch.testing.assert_close(f["y"], (x * 1.5 + 0.5).cpu())
    assert fast["seconds"] < full["seconds"]


EDITS = textwrap.dedent('''
    import json, sys, time, torch
    from pathlib import Path
    from kernel_lsp.engine.worker.build import build, unit_cache
    base = Path(sys.argv[1]).read_text()
    sources = {"start": base,
               "body_edit": base.replace("y[i] = v > 0.0f ? v : 0.0f;", "y[i] = fmaxf(v, 0.0f);"),
               "host_edit": base.replace("const int threads = 256;", "const int threads = 512;")}
    x = torch.randn(1 << 20, device="cuda")
    out = {}
    for name, src in sources.items():
        assert src != base or name == "start", name
        t0 = time.perf_counter()
        module, result = build.load_python(src, f"/tmp/relu_{name}.py")
        secs = time.perf_counter() - t0
        assert module is not None, result.log[-3000:]
        y = module.ModelNew()(x)
        torch.cuda.synchronize()
        out[name] = {"seconds": secs, "fast_path": result.fast_path, "fallback_reason": result.fallback_reason,
                     "steps": result.steps,
                     "ok": bool(torch.equal(y, torch.relu(x))), "ext": module.relu_ext.__name__,
                     # objects by their text's key (not the copies kept by preprocessed tokens)
                     "objects": sum(json.loads((o.parent / "meta.json").read_text()).get("by") != "tokens"
                                    for o in unit_cache.units_root().glob("*/unit.o"))}
    print(json.dumps(out))
''')


@pytest.mark.gpu
@pytest.mark.slow
def test_a_kernel_body_edit_rebuilds_one_unit_and_runs(tmp_path):
    """Issue 21: after the first build, a body edit compiles the device unit and links (the host
    unit and main.cpp reused, main.cpp's module renamed), a host edit the host unit; all three
    load under their own extension names and compute ReLU. Prints the build times."""
    env = dict(os.environ, KERNEL_LSP_CACHE=str(tmp_path / "cache"), KERNEL_LSP_FAST_INLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("KERNEL_LSP_PCH_CACHE", str(tmp_path / "pch"))
    proc = subprocess.run([sys.executable, "-c", EDITS, str(ROOT / "benchmarks/tasks/relu_new.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print("build seconds:", {k: round(v["seconds"], 2) for k, v in out.items()},
          "link:", {k: round(v["steps"].get("link", -1), 3) for k, v in out.items()})
    for name, r in out.items():
        assert r["fast_path"] and r["fallback_reason"] == "" and r["ok"], (name, r)
        # linked against libtorch_python alone (fastbuild.lean_ldflags), and loaded so: no relink
        assert "link" in r["steps"] and "relink" not in r["steps"], (name, r["steps"])
    assert len({r["ext"] for r in out.values()}) == 3
    assert [r["objects"] for r in out.values()] == [3, 4, 5]  # one new object per edit
    assert out["body_edit"]["seconds"] < out["start"]["seconds"]
