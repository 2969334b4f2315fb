"""kernel_lsp.toolchain against the real nvcc: placed diagnostics, ptxas resources,
spills, occupancy, the compile cache, cancellation and toolchain problems."""

from __future__ import annotations

import asyncio
import ctypes
import os
import stat
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from kernel_lsp.model import CompileResult
from kernel_lsp.toolchain import (
    CompileOptions,
    build_library,
    clear_cache,
    compile_check,
    find_nvcc,
    nvcc_command,
    nvcc_version,
    occupancy,
    parse_resources,
)
from kernel_lsp.toolchain import nvcc as nvcc_mod
from kernel_lsp.toolchain.demangle import function_name, itanium_name
from kernel_lsp.toolchain.diagnostics import Placement, launch_bounds, parse_messages

NVCC = find_nvcc(None)
from tests.processes import no_process_started  # noqa: E402
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)


def opts(**kw) -> CompileOptions:
    return CompileOptions(nvcc=NVCC, **kw)


def errors(result: CompileResult):
    return [d for d in result.diagnostics if d.severity == "error"]


# ------------------------------------------------------------------ diagnostics


@needs_nvcc
async def test_undefined_identifier_at_exact_line_and_column(tmp_path):
    src = textwrap.dedent("""\
        #include <cuda_runtime.h>

        __global__ void scale(float* x, int n) {
          int i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < n) x[i] = x[i] * factor;
        }
        """)
    path = str(tmp_path / "scale.cu")
    result = await compile_check(src, path=path, options=opts())
    assert not result.ok
    [err] = errors(result)
    assert "factor" in err.message and "undefined" in err.message
    col = src.splitlines()[4].index("factor")
    assert (err.span.start_line, err.span.start_col) == (4, col)
    assert err.span.end_col == col + len("factor")
    assert result.resources == []


@needs_nvcc
async def test_caret_column_survives_macro_expansion_in_echo(tmp_path):
    # cudafe echoes `__global__` as `__attribute__((global))`; the column must still be ours.
    src = "__global__ void k(float* x) { x[0] = 1.0f; int unused_here; }\n"
    result = await compile_check(src, path=str(tmp_path / "k.cu"), options=opts())
    assert result.ok
    [warn] = [d for d in result.diagnostics if d.severity == "warning"]
    assert warn.code == "177-D" and "unused_here" in warn.message
    assert warn.span.start_line == 0
    assert warn.span.start_col == src.index("unused_here")


@needs_nvcc
async def test_template_error_keeps_instantiation_note(tmp_path):
    src = textwrap.dedent("""\
        template <typename T>
        __device__ T twice(T a) { return a.value * 2; }
        __global__ void k(float* x) { x[0] = twice(x[0]); }
        """)
    result = await compile_check(src, path=str(tmp_path / "t.cu"), options=opts())
    [err] = errors(result)
    assert err.span.start_line == 1
    assert err.span.start_col == src.splitlines()[1].index("a.value")
    assert "detected during instantiation" in err.message and "at line 3" in err.message


@needs_nvcc
async def test_host_compiler_error_with_column(tmp_path):
    src = '#include "not_there.cuh"\n__global__ void k() {}\n'
    result = await compile_check(src, path=str(tmp_path / "inc.cu"), options=opts())
    [err] = errors(result)
    assert "not_there.cuh" in err.message
    assert (err.span.start_line, err.span.start_col, err.span.end_col) == (0, 9, len(src.splitlines()[0]))


@needs_nvcc
async def test_error_in_a_header_lands_on_the_include_line(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "helper.cuh").write_text("__device__ int helper(int a) {\n  return a + ;\n}\n")
    src = '#include <cuda_runtime.h>\n#include "inc/helper.cuh"\n__global__ void k(int* x) { x[0] = helper(1); }\n'
    result = await compile_check(src, path=str(tmp_path / "main.cu"), options=opts())
    [err] = errors(result)
    assert err.span.start_line == 1
    assert "inc/helper.cuh:2" in err.message and "expected an expression" in err.message


@needs_nvcc
async def test_relative_include_compiles_from_document_directory(tmp_path):
    (tmp_path / "common.cuh").write_text("#define SCALE 3.0f\n")
    src = '#include "common.cuh"\n__global__ void k(float* x) { x[0] *= SCALE; }\n'
    result = await compile_check(src, path=str(tmp_path / "uses.cu"), options=opts())
    assert result.ok, result.log
    assert [r.kernel for r in result.resources] == ["k"]


