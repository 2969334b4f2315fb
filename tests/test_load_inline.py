"""The compile check builds embedded sources as load_inline does (issue: a compile error where
there is none): the implicit headers of the installed torch, no_implicit_headers, the
cpp_sources with the PYBIND11_MODULE of `functions`, and diagnostics from text the user did
not write said as such. Real nvcc; the torch-header builds are slow the first time (cached
on disk after, under KERNEL_LSP_CACHE)."""

from __future__ import annotations

import pytest

from kernel_lsp.analysis import compile_document
from kernel_lsp.config import Settings
from kernel_lsp.source import parse_document
from kernel_lsp.toolchain import CompileOptions, compile_check, find_nvcc, torch_include_paths
from kernel_lsp.toolchain.compile import Around
from kernel_lsp.toolchain.load_inline import DEFAULT_HEADERS, headers_from_text, implicit_headers, wrap

NVCC = find_nvcc(None)
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)
needs_torch_headers = pytest.mark.skipif(not torch_include_paths(), reason="needs torch's C++ headers")

CUDA_NO_INCLUDE = '''
__global__ void softmax_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
torch::Tensor softmax_cuda_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    softmax_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
'''


def task(cuda: str = CUDA_NO_INCLUDE, cpp: str = "", functions: str = '["softmax_cuda_forward"]',
         extra: str = "") -> str:
    return ("from torch.utils.cpp_extension import load_inline\n"
            f'cuda_src = """{cuda}"""\n'
            f'cpp_src = """{cpp}"""\n'
            f"ext = load_inline(name='sm', cpp_sources=cpp_src, cuda_sources=cuda_src, functions={functions}{extra})\n")


def test_rules_come_from_the_installed_torch() -> None:
    rules = implicit_headers()
    # torch 2.13 here (and 2.11 on the GPU machine) prepend these:
    assert rules["cuda"] == ("torch/types.h", "cuda.h", "cuda_runtime.h")
    assert rules["cpp"] == ("torch/extension.h",)
    # Another torch's file says otherwise: its rules are followed, in insertion order.
    older = ("cpp_sources.insert(0, '#include <torch/extension.h>')\n"
             "cuda_sources.insert(1, '#include <cuda_runtime.h>')\n"
             "cuda_sources.insert(0, \"#include <torch/types.h>\")\n")
    assert headers_from_text(older) == {"cpp": ("torch/extension.h",),
                                        "cuda": ("torch/types.h", "cuda_runtime.h")}
    assert DEFAULT_HEADERS == {"cpp": ("torch/extension.h",), "cuda": ("torch/types.h", "cuda.h", "cuda_runtime.h")}


def test_wrap_as_load_inline_writes_it() -> None:
    w = wrap("cuda", ["f"], headers=DEFAULT_HEADERS)
    assert w.prelude == "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
    assert w.postlude == "" and w.prelude_lines == 3
    c = wrap("cpp", ["f", "g"], headers=DEFAULT_HEADERS)
    assert c.prelude == "#include <torch/extension.h>\n"
    assert 'm.def("f", f, "f");' in c.postlude and "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in c.postlude
    assert wrap("cuda", implicit=False).prelude == "" and wrap("cpp", ["f"], implicit=False).prelude == ""


def test_reader_sees_no_implicit_headers() -> None:
    doc = parse_document("t.py", task(extra=", no_implicit_headers=True"))
    assert [e.implicit_headers for e in doc.embedded] == [False]  # cpp_src is empty: no code
    doc = parse_document("t.py", task(cpp="torch::Tensor softmax_cuda_forward(torch::Tensor x);"))
    assert sorted((e.kind, e.implicit_headers, tuple(e.functions)) for e in doc.embedded) == [
        ("cpp", True, ("softmax_cuda_forward",)), ("cuda", True, ("softmax_cuda_forward",))]


