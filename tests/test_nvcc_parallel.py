"""nvcc's host and device front ends side by side (toolchain/nvcc_parallel.py), against real nvcc:
the same words and the same object as plain nvcc, plain nvcc wherever the steps are not the usual
ones, and a compile error in nvcc's own words."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from kernel_lsp.toolchain import nvcc_parallel
from tests.needs import NVCC, needs_nvcc

KERNEL = """
#include <cstdint>
template <int N> __device__ float scaled(float v) { return v * N; }
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) { float v = scaled<2>(x[i]); y[i] = v > 0.f ? v : 0.f; }
}
extern "C" void launch_relu(const float* x, float* y, int64_t n) { relu_kernel<<<(n + 255) / 256, 256>>>(x, y, n); }
"""


def compile_cmd(src: str, *flags: str, out: str = "k.o") -> list[str]:
    return [str(NVCC), "-c", "-O3", "-arch=sm_90", "-Xcompiler", "-fPIC", "-std=c++17", *flags, src, "-o", out]


def both(tmp_path: Path, monkeypatch, src: str, text: str, *flags: str) -> tuple[tuple[int, str], tuple[int, str]]:
    """(split, plain nvcc): exit code and words of each, their objects kept as par.o and ser.o."""
    (tmp_path / src).write_text(text)
    split = nvcc_parallel.run(compile_cmd(src, *flags, out="par.o"), tmp_path, 120)
    monkeypatch.setenv(nvcc_parallel.SERIAL_ENV, "1")
    plain = nvcc_parallel.run(compile_cmd(src, *flags, out="ser.o"), tmp_path, 120)
    monkeypatch.delenv(nvcc_parallel.SERIAL_ENV)
    return split, plain


def section(obj: Path, name: str) -> bytes:
    out = obj.with_suffix(f".{name.strip('.')}.bin")
    subprocess.run(["objcopy", "-O", "binary", f"--only-section={name}", str(obj), str(out)], check=True)
    return out.read_bytes()


def symbols(obj: Path) -> list[str]:
    text = subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in text.splitlines())


@needs_nvcc
def test_the_plan_is_nvccs_own_steps_in_two_chains(tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    plan = nvcc_parallel._plan(compile_cmd("k.cu"), tmp_path, tmp_path / "keep", 1e12)
    assert plan is not None
    tools = [[Path(a[0]).name for a in chain] for chain in (plan.host, plan.device, plan.last)]
    assert tools[0][1] == "cudafe++" and tools[1][1:] == ["cicc", "ptxas", "fatbinary"], tools
    assert len(tools[2]) == 1 and "-c" in plan.last[0]
    assert not any("--gen_module_id_file" in a for step in plan.host for a in step)
    cicc = plan.device[1]
    assert cicc[cicc.index("--module_id_file_name") + 1] == plan.module_id  # the file both chains read


@needs_nvcc
def test_same_words_and_same_object_as_plain_nvcc(tmp_path, monkeypatch):
    warn = KERNEL.replace("float v = ", "int unused_w = 3; float v = ")
    split, plain = both(tmp_path, monkeypatch, "w.cu", warn, "-Xptxas", "-v")
    assert split[0] == plain[0] == 0
    norm = [re.sub(r"Compile time = [0-9.]+ ms", "", words) for _, words in (split, plain)]
    assert norm[0] == norm[1]
    assert 'warning #177-D: variable "unused_w"' in norm[0] and "Used " in norm[0]  # cudafe++'s and ptxas's lines
    par, ser = tmp_path / "par.o", tmp_path / "ser.o"
    assert symbols(par) == symbols(ser)
    assert section(par, ".nv_fatbin") == section(ser, ".nv_fatbin")  # the same device code
    # its intermediate files are gone: the build folder holds the source, the objects and their sections
    assert {p.name for p in tmp_path.iterdir()} == {"w.cu", "par.o", "ser.o", "par.nv_fatbin.bin", "ser.nv_fatbin.bin"}


@needs_nvcc
def test_a_compile_error_reads_as_nvcc_words_it(tmp_path, monkeypatch):
    split, plain = both(tmp_path, monkeypatch, "bad.cu", KERNEL.replace("scaled<2>(x[i])", "undefined_thing"))
    assert split == plain
    assert split[0] != 0 and 'identifier "undefined_thing" is undefined' in split[1]
    assert not (tmp_path / "par.o").exists()


@needs_nvcc
def test_steps_it_does_not_split_run_as_plain_nvcc(tmp_path, monkeypatch):
    (tmp_path / "k.cu").write_text(KERNEL)
    log = tmp_path / "calls.txt"
    wrapper = tmp_path / "nvcc"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec {NVCC} "$@"\n')
    wrapper.chmod(0o755)
    rdc = [str(wrapper), *compile_cmd("k.cu", "-rdc=true")[1:]]
    assert not nvcc_parallel.is_object_compile(rdc)
    assert nvcc_parallel.run(rdc, tmp_path, 120)[0] == 0
    assert "--dryrun" not in log.read_text()
    monkeypatch.setenv(nvcc_parallel.SERIAL_ENV, "1")
    log.unlink()
    assert nvcc_parallel.run([str(wrapper), *compile_cmd("k.cu")[1:]], tmp_path, 120)[0] == 0
    assert "--dryrun" not in log.read_text() and len(log.read_text().splitlines()) == 1


@needs_nvcc
def test_two_archs_compile_in_one_device_chain(tmp_path, monkeypatch):
    gencode = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
    (tmp_path / "g.cu").write_text(KERNEL)

    def cmd(out: str) -> list[str]:
        return [c for c in compile_cmd("g.cu", *gencode, out=out) if c != "-arch=sm_90"]

    plan = nvcc_parallel._plan(cmd("k.o"), tmp_path, tmp_path / "keep", 1e12)
    assert plan is not None and [Path(a[0]).name for a in plan.device].count("cicc") == 2
    assert nvcc_parallel.run(cmd("par.o"), tmp_path, 120)[0] == 0
    monkeypatch.setenv(nvcc_parallel.SERIAL_ENV, "1")
    assert nvcc_parallel.run(cmd("ser.o"), tmp_path, 120)[0] == 0
    fatbin = section(tmp_path / "par.o", ".nv_fatbin")
    assert fatbin == section(tmp_path / "ser.o", ".nv_fatbin") and len(fatbin) > 0


def test_only_an_object_compile_of_one_cu_is_split():
    assert nvcc_parallel.is_object_compile(["nvcc", "-c", "-O3", "a.cu", "-o", "a.o"])
    assert not nvcc_parallel.is_object_compile(["nvcc", "-shared", "-O3", "a.cu", "-o", "a.so"])
    assert not nvcc_parallel.is_object_compile(["g++", "-c", "-O3", "a.cpp", "-o", "a.o"])
    assert not nvcc_parallel.is_object_compile(["nvcc", "-c", "-dc", "a.cu", "-o", "a.o"])


@pytest.mark.parametrize("name", ["k.cu", "my-kernel.v2.cu"])
def test_the_module_id_has_nvccs_shape(tmp_path, name):
    got = nvcc_parallel._module_id(name, tmp_path)
    assert re.fullmatch(r"_[0-9a-f]{8}_\d+_\w+_[0-9a-f]{8}", got), got
    assert got != nvcc_parallel._module_id(name, tmp_path)  # one per compile


def test_a_plan_of_another_shape_is_refused():
    host = ['#$ gcc -E -x c++ "k.cu" -o "/t/k.cpp4.ii"',
            '#$ cudafe++ --gen_module_id_file --module_id_file_name "/t/k.module_id" "/t/k.cpp4.ii"']
    device = ['#$ gcc -D__CUDA_ARCH__=900 -E -x c++ "k.cu" -o "/t/k.cpp1.ii"',
              '#$ "$CICC_PATH/cicc" --module_id_file_name "/t/k.module_id" "/t/k.cpp1.ii" -o "/t/k.ptx"',
              '#$ ptxas -arch=sm_90 "/t/k.ptx" -o "/t/k.cubin"', '#$ fatbinary --embedded-fatbin="/t/k.fatbin.c"']
    last = ['#$ gcc -c -x c++ "/t/k.cudafe1.cpp" -o "k.o"']
    plan = nvcc_parallel._read_plan("\n".join(["#$ CICC_PATH=/cuda/nvvm/bin", *host, *device, *last]))
    assert plan is not None and plan.device[1][0] == "/cuda/nvvm/bin/cicc" and plan.module_id == "/t/k.module_id"
    assert nvcc_parallel._read_plan("\n".join([*host, *device, '#$ nvlink -o "k.o"', *last])) is None
    assert nvcc_parallel._read_plan("\n".join([*device, *host, *last])) is None        # device first
    assert nvcc_parallel._read_plan("\n".join([host[0], host[1].replace("--gen_module_id_file ", ""),
                                               *device, *last])) is None              # no module id made
    assert nvcc_parallel._read_plan("\n".join([*host, *device])) is None               # no last compile