@needs_nvcc
async def test_line_map_moves_embedded_source_into_the_document(tmp_path):
    src = "\n__global__ void k(float* x) {\n  x[0] = oops;\n}\n"
    result = await compile_check(src, path=str(tmp_path / "task.py"), options=opts(),
                                 line_map=lambda line, col: (line + 10, col + 4))
    [err] = errors(result)
    assert (err.span.start_line, err.span.start_col) == (12, 2 + 7 + 4)
    assert err.path == str(tmp_path / "task.py")
    assert "task.py.cu" not in err.message


def test_parser_handles_ptxas_linker_and_continuation_lines():
    log = textwrap.dedent("""\
        x.cu(4): error: no instance of overloaded function "f" matches the argument list
                    argument types are: (int)
            f(1);
            ^

        nvlink error   : Undefined reference to '_Z3gooi' in 'x.o'
        /usr/bin/ld: x.o: in function `main':
        x.cu:(.text+0x1d): undefined reference to `goo(int)'
        /usr/bin/ld: cannot find -lmissing: No such file or directory
        collect2: error: ld returned 1 exit status
        """)
    msgs = parse_messages(log)
    assert msgs[0].file == "x.cu" and msgs[0].line == 4 and msgs[0].caret == 4
    assert msgs[0].notes == ["argument types are: (int)"]
    assert msgs[1].tool == "nvlink" and msgs[1].function == "_Z3gooi"
    assert msgs[-1].tool == "ld" and "cannot find -lmissing" in msgs[-1].message
    assert "undefined reference to `goo(int)'" in msgs[-1].message and "in function" not in msgs[-1].message
    placed = Placement(source="int a;\nint b;\nint c;\n  f(1);\n", source_file="x.cu", temp_dir="/tmp/none",
                       user_dir=None, display_name="x.cu").place(msgs)
    assert (placed[0].span.start_line, placed[0].span.start_col) == (3, 2)
    assert all(d.severity == "error" for d in placed)
    assert [d.span.start_line for d in placed] == [3, 0, 0]
    assert placed[1].message.startswith("nvlink: Undefined reference to '_Z3gooi'")  # no demangler given


# ------------------------------------------------------------------ ptxas resources

RESOURCE_SRC = textwrap.dedent("""\
    #define THREADS 128
    template <int N>
    __global__ void __launch_bounds__(THREADS) tiled(float* x) {
      __shared__ float tile[N];
      tile[threadIdx.x] = x[threadIdx.x];
      __syncthreads();
      x[threadIdx.x] = tile[(threadIdx.x + 1) % N];
    }
    template __global__ void tiled<256>(float*);

    namespace ops {
    __global__ void plain(float* x) { x[threadIdx.x] += 1.0f; }
    }
    """)


@needs_nvcc
async def test_ptxas_resources_from_a_real_compile(tmp_path):
    result = await compile_check(RESOURCE_SRC, path=str(tmp_path / "r.cu"), options=opts(arch="sm_80"))
    assert result.ok, result.log
    by_name = {r.kernel: r for r in result.resources}
    assert set(by_name) == {"tiled", "plain"}
    tiled = by_name["tiled"]
    assert tiled.mangled.startswith("_Z") and "Li256E" in tiled.mangled
    assert tiled.arch == "sm_80"
    assert tiled.shared_bytes == 256 * 4
    assert 0 < tiled.registers <= 255
    assert tiled.threads_per_block == 128
    assert tiled.occupancy is not None and 0 < tiled.occupancy <= 1
    plain = by_name["plain"]
    assert plain.shared_bytes == 0 and plain.threads_per_block is None
    assert plain.spill_stores == 0 and plain.stack_bytes == 0
    assert "-Xptxas" in result.command and "-cubin" in result.command


SPILL_SRC = textwrap.dedent("""\
    __global__ void __launch_bounds__(1024, 2) spill(const float* __restrict__ x, float* y, int n) {
      float acc[64];
    #pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = x[threadIdx.x + i * n];
    #pragma unroll
      for (int k = 0; k < 8; ++k)
    #pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = acc[i] * acc[(i + k + 1) % 64] + x[i];
      float s = 0.f;
    #pragma unroll
      for (int i = 0; i < 64; ++i) s += acc[i] * (i + 1);
      y[threadIdx.x] = s;
    }
    """)


@needs_nvcc
async def test_spills_detected(tmp_path):
    result = await compile_check(SPILL_SRC, path=str(tmp_path / "spill.cu"), options=opts())
    assert result.ok, result.log
    [res] = result.resources
    assert res.kernel == "spill"
    assert res.spill_stores > 0 and res.spill_loads > 0
    assert res.registers <= 32  # 65536 / (1024 * 2)
    assert res.threads_per_block == 1024


