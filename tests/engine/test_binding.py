"""load_inline's main.cpp bound by signature (worker/build/binding.py): what is read from
cpp_sources and what keeps load_inline's text; then, with the real nvcc and g++ against this
CPU torch, that two files with the same types and other names share one main.cpp object and
import with their own names, docstrings and error handling, that a declaration the host code
does not define falls back to load_inline's text (the linker stays trusted), and that a signature
built ahead serves a new file's build. The real builds use conftest's cpu_link, over the session's
pch_cache (xdist keeps the files that name it on one worker)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from kernel_lsp.engine.worker.build import binding, fastbuild, table_binding
from tests.engine.conftest import run_in_extension

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)


def of(cpp: str | list[str], functions, **kw) -> tuple[binding.Binding | None, str]:
    return binding.of({"cpp_sources": cpp, "functions": functions, **kw})


def test_declarations_are_read_as_types_without_names_or_defaults() -> None:
    b, why = of("#include <vector>\n// the kernels\ntorch::Tensor ln(torch::Tensor x, const torch::Tensor& w,\n"
                "    double eps = 1e-5);\nstd::vector<torch::Tensor> split(torch::Tensor x, std::tuple<int, int> k, "
                "unsigned int n, int64_t);\nvoid unused(int a);", {"ln": "a layer norm", "split": "split"})
    assert why == "" and b is not None
    assert b.includes == ("#include <vector>",)
    assert b.functions == (("ln", "a layer norm", "torch::Tensor", ("torch::Tensor", "const torch::Tensor&", "double")),
                           ("split", "split", "std::vector<torch::Tensor>",
                            ("torch::Tensor", "std::tuple<int,int>", "unsigned int", "int64_t")))
    text = b.text()
    assert "ln" not in text.replace("klsp", "") and "split" not in text and "a layer norm" not in text
    assert text.startswith("#include <torch/extension.h>\n#include <vector>\n")
    assert "torch::wrap_pybind_function(klsp_bound_0)" in text
    assert '"a layer norm"' in b.names_c() and "klsp_bound_name_1" in b.names_c()


def test_the_same_types_under_other_names_give_the_same_text() -> None:
    a, _ = of("torch::Tensor relu_forward(torch::Tensor input);", ["relu_forward"])
    b, _ = of(["torch::Tensor gelu(torch::Tensor x);"], "gelu")
    c, _ = of("torch::Tensor gelu(torch::Tensor x, float s);", ["gelu"])
    assert a is not None and b is not None and c is not None
    assert a.text() == b.text() != c.text()
    assert a.text() == binding.common(1)[0].text()  # the most common signature, built ahead
    assert a.names_c() != b.names_c()


def test_no_error_handling_and_no_implicit_header_are_kept() -> None:
    b, _ = of("#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x);", ["f"],
              with_pytorch_error_handling=False, no_implicit_headers=True)
    assert b is not None
    assert "wrap_pybind_function" not in b.text() and b.text().count("torch/extension.h") == 1


@pytest.mark.parametrize("cpp,functions,why", [
    ("torch::Tensor f(torch::Tensor x) { return x; }", ["f"], "not only plain function declarations"),
    ("namespace k { torch::Tensor f(torch::Tensor x); }", ["f"], "not only plain"),
    ("torch::Tensor f(torch::Tensor x);\ntorch::Tensor f(torch::Tensor x, int k);", ["f"], "declared twice"),
    ("torch::Tensor f(torch::Tensor x);", ["g"], "g is not declared"),
    ("using namespace torch;\nTensor f(Tensor x);", ["f"], "not only plain"),
    ("#define T torch::Tensor\nT f(T x);", ["f"], "'#define' lines"),
    ("torch::Tensor f(torch::Tensor x, float (*g)(float));", ["f"], "not only plain"),
    ("template <typename T> T f(T x);", ["f"], "not only plain"),
    ("torch::Tensor f(torch::Tensor x)", ["f"], "ends without ';'"),
    ("torch::Tensor f(torch::Tensor x);", {"f": 'say "hi"'}, "not plain text"),
    ("torch::Tensor f(torch::Tensor x);", None, "no functions="),
])
def test_anything_but_plain_declarations_keeps_load_inline_s_text(cpp, functions, why) -> None:
    b, said = of(cpp, functions)
    assert b is None and why in said, said


def test_how_many_are_built_ahead(monkeypatch) -> None:
    monkeypatch.setenv(binding.PREBUILD_ENV, "3")
    assert binding.prebuild_count() == 3
    monkeypatch.setenv(binding.PREBUILD_ENV, "0")
    assert binding.prebuild_count() == 0
    monkeypatch.delenv(binding.PREBUILD_ENV)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert binding.prebuild_count() == 0  # a 2-core machine: g++ of 5 s each would compete with the user's builds
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert binding.prebuild_count() == len(binding.COMMON)


# -- real builds ------------------------------------------------------------------------------------

CUDA = r'''
#include <torch/extension.h>
__global__ void scale_kernel(const float* x, float* y, float s, long n) {
    long i = blockIdx.x * 256L + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}
torch::Tensor scale(torch::Tensor x, double s) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto y = torch::empty_like(x);
    scale_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), (float)s, x.numel());
    return y;
}
int64_t NAME(torch::Tensor x) { return x.numel() * 7; }
'''
IMPORT = textwrap.dedent("""
    import importlib.machinery, importlib.util, sys, torch
    name, so, fn = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = importlib.util.spec_from_loader(name, importlib.machinery.ExtensionFileLoader(name, so))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    print(getattr(mod, fn)(torch.ones(3)), getattr(mod, fn).__doc__.strip().splitlines()[-1])
    try:
        mod.scale(torch.ones(3), 2.0)
    except RuntimeError as e:
        print("RuntimeError", str(e).splitlines()[0])