@needs_nvcc
async def test_added_lines_shift_back_and_say_they_are_not_yours(tmp_path) -> None:
    # cuda.h and cuda_runtime.h are quick; a missing header stands for any trouble in added text.
    src = "__global__ void k(float* x) {\n    x[0] = undefined_name;\n}\n"
    around = Around(prelude="#include <cuda.h>\n#include <cuda_runtime.h>\n#include <not_there_at_all.h>\n",
                    prelude_note="a header load_inline adds before cuda_sources")
    result = await compile_check(src, path=str(tmp_path / "t.py"), options=CompileOptions(nvcc=NVCC),
                                 around=around, line_map=lambda line, col: (line + 10, col))
    [err] = [d for d in result.diagnostics if d.severity == "error"]
    # nvcc stops at the missing include: it is placed on the source's first line, and says whose it is.
    assert "not_there_at_all.h" in err.message and "not a line you wrote" in err.message
    assert "a header load_inline adds before cuda_sources" in err.message
    assert err.span.start_line == 10
    fixed = Around(prelude="#include <cuda.h>\n#include <cuda_runtime.h>\n")
    result = await compile_check(src, path=str(tmp_path / "t.py"), options=CompileOptions(nvcc=NVCC),
                                 around=fixed, line_map=lambda line, col: (line + 10, col))
    [err] = [d for d in result.diagnostics if d.severity == "error"]
    assert "undefined_name" in err.message and err.span.start_line == 11  # the user's own line
    assert "not a line you wrote" not in err.message


@needs_nvcc
async def test_no_implicit_headers_means_none(tmp_path) -> None:
    # The user asked load_inline for no headers: torch::Tensor is then really unknown, on its line.
    text = task(extra=", no_implicit_headers=True")
    doc = parse_document(str(tmp_path / "t.py"), text)
    [result] = await compile_document(doc, Settings(arch="sm_90"))
    errs = [d for d in result.diagnostics if d.severity == "error"]
    assert errs and not result.ok
    line = text.splitlines().index("torch::Tensor softmax_cuda_forward(torch::Tensor x) {")
    assert errs[0].span.start_line == line and "not a line you wrote" not in errs[0].message


@pytest.fixture(scope="module")
def torch_headers_dir(tmp_path_factory):
    """One folder for the two builds against torch's headers (tens of seconds each here): their
    CUDA source is one text at one path, so the second test's CUDA unit is the first's result
    (the compile cache, in memory) and only its C++ unit is compiled again."""
    return tmp_path_factory.mktemp("torch-headers")


@needs_nvcc
@needs_torch_headers
@pytest.mark.slow
async def test_cuda_sources_get_load_inlines_headers(torch_headers_dir) -> None:
    # The file: no torch include in cuda_sources, yet it builds under load_inline.
    doc = parse_document(str(torch_headers_dir / "t.py"), task())
    [result] = await compile_document(doc, Settings(arch="sm_90"))
    assert result.ok, result.log[-2000:]
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert [r.kernel for r in result.resources] == ["softmax_kernel"]


@needs_nvcc
@needs_torch_headers
@pytest.mark.slow
async def test_cpp_sources_build_with_extension_h_and_the_bindings(torch_headers_dir) -> None:
    # torch/extension.h before the declarations; functions=[...] bound after them: a name that
    # is not declared is an error, said to come from the binding load_inline writes.
    text = task(cpp="torch::Tensor softmax_cuda_forward(torch::Tensor x);",
                functions='["softmax_cuda_forward", "softmax_backward"]')
    doc = parse_document(str(torch_headers_dir / "t.py"), text)
    results = await compile_document(doc, Settings(arch="sm_90"))
    cpp = next(r for r, e in zip(results, doc.embedded) if e.kind == "cpp")
    errs = [d for d in cpp.diagnostics if d.severity == "error"]
    assert errs and all("softmax_backward" in d.message for d in errs), [d.message for d in errs]
    assert "PYBIND11_MODULE load_inline writes" in errs[0].message and "not a line you wrote" in errs[0].message
    decl_line = text.splitlines().index('cpp_src = """torch::Tensor softmax_cuda_forward(torch::Tensor x);"""')
    assert errs[0].span.start_line == decl_line
