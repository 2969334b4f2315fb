"""Builds for what the GPU has: an H200 (9.0) is built for sm_90a, where Hopper's own
instructions compile; the real nvcc proves it (CPU only: a cubin, nothing runs)."""

import subprocess

import pytest

from kernel_lsp.engine.worker.build import build
from kernel_lsp.toolchain.nvcc import device_arch, find_nvcc

NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")

# wgmma.fence and setmaxnreg exist only on sm_90a: the base sm_90 target rejects them.
HOPPER = r'''
__global__ void k(float* out) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    out[threadIdx.x] = 1.0f;
}
'''


@needs_nvcc
def test_hopper_gets_its_arch_specific_target_and_ampere_does_not():
    assert device_arch(9, 0, NVCC) == "sm_90a"
    assert device_arch(8, 0, NVCC) == "sm_80" and device_arch(8, 9, NVCC) == "sm_89"
    assert device_arch(10, 0, NVCC) == "sm_100a"  # nvcc 12.8 and later
    assert build.device_arch(9, 0) == "sm_90a"
    assert build._torch_arch_list("sm_90a") == "9.0a"  # torch's load_inline accepts 9.0a


def test_without_nvcc_the_base_target(tmp_path):
    assert device_arch(9, 0, str(tmp_path / "no-nvcc")) == "sm_90"


@needs_nvcc
def test_wgmma_and_setmaxnreg_compile_for_sm_90a_only(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(HOPPER)

    def cubin(arch):
        return subprocess.run([NVCC, "-cubin", f"-arch={arch}", "-o", str(tmp_path / f"{arch}.cubin"), str(src)],
                              capture_output=True, text=True, timeout=120)

    ok = cubin(device_arch(9, 0, NVCC))
    assert ok.returncode == 0, ok.stderr
    base = cubin("sm_90")
    assert base.returncode != 0 and "not supported on .target 'sm_90'" in base.stderr  # why sm_90a matters


@needs_nvcc
def test_a_build_made_ahead_is_keyed_by_the_workers_own_arch(tmp_path, monkeypatch):
    """The CPU pool builds ahead under the arch the caller names (nvidia-smi's compute_cap, or the
    Worker's device_info capability); the GPU Worker loads under build.device_arch. They must be
    one target: under sm_90 against the Worker's sm_90a the Worker built the device code again,
    about 1 s of every kernel-body edit on the H100 (benchmarks/results/gpu_runs/2026-12-06d)."""
    from types import SimpleNamespace

    from kernel_lsp import config
    from kernel_lsp.engine.caller.client import Engine
    from kernel_lsp.engine.caller.ray_executor import RayExecutor

    worker = build.device_arch(9, 0)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 9.0\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{__import__('os').environ['PATH']}")
    monkeypatch.setattr(config, "_ARCH", [])
    assert config.detect_arch() == worker == "sm_90a"
    engine = Engine(timeout=60, sandbox="off")
    engine._device_info = {"capability": [9, 0], "name": "NVIDIA H200"}
    assert engine._arch() == worker
    assert RayExecutor._arch(SimpleNamespace(_device={"capability": [9, 0]}), {}) == worker
    assert RayExecutor._arch(SimpleNamespace(_device={}), {"arch": "sm_80"}) == "sm_80"  # a configured one stays


def test_a_capability_that_does_not_read_names_no_arch():
    from kernel_lsp.toolchain.nvcc import capability_arch

    assert [capability_arch(c) for c in ("", "9", "x.y", None, [9], (9, 0, 1), ["a", "b"])] == [None] * 7
    assert capability_arch("8.0") == capability_arch((8, 0)) == "sm_80"