""")


@pytest.fixture(autouse=True)
def by_signature(monkeypatch):
    """These tests are of the binding by signature: the table binding (test_table_binding.py),
    which serves these signatures first, is off."""
    monkeypatch.setenv(table_binding.OFF_ENV, "0")


def build(tmp_path, name: str, fn: str, cpp: str | None = None) -> fastbuild.FastBuild:
    args = {"name": name, "cpp_sources": cpp or f"torch::Tensor scale(torch::Tensor x, double s);\n"
                                                f"int64_t {fn}(torch::Tensor input);",
            "cuda_sources": CUDA.replace("NAME", fn), "functions": {"scale": "x * s", fn: "seven per element"},
            "build_directory": str(tmp_path / name), "extra_cuda_cflags": ["-O3"]}
    return fastbuild.build_inline(args, NVCC)


def nm_dynamic(so: str) -> str:
    return subprocess.run(["nm", "-D", so], capture_output=True, text=True, check=True).stdout


@needs_nvcc
@pytest.mark.slow
def test_two_files_with_the_same_types_share_main_cpp_and_import_under_their_own_names(cpu_link) -> None:
    tmp_path, env = cpu_link
    got = {}
    for name, fn in (("klsp_bind_a", "answer"), ("klsp_bind_b", "count7")):
        fb = build(tmp_path, name, fn)
        assert fb.reason == "" and fb.so and fb.binding == "by signature", fb.log[-3000:]
        got[name] = fb
        proc = subprocess.run([sys.executable, "-W", "ignore", "-c", IMPORT, name, fb.so, fn], capture_output=True,
                              text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # load_inline's module: its names, its docstrings, and c10 errors as RuntimeError
        assert proc.stdout.splitlines() == ["21 seven per element", "RuntimeError x must be a CUDA tensor"]
        assert "klsp_bound" not in nm_dynamic(fb.so)  # the placeholders stay inside the extension
    assert "main" in got["klsp_bind_a"].compiled
    # another file, other function names, the same types: its main.cpp is not compiled
    assert "main" in got["klsp_bind_b"].reused and "main" not in got["klsp_bind_b"].compiled


@needs_nvcc
@pytest.mark.slow
def test_a_declaration_the_host_code_does_not_define_falls_back_to_load_inline_s_text(cpu_link) -> None:
    tmp_path, _ = cpu_link
    fb = build(tmp_path, "klsp_bind_wrong", "answer",
               cpp="torch::Tensor scale(torch::Tensor x, double s);\nint64_t answer(torch::Tensor input, int k);")
    assert fb.binding.startswith("load_inline's text: the signature binding failed (fast link failed"), fb.binding
    assert "_Z6answerN2at6TensorEi" in fb.log  # what the alias pointed at, kept for the record
    # the build went on with load_inline's own main.cpp, as it would have without the binding
    assert 'm.def("answer", torch::wrap_pybind_function(answer), "seven per element");' in (
        tmp_path / "klsp_bind_wrong" / "fast_main.cpp").read_text()
    assert "main" in fb.compiled and fb.reason == ""  # links (a shared object may leave it undefined)
    # the faster linker is still trusted: the failure was the declaration's
    flags = fastbuild.torch_flags(NVCC)
    assert not fastbuild._refusal_note(flags.cxx, flags.identity, "gold").exists()
    assert not fastbuild._refusal_note(flags.cxx, flags.identity, "lld").exists()


@needs_nvcc
@pytest.mark.slow
def test_a_signature_built_ahead_serves_a_new_file(cpu_link, monkeypatch) -> None:
    tmp_path, env = cpu_link
    flags = fastbuild.torch_flags(NVCC)
    done = fastbuild.prebuild_bindings(flags, 1)
    assert list(done) == ["torch::Tensor(torch::Tensor)"] and isinstance(done["torch::Tensor(torch::Tensor)"], float)
    kept = json.loads((fastbuild.cache_root() / "prebuild" / fastbuild.PREBUILT).read_text())
    assert kept["signatures"] == done
    cuda = CUDA.replace("NAME", "count7").replace("int64_t count7", "torch::Tensor twice(torch::Tensor x) "
                                                  "{ return x * 2; }\nint64_t count7")
    args = {"name": "klsp_bind_ahead", "cpp_sources": "torch::Tensor twice(torch::Tensor input);",
            "cuda_sources": cuda, "functions": ["twice"], "build_directory": str(tmp_path / "ahead")}
    fb = fastbuild.build_inline(args, NVCC)
    assert fb.reason == "" and fb.binding == "by signature", fb.log[-3000:]
    assert "main" in fb.reused and "main" not in fb.compiled
    out = run_in_extension(env, "klsp_bind_ahead", fb.so,
                           "print(m.twice(torch.ones(2)).tolist(), m.twice.__doc__.strip().splitlines()[-1])\n")
    assert out.split() == ["[2.0,", "2.0]", "twice"]


@needs_nvcc
@pytest.mark.slow
def test_the_binding_can_be_turned_off(cpu_link, monkeypatch) -> None:
    tmp_path, _ = cpu_link
    monkeypatch.setenv(binding.OFF_ENV, "0")
    args = {"name": "klsp_bind_off", "cpp_sources": "int64_t answer(torch::Tensor input);",
            "cuda_sources": CUDA.replace("NAME", "answer"), "functions": ["answer"],
            "build_directory": str(tmp_path / "off")}
    fb = fastbuild.build_inline(args, NVCC, link=False)
    assert fb.reason == "" and fb.binding == f"${binding.OFF_ENV}=0", fb.log[-2000:]
    assert 'm.def("answer", torch::wrap_pybind_function(answer), "answer");' in (tmp_path / "off" / "fast_main.cpp").read_text()


@needs_nvcc
def test_preparing_the_headers_starts_the_ahead_builds_once_not_when_only_checking(cpu_link, monkeypatch) -> None:
    started = []
    monkeypatch.setattr(fastbuild, "_PREBUILD", [])
    monkeypatch.setattr(fastbuild, "prebuild_bindings", lambda flags, count, timeout=0: started.append(count))
    monkeypatch.setenv(binding.PREBUILD_ENV, "2")
    assert fastbuild.prepare(NVCC, check_only=True)["state"] in ("ready", "needed")
    assert started == [] and fastbuild._PREBUILD == []
    assert fastbuild.prepare(NVCC)["state"] in ("ready", "made")  # the session's headers, or made now
    fastbuild._PREBUILD[0].join(10)
    assert started == [2]
    fastbuild.prepare(NVCC)
    assert len(fastbuild._PREBUILD) == 1 and started == [2]  # one per process
    monkeypatch.setenv(binding.PREBUILD_ENV, "0")
    monkeypatch.setattr(fastbuild, "_PREBUILD", [])
    fastbuild.prepare(NVCC)
    assert fastbuild._PREBUILD == [] and started == [2]


NEW_FILE = '''
import torch
from torch.utils.cpp_extension import load_inline

open(MARKER, "w").write("ran")  # the module's code: never run by a binding ahead

cpp = "torch::Tensor fused_op(torch::Tensor a, torch::Tensor b, double scale, int64_t k);"
ext = load_inline(name="fused", cpp_sources=cpp, cuda_sources=CUDA_TEXT, functions=["fused_op"],
                  extra_cflags=["-O3", "-g"])
other = load_inline(name="o", cpp_sources=make_decls(), cuda_sources="", functions=["f"])
'''


def test_a_source_s_bindings_are_read_without_running_it() -> None:
    assert binding.literal_calls("def broken(:") == []
    calls = binding.literal_calls(NEW_FILE)
    assert calls[1] is None  # cpp_sources computed at run time: not known
    assert calls[0]["cpp_sources"].startswith("torch::Tensor fused_op") and calls[0]["cuda_sources"] is ...
    found, why = fastbuild.source_bindings(NEW_FILE)
    assert why == "" and len(found) == 1
    b, flags = found[0]
    assert b.functions == (("fused_op", "fused_op", "torch::Tensor",
                            ("torch::Tensor", "torch::Tensor", "double", "int64_t")),)
    assert flags == []  # -O and -g do not reach a binding's command: the object is shared
    assert fastbuild.source_bindings("x = 1\n") == ([], "no load_inline call with literal cpp_sources and functions")
    with_paths = NEW_FILE.replace('extra_cflags=["-O3", "-g"]', 'extra_include_paths=["inc"]')
    assert fastbuild.source_bindings(with_paths) == ([], "its load_inline names extra_include_paths")


@needs_nvcc
@pytest.mark.slow
def test_a_file_s_binding_built_ahead_serves_its_first_build(cpu_link) -> None:
    tmp_path, _ = cpu_link
    got = fastbuild.prebuild_source(NEW_FILE, NVCC)
    sig = "torch::Tensor(torch::Tensor, torch::Tensor, double, int64_t)"
    assert got["state"] == "made" and isinstance(got["signatures"][sig], float), got
    assert fastbuild.prebuild_source(NEW_FILE, NVCC) == {"state": "cached", "signatures": {sig: 0.0}}
    assert not list((fastbuild.cache_root() / "prebuild").glob("ahead_*"))  # its scratch folders gone
    cuda = CUDA.replace("NAME", "unused") + ("torch::Tensor fused_op(torch::Tensor a, torch::Tensor b, double scale, "
                                             "int64_t k) { return a * scale + b * (double)k; }\n")
    args = {"name": "klsp_fused_first", "cpp_sources": "torch::Tensor fused_op(torch::Tensor a, torch::Tensor b, "
            "double scale, int64_t k);", "cuda_sources": cuda, "functions": ["fused_op"],
            "extra_cflags": ["-O3", "-g"], "build_directory": str(tmp_path / "first")}
    fb = fastbuild.build_inline(args, NVCC, link=False)
    assert fb.reason == "" and fb.binding == "by signature", fb.log[-2000:]
    assert "main" in fb.reused and "main" not in fb.compiled