@needs_nvcc
async def test_too_much_static_shared_memory_is_an_error_on_the_kernel(tmp_path):
    src = "// big\n__global__ void hog(float* x) {\n  __shared__ float s[20000];\n  s[threadIdx.x] = x[0];\n" \
          "  __syncthreads();\n  x[threadIdx.x] = s[threadIdx.x + 1];\n}\n"
    result = await compile_check(src, path=str(tmp_path / "hog.cu"), options=opts())
    assert not result.ok
    [err] = errors(result)
    assert "too much shared data" in err.message and "hog" in err.message and "_Z" not in err.message
    assert (err.span.start_line, err.span.start_col) == (1, src.splitlines()[1].index("hog"))


def test_parse_resources_canned_log_with_cmem():
    log = textwrap.dedent("""\
        ptxas info    : Compiling entry function '_Z1kPf' for 'sm_75'
        ptxas info    : Function properties for helper
            8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
        ptxas info    : Function properties for _Z1kPf
            16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 40 registers, 2048 bytes smem, 356 bytes cmem[0], 8 bytes cmem[2]
        """)
    [r] = parse_resources(log)
    assert (r.registers, r.shared_bytes, r.constant_bytes) == (40, 2048, 364)
    assert (r.stack_bytes, r.spill_stores, r.spill_loads) == (16, 8, 12)


def test_demangling_fallbacks():
    assert itanium_name("_Z3fooILi64EEvPfi") == "foo"
    assert itanium_name("_ZN2ns3barEPf") == "ns::bar"
    assert itanium_name("plain_c_name") is None
    assert function_name("void ns::foo<64, float>(float*, int)") == "foo"
    assert function_name("softmax_kernel") == "softmax_kernel"


def test_launch_bounds_resolves_constants():
    src = "#define TILE 16  // tunable\n__global__ void __launch_bounds__(TILE * TILE) mm(float* a) {}\n" \
          "constexpr int B = 2 * 64;\n__global__ void __launch_bounds__(B, 4) k2() {}\n"
    assert launch_bounds(src, "mm") == 256
    assert launch_bounds(src, "k2") == 128
    assert launch_bounds(src, "missing") is None


# ------------------------------------------------------------------ occupancy


@pytest.mark.parametrize("arch,threads,regs,smem,expected,limiter", [
    ("sm_90", 256, 32, 0, 1.0, "threads"),
    ("sm_90", 256, 128, 0, 0.25, "registers"),
    ("sm_90", 128, 16, 48 * 1024, 0.25, "shared memory"),   # 4 blocks of 49 KB (1 KB reserved)
    ("sm_90", 32, 16, 0, 0.5, "blocks"),                     # 32 blocks x 1 warp of 64
    ("sm_90", 1024, 64, 0, 0.5, "registers"),
    ("sm_90", 1024, 65, 0, 0.0, "registers"),                # cannot launch at all
    ("sm_80", 256, 64, 0, 0.5, "registers"),
    ("sm_86", 256, 32, 0, 1.0, "threads"),                   # 48 warps: 6 blocks of 8
    ("sm_86", 128, 16, 32 * 1024, 0.25, "shared memory"),   # 100 KB / 33 KB = 3 blocks
    ("sm_75", 256, 32, 0, 1.0, "threads"),                   # 32 warps max
    ("sm_75", 64, 32, 0, 1.0, "threads"),
    ("sm_89", 64, 32, 0, 1.0, "threads"),                    # 24 blocks x 2 warps = 48 (tie: hardware)
    ("sm_70", 256, 40, 0, 0.75, "registers"),
    ("sm_100", 512, 32, 0, 1.0, "threads"),
    ("sm_120", 256, 96, 0, 16 / 48, "registers"),           # 5 warps per partition -> 2 blocks
    ("sm_90", 2048, 16, 0, 0.0, "threads"),
])
def test_occupancy_known_values(arch, threads, regs, smem, expected, limiter):
    occ, why = occupancy(arch, threads, regs, smem)
    assert occ == pytest.approx(expected)
    assert why == limiter


