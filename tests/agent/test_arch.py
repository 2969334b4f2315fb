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
