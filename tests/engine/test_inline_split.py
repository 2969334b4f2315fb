"""inline_split + fastbuild: what goes to which unit, the launchers, the fallback reasons, and that
both units really compile with the real nvcc and g++ here (issue 9)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernel_lsp.engine.worker.build import inline_split
from kernel_lsp.engine.worker.build.inline_split import split

SOURCES = Path(__file__).parent / "inline_sources"
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)


def src(name: str) -> str:
    return (SOURCES / name).read_text()


def body(unit: str) -> str:
    """The unit after its prelude (from the #line directive on)."""
    return unit[unit.index("#line 1"):].split("\n", 1)[1]


def code_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


# -- the split ---------------------------------------------------------------------------------------


def test_template_dispatch_kernel_gets_a_template_launcher_and_its_instantiations():
    s = split(src("dispatch_template.cu"))
    assert s.ok, s.fallback_reason
    assert [k.name for k in s.kernels] == ["gelu_kernel"]
    (launch,) = s.launches
    assert launch.kernel == "gelu_kernel" and launch.targs == "scalar_t"
    assert launch.config == ["blocks", "BLOCK"] and launch.dispatch == ["double", "float"]
    assert s.launchers == [
        "template <typename scalar_t> void __klsp_launch_gelu_kernel(dim3 __klsp_grid, dim3 __klsp_block, "
        "size_t __klsp_shmem, cudaStream_t __klsp_stream, const scalar_t * __restrict__ in , "
        "scalar_t * __restrict__ out , int64_t n) { gelu_kernel<scalar_t><<<__klsp_grid, __klsp_block, "
        "__klsp_shmem, __klsp_stream>>>(in, out, n); }"
    ]
    assert s.instantiations == [
        "__attribute__((used)) static auto* __klsp_inst_0 = &::__klsp_launch_gelu_kernel<double>;",
        "__attribute__((used)) static auto* __klsp_inst_1 = &::__klsp_launch_gelu_kernel<float>;",
    ]
    dev, host = body(s.device), body(s.host)
    # torch stays out of the device unit; the kernel and the __device__ helper stay out of the host
    assert "torch" not in s.device.replace("TORCH_CHECK", "")
    assert "__global__" in dev and "gelu(scalar_t x)" in dev and "gelu_forward" not in dev
    assert "__global__" not in host and "__device__" not in host
    assert "__klsp_launch_gelu_kernel<scalar_t>(blocks, BLOCK, 0, 0, " in host
    assert "<<<" not in host
    # what both need: the macro and the constant
    assert "constexpr int BLOCK = 256;" in dev and "constexpr int BLOCK = 256;" in host
    assert "#define CHECK_CUDA" in dev and "#define CHECK_CUDA" in host


def test_both_units_keep_every_line_where_the_user_wrote_it():
    text = src("shared_multi.cu")
    s = split(text)
    assert s.ok, s.fallback_reason
    n = text.count("\n")
    for unit in (body(s.device), body(s.host)):
        lines = unit.splitlines()
        assert len(lines) >= n
    src_lines = text.splitlines()
    dev_lines, host_lines = body(s.device).splitlines(), body(s.host).splitlines()
    for i, line in enumerate(src_lines):
        if "sdata[threadIdx.x] = acc;" in line:
            assert dev_lines[i] == line and not host_lines[i].strip()
        if "auto y = torch::empty" in line:
            assert host_lines[i] == line and not dev_lines[i].strip()


def test_anonymous_namespace_shared_memory_and_several_kernels():
    s = split(src("shared_multi.cu"))
    assert s.ok, s.fallback_reason
    assert {k.name for k in s.kernels} == {"row_sum_kernel", "scale_kernel"}
    row, scale = s.launches
    assert row.config == ["p.rows", "threads", "threads * sizeof(float)", "stream"]
    assert scale.config == ["(p.rows + 255) / 256", "256", "0", "stream"]
    dev, host = body(s.device), body(s.host)
    # an anonymous namespace gets a name (the launcher must link across units) and a using-directive
    assert "namespace __klsp_anon1 {" in dev and "} using namespace __klsp_anon1;" in dev
    assert "namespace __klsp_anon1 {" in host
    assert "struct Params" in dev and "struct Params" in host   # a type both units need
    assert "extern __shared__ float sdata[];" in dev
    assert "warp_sum" not in host                                # a __device__ function
    assert 'const char* tag = "}{";' in dev                      # braces in a string are not braces
    assert "__klsp_launch_row_sum_kernel(p.rows, threads, threads * sizeof(float), stream, " in host
    assert s.instantiations == []


def test_extra_dispatch_type_and_a_non_type_template_argument():
    s = split(src("half_dispatch.cu"))
    assert s.ok, s.fallback_reason
    (launch,) = s.launches
    assert launch.targs == "scalar_t, 4" and launch.dispatch == ["double", "float", "c10::Half"]
    assert [i.split("= &")[1] for i in s.instantiations] == [
        "::__klsp_launch_scale_kernel<double, 4>;", "::__klsp_launch_scale_kernel<float, 4>;",
        "::__klsp_launch_scale_kernel<c10::Half, 4>;"]
    assert "#include <c10/util/Half.h>" in s.device and "torch/" not in s.device


@pytest.mark.parametrize("name, reason", [
    ("constant_from_host.cu", r"host code uses __constant__ coeffs \(line 10\)"),
    ("device_lambda.cu", r"device code in host code \(a __device__ lambda\?\) at line 4"),
    ("func_attribute.cu", r"host code refers to kernel big_smem outside a launch \(line 4\)"),
])
def test_sources_that_cannot_be_split_say_why(name, reason):
    s = split(src(name))
    assert not s.ok
    assert re.fullmatch(reason, s.fallback_reason), s.fallback_reason


def test_dispatch_and2_names_its_extra_types_first():
    text = ("template <typename T> __global__ void k(T* p) { p[0] = T(1); }\n"
            "void f(at::Tensor x) { AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::ScalarType::BFloat16, "
            "x.scalar_type(), \"f\", [&] { k<scalar_t><<<1, 1>>>(x.data_ptr<scalar_t>()); }); }\n")
    s = split(text)
    assert s.ok, s.fallback_reason
    assert s.launches[0].dispatch == ["double", "float", "c10::Half", "c10::BFloat16"]
    assert "#include <c10/util/BFloat16.h>" in s.device and "#include <c10/util/Half.h>" in s.device
    s = split(text.replace("AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::ScalarType::BFloat16,",
                           "AT_DISPATCH_V2("))
    assert s.fallback_reason == "AT_DISPATCH_V2 is not a dispatch macro this splitter knows"


def test_more_fallback_reasons():
    assert split("int x;").fallback_reason == "no __global__ kernel in the CUDA source"
    assert "local header" in split('#include "mine.cuh"\n__global__ void k() {}').fallback_reason
    assert "parameter without a name" in split("__global__ void k(int) {}").fallback_reason
    s = split("__global__ void k(float* x) {}\nvoid f(float* x) { auto p = k; p<<<1, 1>>>(x); }")
    assert "outside a launch" in s.fallback_reason or "not a kernel" in s.fallback_reason
    s = split("#include <thrust/sort.h>\n__global__ void k(float* x) {}\n"
              "void f(float* x, int n) { thrust::sort(x, x + n); k<<<1, 1>>>(x); }")
    assert s.fallback_reason == "host code uses thrust (line 3)"
    assert "unterminated" in split('__global__ void k() { const char* s = "abc; }').fallback_reason


def test_lexer_reads_comments_raw_strings_and_continued_directives():
    text = ('#define TWICE(x) \\\n  ((x) * 2)\nconst char* r = R"x(a "}" <<< )x";\n'
            "/* } */ // {\n__global__ void k(float* p) { p[0] = TWICE(1); }\n")
    toks = inline_split.lex(text)
    kinds = [(t.kind, t.text) for t in toks if t.kind not in ("ws", "nl")]
    assert kinds[0] == ("pp", "#define TWICE(x) \\\n  ((x) * 2)")
    assert ("str", 'R"x(a "}" <<< )x"') in kinds
    assert ("comment", "/* } */") in kinds and ("comment", "// {") in kinds
    s = split(text + "void f(float* p) { k<<<1, 1>>>(p); }\n")
    assert s.ok and s.launches[0].kernel == "k"


def test_launch_inside_a_named_namespace_and_a_qualified_launch():
    text = ("namespace ops { __global__ void k(float* p, int n) { p[0] = n; } }\n"
            "void f(float* p) { ops::k<<<1, 32>>>(p, 3); }\n")
    s = split(text)
    assert s.ok, s.fallback_reason
    assert "ops::__klsp_launch_k(1, 32, 0, 0, p, 3)" in s.host
    assert "namespace ops { void __klsp_launch_k(" in s.host


# -- the real compilers ------------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("name", ["dispatch_template.cu", "shared_multi.cu", "half_dispatch.cu"])
def test_device_units_compile_with_nvcc_without_torch(tmp_path, name):
    import torch

    s = split("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + src(name))
    assert s.ok, s.fallback_reason
    cu = tmp_path / "device.cu"
    cu.write_text(s.device)
    inc = os.path.join(os.path.dirname(torch.__file__), "include")  # for c10/util/Half.h only
    proc = subprocess.run([NVCC, "-c", "-std=c++17", "--expt-relaxed-constexpr", "-D__CUDA_NO_HALF_OPERATORS__",
                           "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
                           "-D__CUDA_NO_HALF2_OPERATORS__", "-arch=sm_90", "-isystem", inc, str(cu),
                           "-o", str(tmp_path / "device.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    syms = subprocess.run(["nm", "-C", str(tmp_path / "device.o")], capture_output=True, text=True).stdout
    assert "__klsp_launch_" in syms


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("name, cpp, functions", [
    ("dispatch_template.cu", "torch::Tensor gelu_forward(torch::Tensor x);", ["gelu_forward"]),
    ("half_dispatch.cu", "torch::Tensor scale(torch::Tensor x, double s);", ["scale"]),
    ("shared_multi.cu", "torch::Tensor row_sum(torch::Tensor x, double scale);", ["row_sum"]),
])
def test_fast_build_compiles_all_three_units_against_the_torch_pch(tmp_path, monkeypatch, pch_cache, name, cpp,
                                                                   functions):
    from kernel_lsp.engine.worker.build import fastbuild

    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_cache))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    args = {"name": "klsp_test_ext", "cpp_sources": cpp, "cuda_sources": src(name), "functions": functions,
            "build_directory": str(tmp_path / "b"), "extra_cuda_cflags": ["-O3", "-Xcompiler", "-O2"],
            "extra_cflags": ["-O3", ""]}  # other -O levels than the PCH's must not break it
    fb = fastbuild.build_inline(args, NVCC, link=False)
    assert fb.reason == "", fb.log[-4000:]
    assert set(fb.steps) >= {"device", "host", "main"}
    b = tmp_path / "b"
    for obj in ("fast_device.o", "fast_host.o", "fast_main.o"):
        assert (b / obj).stat().st_size > 0
    assert "not used because" not in fb.log  # the PCH really served the host units
    defined = subprocess.run(["nm", "-C", "--defined-only", str(b / "fast_device.o")], capture_output=True,
                             text=True).stdout
    wanted = subprocess.run(["nm", "-C", "--undefined-only", str(b / "fast_host.o")], capture_output=True,
                            text=True).stdout
    launchers = {ln.split(" U ")[-1].strip() for ln in wanted.splitlines() if "__klsp_launch_" in ln}
    assert launchers, wanted[-2000:]
    for sym in launchers:  # every launcher the host calls, the device unit defines
        assert sym in defined, (sym, defined[-2000:])


@needs_nvcc
@pytest.mark.slow
def test_fast_build_compile_error_falls_back_with_the_reason(tmp_path, monkeypatch, pch_cache):
    from kernel_lsp.engine.worker.build import fastbuild

    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_cache))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # the engine sets it (build._cached_torch_build)
    bad = src("dispatch_template.cu").replace("out[i] = gelu<scalar_t>(in[i]);", "out[i] = undefined_thing;")
    args = {"name": "klsp_bad", "cpp_sources": "torch::Tensor gelu_forward(torch::Tensor x);", "cuda_sources": bad,
            "functions": ["gelu_forward"], "build_directory": str(tmp_path / "b")}
    fb = fastbuild.build_inline(args, NVCC, link=False)
    assert fb.reason.startswith("fast device unit failed to compile:") and "undefined_thing" in fb.reason
    # the message points at the user's line in load_inline's cuda.cu (three implicit includes first)
    line = 3 + src("dispatch_template.cu").splitlines().index(
        next(ln for ln in src("dispatch_template.cu").splitlines() if "gelu<scalar_t>(in[i])" in ln)) + 1
    assert f"cuda.cu({line})" in fb.log


def test_main_cpp_is_what_load_inline_writes():
    from kernel_lsp.engine.worker.build.fastbuild import main_cpp

    text = main_cpp({"cpp_sources": "torch::Tensor f(torch::Tensor x);", "functions": ["f"],
                     "with_pytorch_error_handling": True})
    assert text.splitlines() == [
        "#include <torch/extension.h>", "torch::Tensor f(torch::Tensor x);",
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {", 'm.def("f", torch::wrap_pybind_function(f), "f");', "}"]
    text = main_cpp({"cpp_sources": ["a", "b"], "functions": {"g": "doc"}, "with_pytorch_error_handling": False})
    assert 'm.def("g", g, "doc");' in text


def test_host_flags_keep_only_what_reached_the_host_compiler():
    from kernel_lsp.engine.worker.build.fastbuild import host_flags_from_cuda
    from kernel_lsp.engine.worker.build.fastbuild import _pch_safe

    assert _pch_safe(["-O3", "-DX", "-Ofast", "-O", "-g"]) == ["-DX", "-g"]
    assert host_flags_from_cuda(["-O3", "--use_fast_math", "-DFOO=1", "-Xcompiler", "-fopenmp,-Wall",
                                 "-Iinc", "--compiler-options=-g"]) == ["-DFOO=1", "-fopenmp", "-Wall", "-Iinc", "-g"]


# -- the engine's hook: the reason travels with the CompileResult ---------------------------------------

CANDIDATE = '''
import torch
from torch.utils.cpp_extension import load_inline
ext = load_inline(name="poly", cpp_sources="torch::Tensor poly(torch::Tensor x, torch::Tensor c);",
                  cuda_sources=r"""{cuda}""", functions=["poly"])
'''


@pytest.mark.parametrize("fast, reason", [
    (True, "host code uses __constant__ coeffs (line 13)"),   # three implicit includes come first
    (False, "fast_inline is off"),
])
def test_the_build_record_says_why_the_fast_path_was_not_taken(tmp_path, fast_inline_on_cpu, fast, reason):
    from kernel_lsp.engine.worker.build import build

    fast_inline_on_cpu(fast)
    text = CANDIDATE.replace("{cuda}", src("constant_from_host.cu"))
    result = build.build_python(text, str(tmp_path / "candidate.py"))
    # a CPU build of torch cannot build CUDA the normal way either: the record still says why
    assert result.fast_path is False
    assert result.fallback_reason == reason
    assert result.to_dict()["fallback_reason"] == reason