def test_occupancy_defaults_and_bad_input():
    assert occupancy("sm_90", None, 32, 0) == occupancy("sm_90", 256, 32, 0)
    assert occupancy("sm_90", 128, 16, 0, dynamic_shared=100 * 1024)[1] == "shared memory"
    with pytest.raises(ValueError, match="architecture"):
        occupancy("gfx90a", 256, 32, 0)
    with pytest.raises(ValueError, match="no occupancy data"):
        occupancy("sm_35", 256, 32, 0)
    with pytest.raises(ValueError):
        occupancy("sm_90", 0, 32, 0)


# ------------------------------------------------------------------ cache


@needs_nvcc
async def test_unchanged_source_answers_from_cache(tmp_path):
    clear_cache()
    src = f"__global__ void cached_{uuid.uuid4().hex[:8]}(float* x) {{ x[0] = 1; }}\n"
    path = str(tmp_path / "c.cu")
    first = await compile_check(src, path=path, options=opts())
    assert first.ok and not first.cached
    with no_process_started():  # answered from the cache: nvcc and ptxas not run
        second = await compile_check(src, path=path, options=opts())
    assert second.cached
    assert second.resources == first.resources
    third = await compile_check(src + "// edit\n", path=path, options=opts())
    assert not third.cached
    other_arch = await compile_check(src, path=path, options=opts(arch="sm_80"))
    assert not other_arch.cached and other_arch.resources[0].arch == "sm_80"


@needs_nvcc
async def test_disk_cache_and_header_edits(tmp_path):
    clear_cache()
    (tmp_path / "h.cuh").write_text("#define V 1\n")
    src = '#include "h.cuh"\n__global__ void k(int* x) { x[0] = V; }\n'
    path = str(tmp_path / "d.cu")
    cache_dir = str(tmp_path / "cache")
    assert (await compile_check(src, path=path, options=opts(), cache_dir=cache_dir)).ok
    clear_cache()
    again = await compile_check(src, path=path, options=opts(), cache_dir=cache_dir)
    assert again.cached and again.ok
    time.sleep(0.01)
    (tmp_path / "h.cuh").write_text("#define V oops_undefined\n")
    broken = await compile_check(src, path=path, options=opts(), cache_dir=cache_dir)
    assert not broken.cached and not broken.ok
    [err] = errors(broken)
    assert err.span.start_line == 1 and "oops_undefined" in err.message  # where the macro is used


# ------------------------------------------------------------------ cancellation

HEAVY_SRC = textwrap.dedent("""\
    #include <thrust/device_vector.h>
    #include <thrust/sort.h>
    void run(thrust::device_vector<float>& v, thrust::device_vector<double>& w) {
      thrust::sort(v.begin(), v.end());
      thrust::sort(w.begin(), w.end());
    }
    """)


def _processes_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


@needs_nvcc
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
async def test_cancel_kills_nvcc_and_its_children(tmp_path):
    marker = f"KLSP_CANCEL_{uuid.uuid4().hex}"
    task = asyncio.create_task(compile_check(HEAVY_SRC, path=str(tmp_path / "heavy.cu"),
                                             options=opts(defines={marker: "1"})))
    deadline = time.monotonic() + 20
    while not _processes_with(marker):
        assert time.monotonic() < deadline, "nvcc never started"
        assert not task.done(), task.result().log if task.done() else ""
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # let nvcc hand over to its children (cudafe/cicc/gcc)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert _processes_with(marker) == []


# ------------------------------------------------------------------ broken toolchains


async def test_missing_nvcc_is_one_clear_diagnostic(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(nvcc_mod, "_FALLBACK_DIRS", ())
    assert find_nvcc(None) is None
    result = await compile_check("__global__ void k() {}\n", path=str(tmp_path / "k.cu"), options=CompileOptions())
    assert not result.ok
    [d] = result.diagnostics
    assert d.span.start_line == 0 and d.code == "nvcc-missing"
    assert "nvcc was not found" in d.message and "kernelLsp.nvcc" in d.message
    configured = await compile_check("", path=str(tmp_path / "k.cu"), options=CompileOptions(nvcc="/opt/none/nvcc"))
    [d] = configured.diagnostics
    assert "/opt/none/nvcc" in d.message and d.code == "nvcc-missing"


async def test_broken_nvcc_is_one_clear_diagnostic(tmp_path):
    crashing = tmp_path / "crash" / "nvcc"
    crashing.parent.mkdir()
    crashing.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crashing.chmod(crashing.stat().st_mode | stat.S_IEXEC)
    not_exec = tmp_path / "noexec" / "nvcc"
    not_exec.parent.mkdir()
    not_exec.write_text("not a program")
    for exe in (crashing, not_exec):
        result = await compile_check("__global__ void k() {}\n", path=str(tmp_path / "k.cu"),
                                     options=CompileOptions(nvcc=str(exe)))
        assert not result.ok
        [d] = result.diagnostics
        assert d.code == "nvcc-broken" and d.span.start_line == 0 and str(exe) in d.message


@needs_nvcc
async def test_unknown_arch_is_one_clear_diagnostic(tmp_path):
    result = await compile_check("__global__ void k() {}\n", path=str(tmp_path / "k.cu"), options=opts(arch="sm_1000"))
    assert not result.ok
    [d] = result.diagnostics
    assert d.code == "bad-arch" and "sm_1000" in d.message and "kernelLsp.arch" in d.message
    bad = await compile_check("__global__ void k() {}\n", path=str(tmp_path / "k.cu"), options=opts(arch="banana"))
    [d] = bad.diagnostics
    assert d.code == "bad-arch" and "banana" in d.message


@needs_nvcc
def test_nvcc_version_and_command():
    assert nvcc_version(NVCC)[0].isdigit()
    cmd = nvcc_command("k.cu", options=opts(arch="sm_90", defines={"A": "1", "B": None},
                                            include_paths=["/inc"], flags=["-G"]), out_path="k.cubin")
    assert cmd[0] == NVCC
    for part in ("-cubin", "-lineinfo", "-arch=sm_90", "-DA=1", "-DB", "-I/inc", "-G", "-std=c++17"):
        assert part in cmd
    assert cmd[cmd.index("-Xptxas") + 1] == "-v"
    shared = nvcc_command("k.cu", options=opts(), out_path="k.so", mode="shared")
    assert "-shared" in shared and "-fPIC" in shared and "-O3" in shared
    with pytest.raises(ValueError):
        nvcc_command("k.cu", options=opts(), out_path="x", mode="ptx-please")


def test_torch_headers_found_without_importing_torch():
    code = ("import sys; from kernel_lsp.toolchain import CompileOptions, nvcc_command, torch_include_paths;"
            "cmd = nvcc_command('k.cu', options=CompileOptions(nvcc='nvcc', torch_headers=True), out_path='o');"
            "print(len(torch_include_paths()), any(c.startswith('-DTORCH_EXTENSION_NAME=') for c in cmd),"
            " 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(__file__))).stdout.split()
    import importlib.util

    expected = "2" if importlib.util.find_spec("torch") else "0"
    assert out == [expected, "True", "False"]


# ------------------------------------------------------------------ the fast build

LAUNCHER_SRC = textwrap.dedent("""\
    #include <cuda_runtime.h>
    __global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1; }
    extern "C" int add_one_forward(float* x, int n, cudaStream_t stream) {
      add_one<<<(n + 255) / 256, 256, 0, stream>>>(x, n);
      return (int)cudaGetLastError();
    }
    """)


@needs_nvcc
def test_build_library_makes_a_loadable_so(tmp_path):
    out = tmp_path / "lib" / "add_one.so"
    result = build_library(LAUNCHER_SRC, out_path=str(out), options=opts(), timeout=120)
    assert result.ok, result.log
    assert out.is_file() and [r.kernel for r in result.resources] == ["add_one"]
    assert "-shared" in result.command and str(out) in result.command
    lib = ctypes.CDLL(str(out))  # cudart is linked statically: loads without a GPU
    assert hasattr(lib, "add_one_forward")


@needs_nvcc
def test_build_library_failure_leaves_no_library(tmp_path):
    out = tmp_path / "bad.so"
    src = LAUNCHER_SRC.replace("x[i] += 1", "x[i] += missing_thing")
    result = build_library(src, out_path=str(out), options=opts(), timeout=120, path=str(tmp_path / "bad.cu"))
    assert not result.ok and not out.exists()
    [err] = errors(result)
    assert err.span.start_line == 1 and "missing_thing" in err.message


@needs_nvcc
async def test_missing_torch_headers_say_how_to_fix(tmp_path, monkeypatch):
    from kernel_lsp.toolchain import compile as compile_mod

    monkeypatch.setattr(compile_mod, "torch_include_paths", lambda: [])
    monkeypatch.setattr(nvcc_mod, "torch_include_paths", lambda: [])
    src = "#include <torch/extension.h>\n__global__ void k(float* x) { x[0] = 1; }\n"
    result = await compile_check(src, path=str(tmp_path / "ext.py"), options=opts(torch_headers=True))
    [err] = errors(result)
    assert err.span.start_line == 0 and "torch/extension.h" in err.message
    assert "torch's C++ headers were not found" in err.message
