"""fastbuild.build_load: load() of source files built the fast way: what is compiled where, with
which flags, that every unit compiles with the real nvcc and g++ against the precompiled torch
headers, that the objects link and the extension imports and runs its host code (this CPU build of
torch has no CUDA libraries: they are left out of the link), and the fallback reasons (issue 9)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kernel_lsp.engine.worker.build import fastbuild

EXT = Path(__file__).parent / "load_sources" / "ext"
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)
EXTRA_CFLAGS = ["-O2", "-DKLSP_CPP_FLAG=7"]
EXTRA_CUDA = ["-O3", "-DKLSP_BIAS=0.5f", "-Xcompiler", "-DKLSP_HOST_ONLY=1"]


def load_args(tmp: Path, sources: list[Path | str], **kw) -> dict:
    args = {"name": "klsp_load_ext", "sources": [str(s) for s in sources], "build_directory": str(tmp / "b"),
            "extra_cflags": EXTRA_CFLAGS, "extra_cuda_cflags": EXTRA_CUDA, "extra_ldflags": None,
            "extra_include_paths": None, "with_cuda": None, "is_python_module": True, "is_standalone": False,
            "keep_intermediates": True}
    args.update(kw)
    return args


@pytest.fixture
def pch_env(monkeypatch, pch_cache):
    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_cache))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # the engine sets it (build._cached_torch_build)
    return pch_cache


def command(fb: fastbuild.FastBuild, step: str) -> list[str]:
    (cmd,) = [c for c in fb.commands if c[-2:] == ["-o", f"fast_{step}.o"]]
    return cmd


def nm(path: Path, *opts: str) -> str:
    return subprocess.run(["nm", "-C", *opts, str(path)], capture_output=True, text=True, check=True).stdout


def test_the_lean_link_keeps_torch_python_and_what_is_not_torchs():
    """libtorch_python's own dependencies bring torch's other libraries and the CUDA runtime: the
    lean list names it alone of them, keeps every other flag, and stands aside when it cannot lean
    on it or is turned off."""
    torch_list = ["-L/t/lib", "-lc10", "-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch", "-ltorch_python",
                  "-L/cuda/lib64", "-lcudart"]
    assert fastbuild.lean_ldflags(torch_list) == ["-L/t/lib", "-ltorch_python", "-L/cuda/lib64"]
    assert fastbuild.lean_ldflags(["-L/t/lib", "-lc10", "-ltorch"]) is None  # nothing brings them along
    assert fastbuild.lean_ldflags(["-L/t/lib", "-ltorch_python"]) is None    # nothing to leave out


def test_the_lean_link_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("KERNEL_LSP_LEAN_LINK", "0")
    assert fastbuild.lean_ldflags(["-lc10", "-ltorch_python"]) is None


def test_relink_full_says_why_it_cannot():
    assert fastbuild.relink_full(fastbuild.FastBuild()) == "it was not linked lean"


def link_objects(build_dir: Path) -> Path:
    """Link the objects as one shared library (torch's CUDA libraries are not here: their symbols
    stay undefined, which -shared allows; ours must all be resolved among the units)."""
    so = build_dir / "linked.so"
    objs = sorted(str(p) for p in build_dir.glob("fast_*.o"))
    proc = subprocess.run(["g++", "-shared", *objs, "-o", str(so)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return so


# -- a .cu and a .cpp with a header beside it -----------------------------------------------------------


@needs_nvcc
@pytest.mark.slow
def test_a_cu_and_a_cpp_build_as_three_units_against_the_light_headers(tmp_path, pch_env):
    cu, cpp = EXT / "scale_kernel.cu", EXT / "bindings.cpp"
    # as a candidate writes it: paths relative to where it runs
    fb = fastbuild.build_load(load_args(tmp_path, [os.path.relpath(cu), os.path.relpath(cpp)]), NVCC, link=False)
    assert fb.reason == "", fb.log[-4000:]
    assert set(fb.steps) >= {"device_scale_kernel", "host_scale_kernel", "cpp_bindings"}
    assert fb.full_header == []                  # the light headers served every unit
    assert "not used because" not in fb.log     # and the precompiled ones really were used
    b = tmp_path / "b"
    device, host, main = (command(fb, s) for s in ("device_scale_kernel", "host_scale_kernel", "cpp_bindings"))
    # the .cu's kernels go to nvcc with extra_cuda_cflags, never extra_cflags
    assert device[0] == NVCC and "fast_device_scale_kernel.cu" in device
    assert {"-O3", "-DKLSP_BIAS=0.5f"} <= set(device) and "-DKLSP_CPP_FLAG=7" not in device
    assert "torch/" not in (b / "fast_device_scale_kernel.cu").read_text()
    # its host code to g++ with what of extra_cuda_cflags reached the host compiler
    assert host[0] != NVCC and {"-DKLSP_BIAS=0.5f", "-DKLSP_HOST_ONLY=1"} <= set(host)
    assert "-DKLSP_CPP_FLAG=7" not in host and "-O3" not in host
    # the .cpp to g++ with extra_cflags (no -O level: the precompiled header's is kept)
    assert main[0] == host[0] and "-DKLSP_CPP_FLAG=7" in main and "-O2" not in main and "-DKLSP_BIAS=0.5f" not in main
    # its "ops.h" is found from its own folder, as when torch compiles it in place
    assert main[main.index("-iquote") + 1] == str(EXT)
    # the .cpp against the light main header (pybind), the .cu's host code against the light host one
    pch = {s: c[c.index("-include") + 1] for s, c in (("host", host), ("main", main))}
    assert pch["host"] != pch["main"] and all(p.startswith(str(pch_env)) for p in pch.values())
    assert "pybind.h" in Path(pch["main"]).read_text() and "pybind" not in Path(pch["host"]).read_text()
    # the .cpp as the user wrote it, on its own lines and under its own name; torch/extension.h blanked
    unit = (b / "fast_cpp_bindings.cpp").read_text().splitlines()
    assert unit[:2] == ["#define TORCH_EXTENSION_NAME klsp_load_ext", f'#line 1 "{cpp}"']
    assert unit[2:] == ["" if "torch/extension.h" in ln else ln for ln in cpp.read_text().splitlines()]
    # what the units need of each other they define: launchers, the torch-facing function, the module
    assert "PyInit_klsp_load_ext" in nm(b / "fast_cpp_bindings.o", "--defined-only")
    assert "scale_add(at::Tensor, double)" in nm(b / "fast_host_scale_kernel.o", "--defined-only")
    so = link_objects(b)
    undefined = nm(so, "-D", "--undefined-only")
    assert "__klsp_launch_" not in undefined and "scale_add" not in undefined, undefined[-2000:]
    # Linked like torch links it, less the CUDA libraries this CPU build of torch lacks, the
    # extension imports under its name and its functions run as the user wrote them.
    ldflags = fastbuild.torch_flags(NVCC).ldflags
    libdirs = [f[2:] for f in ldflags if f.startswith("-L")]
    present = [f for f in ldflags if not f.startswith("-l")
               or any(Path(d, f"lib{f[2:]}.so").exists() for d in libdirs)]
    assert {"-lc10", "-ltorch_python", "-lcudart"} <= set(present)
    objs = sorted(str(p) for p in b.glob("fast_*.o"))
    proc = subprocess.run(["g++", "-shared", *objs, *present, *(f"-Wl,-rpath,{d}" for d in libdirs), "-o",
                           str(b / "klsp_load_ext.so")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = ("import importlib.util, sys, torch\n"
             "spec = importlib.util.spec_from_file_location('klsp_load_ext', sys.argv[1])\n"
             "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
             "print(m.cpp_flag(), m.ops_version, m.scale_add.__doc__.strip().splitlines()[-1])\n"
             "try:\n    m.scale_add(torch.ones(3), 2.0)\n"
             "except RuntimeError as e:\n    print(str(e).splitlines()[0])\n")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", check, str(b / "klsp_load_ext.so")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["7 3 x * s + KLSP_BIAS", "x: a contiguous CUDA tensor"]
    # Linked lean (what the engine does): libtorch_python alone of torch's libraries, whose own
    # dependencies bring libtorch, libtorch_cpu and libc10 when the extension loads. The CUDA
    # runtime, which a CUDA build of torch brings the same way, is named here for this CPU build.
    lean = fastbuild.lean_ldflags(ldflags)
    assert lean is not None and "-ltorch_python" in lean and not {"-lc10", "-ltorch_cpu", "-ltorch"} & set(lean)
    cudart = [f"-L{d}" for d in libdirs] + ["-lcudart"]
    lean_so = b / "lean" / "klsp_load_ext.so"
    lean_so.parent.mkdir()
    proc = subprocess.run(["g++", "-shared", *objs, *lean, *cudart, "-o", str(lean_so)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    needed = subprocess.run(["readelf", "-d", str(lean_so)], capture_output=True, text=True, check=True).stdout
    assert "libtorch_python" in needed and "libc10.so" not in needed and "libtorch_cpu" not in needed, needed
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", check, str(lean_so)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["7 3 x * s + KLSP_BIAS", "x: a contiguous CUDA tensor"]


@needs_nvcc
@pytest.mark.slow
def test_several_cu_files_keep_their_anonymous_namespaces_apart(tmp_path, pch_env):
    """Two .cu files with the same helper names in anonymous namespaces: named apart per file, so
    the units link without merging them (a template helper would merge silently)."""
    texts = {}
    for i, (op, fn) in enumerate((("+", "add_one"), ("*", "twice"))):
        texts[fn] = (
            "#include <torch/extension.h>\n"
            "namespace {\n"
            f"template <typename T> T apply(T x) {{ return x {op} T(2); }}\n"
            f"__global__ void k{i}(float* x, int n) {{ int j = threadIdx.x; if (j < n) x[j] = x[j] {op} 2.0f; }}\n"
            "}\n"
            f"torch::Tensor {fn}(torch::Tensor x) {{\n"
            f"    k{i}<<<1, 32>>>(x.data_ptr<float>(), (int)x.numel());\n"
            "    return x * apply<float>(1.0f);\n"
            "}\n")
        (tmp_path / f"{fn}.cu").write_text(texts[fn])
    fb = fastbuild.build_load(load_args(tmp_path, [tmp_path / "add_one.cu", tmp_path / "twice.cu"]), NVCC,
                              link=False)
    assert fb.reason == "", fb.log[-4000:]
    b = tmp_path / "b"
    names = [set(re.findall(r"__klsp_anon\w*", (b / f"fast_host_{fn}.cpp").read_text())) for fn in texts]
    assert names[0] and names[1] and not names[0] & names[1]
    link_objects(b)


@needs_nvcc
@pytest.mark.slow
def test_a_compile_error_in_a_user_cpp_falls_back_naming_that_file(tmp_path, pch_env):
    ext = tmp_path / "ext"
    shutil.copytree(EXT, ext)
    bad = ext / "bindings.cpp"
    bad.write_text(bad.read_text().replace("return KLSP_CPP_FLAG;", "return klsp_undefined_thing;"))
    line = 1 + bad.read_text().splitlines().index(next(ln for ln in bad.read_text().splitlines()
                                                       if "klsp_undefined_thing" in ln))
    fb = fastbuild.build_load(load_args(tmp_path, [ext / "scale_kernel.cu", bad]), NVCC, link=False)
    # tried against the light header, then the full one, then given up with the user's file and line
    assert fb.full_header == ["cpp_bindings"]
    assert fb.reason.startswith(f'fast unit of "{bad}" failed to compile: {bad}:{line}:'), fb.reason
    assert "klsp_undefined_thing" in fb.reason


# -- what falls back, and why (no compiler needed) ---------------------------------------------------------


KERNEL = "__global__ void k(float* x) { x[0] = 1.0f; }\n"


@pytest.mark.parametrize("files, kw, reason", [
    ({"a.cu": '#include <torch/extension.h>\n#include "helpers.cuh"\n' + KERNEL, "helpers.cuh": ""}, {},
     '{d}/a.cu: includes a local header "helpers.cuh" (line 2)'),
    ({"a.cpp": "#include <torch/extension.h>\nint f() { return 1; }\n"}, {"with_cuda": True}, "no .cu source"),
    ({"a.cu": KERNEL + "torch::Tensor f(torch::Tensor x) { return x; }\n"}, {},
     "{d}/a.cu uses torch but includes none of its headers"),
    ({"a.cu": "#include <cuda_runtime.h>\n" + KERNEL, "b.cu": "#include <cuda_runtime.h>\n" + KERNEL}, {},
     "kernel k is defined in {d}/a.cu and {d}/b.cu"),
    ({"a.cu": KERNEL, "b.c": "int f(void) { return 0; }\n"}, {},
     "source {d}/b.c: only .cu and .cpp/.cc/.cxx files take the fast path"),
    ({"a.cu": KERNEL}, {"is_standalone": True}, "is_standalone given"),
    ({"a.cu": KERNEL}, {"keep_intermediates": False}, "keep_intermediates=False"),
    ({"a.cu": "#include <cuda_runtime.h>\nint x;\n"}, {}, "{d}/a.cu: no __global__ kernel in the CUDA source"),
])
def test_what_load_cannot_build_fast_says_why(tmp_path, files, kw, reason):
    d = tmp_path / "src"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    sources = [d / n for n in files if not n.endswith((".cuh", ".h"))]
    fb = fastbuild.build_load(load_args(tmp_path, sources, **kw), NVCC)
    assert fb.so is None and fb.reason == reason.format(d=d)
    assert fb.commands == []  # decided before anything was compiled


def test_a_missing_source_says_which(tmp_path):
    fb = fastbuild.build_load(load_args(tmp_path, [tmp_path / "nope.cu"]), NVCC)
    assert fb.reason.startswith(f"source {tmp_path / 'nope.cu'}: ") and "No such file" in fb.reason


def test_torch_headers_are_followed_through_local_headers(tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "deep.h").write_text("#pragma once\n#include <ATen/ATen.h>\n")
    (tmp_path / "ops.h").write_text('#pragma once\n#include "deep.h"\n')
    cpp = tmp_path / "a.cpp"
    cpp.write_text('#include "ops.h"\nat::Tensor f(at::Tensor x) { return x; }\n')
    # deep.h is found only through extra_include_paths, as the compiler would find it
    assert fastbuild._includes_torch(cpp, cpp.read_text(), [str(tmp_path / "inc")])
    assert not fastbuild._includes_torch(cpp, cpp.read_text(), [])
    (tmp_path / "loop.h").write_text('#include "loop.h"\n')  # a header that includes itself: no hang
    assert not fastbuild._includes_torch(cpp, '#include "loop.h"\n', [])


# -- through the engine's hook: the record says what happened ----------------------------------------------

CANDIDATE = '''
import os
from torch.utils.cpp_extension import load
HERE = os.path.dirname(os.path.abspath(__file__))
ext = load(name="klsp_load_hook", sources=[os.path.join(HERE, "k.cu"), os.path.join(HERE, "b.cpp")],
           extra_cuda_cflags=["-O3"])
'''
BINDINGS = ("#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x);\n"
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &f); }\n")


@pytest.mark.parametrize("fast, reason", [
    (True, '{d}/k.cu: includes a local header "helpers.cuh" (line 2)'),
    (False, "fast_inline is off"),
])
def test_the_build_record_of_a_load_call_says_why_the_fast_path_was_not_taken(tmp_path, fast_inline_on_cpu, fast,
                                                                               reason):
    from kernel_lsp.engine.worker.build import build

    fast_inline_on_cpu(fast)
    (tmp_path / "helpers.cuh").write_text("#pragma once\n")
    (tmp_path / "k.cu").write_text('#include <torch/extension.h>\n#include "helpers.cuh"\n' + KERNEL
                                   + "torch::Tensor f(torch::Tensor x) { k<<<1, 1>>>(x.data_ptr<float>()); return x; }\n")
    (tmp_path / "b.cpp").write_text(BINDINGS)
    result = build.build_python(CANDIDATE, str(tmp_path / "candidate.py"))
    # a CPU build of torch cannot build CUDA the normal way either: the record still says why
    assert result.fast_path is False
    assert result.fallback_reason == reason.format(d=tmp_path)
    assert result.to_dict()["fallback_reason"] == reason.format(d=tmp_path)


@needs_nvcc
@pytest.mark.slow
def test_a_load_call_goes_through_the_fast_path_up_to_the_link(tmp_path, monkeypatch, pch_env):
    """Through the hook, with the fast path on: every unit compiles and links against libtorch_python
    alone (fastbuild.lean_ldflags); on this CPU build of torch the extension then misses the CUDA
    runtime and the link with torch's whole list misses its CUDA libraries, so the record says both
    and the normal build runs."""
    import torch

    from kernel_lsp.engine.worker.build import build

    if torch.cuda.is_available():
        pytest.skip("with CUDA torch the link succeeds: test_inline_split_gpu.py runs the extension")
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_fast_inline", None)
    build.configure_fast_inline(True)
    shutil.copy(EXT / "scale_kernel.cu", tmp_path / "k.cu")
    (tmp_path / "b.cpp").write_text(BINDINGS.replace("f(torch::Tensor x)", "scale_add(torch::Tensor x, double s)")
                                    .replace('m.def("f", &f)', 'm.def("f", &scale_add)'))
    text = CANDIDATE.replace('extra_cuda_cflags=["-O3"]', f"extra_cuda_cflags={EXTRA_CUDA!r}")
    result = build.build_python(text, str(tmp_path / "candidate.py"))
    assert result.fast_path is False and not result.ok
    assert result.fallback_reason.startswith("the fast build does not load: "), result.fallback_reason
    assert "undefined symbol" in result.fallback_reason, result.fallback_reason
    assert "linked again with torch's whole list: the full link failed" in result.fallback_reason
    (ext_dir,) = [p for p in (tmp_path / "cache" / "ext").iterdir() if p.is_dir()]
    assert {p.name for p in ext_dir.glob("fast_*.o")} == {
        "fast_device_k.o", "fast_host_k.o", "fast_cpp_b.o"}


def test_load_is_built_when_asked_not_deferred(tmp_path, monkeypatch):
    """A candidate that writes its sources to a temporary folder and removes it once load()
    returns still builds: load() is not handed to a build thread like load_inline is."""
    from kernel_lsp.engine.worker.build import build

    def fake_load(name, sources, extra_cflags=None, extra_cuda_cflags=None, build_directory=None, verbose=False,
                  with_cuda=None, is_python_module=True, keep_intermediates=True):
        module = type(sys)(name)
        module.text = Path(sources[0]).read_text()  # torch's build reads the files when it runs
        module.thread = threading.get_ident()
        return module

    module = type(sys)("fake_cpp_extension_load")
    module.load = build._wrap(fake_load, "load")
    monkeypatch.setitem(sys.modules, "fake_cpp_extension_load", module)
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_fast_inline", None)
    build.configure_fast_inline(True)
    src = ("import os, tempfile\nimport fake_cpp_extension_load as c\n"
           "with tempfile.TemporaryDirectory() as d:\n"
           "    p = os.path.join(d, 'op.cpp')\n"
           "    open(p, 'w').write('int op() { return 1; }')\n"
           "    ext = c.load(name='op', sources=[p])\n")
    m, result = build.load_python(src, str(tmp_path / "tmp_sources.py"))
    assert result.ok, result.log
    assert type(m.ext).__name__ == "module" and m.ext.text == "int op() { return 1; }"
    assert m.ext.thread == threading.get_ident()  # built in the module's own thread, as it was asked


def test_the_cache_key_of_a_load_call_covers_the_users_own_headers(tmp_path):
    """An edited header the sources include (beside them, or in extra_include_paths) is a new
    extension, not a stale cache hit; torch's and the system's headers are not read."""
    from kernel_lsp.engine.worker.build.build import _key_material

    (tmp_path / "inc").mkdir()
    (tmp_path / "ops.h").write_text('#pragma once\n#include <tiles.h>\nconstexpr int kV = 1;\n')
    (tmp_path / "inc" / "tiles.h").write_text("constexpr int kTile = 16;\n")
    cpp = tmp_path / "b.cpp"
    cpp.write_text('#include <torch/extension.h>\n#include "ops.h"\n#include <vector>\n')
    args = {"name": "x", "sources": [str(cpp)], "extra_include_paths": [str(tmp_path / "inc")]}
    first = _key_material(args)
    assert str(tmp_path / "inc" / "tiles.h") in first and "site-packages" not in first
    (tmp_path / "inc" / "tiles.h").write_text("constexpr int kTile = 32;\n")
    second = _key_material(args)
    assert second != first
    (tmp_path / "ops.h").write_text('#pragma once\n#include <tiles.h>\nconstexpr int kV = 2;\n')
    assert _key_material(args) != second
    (tmp_path / "unrelated.h").write_text("int nothing;\n")
    assert _key_material(args) == _key_material(args)
    # a source without headers of its own keeps the key it had
    plain = tmp_path / "plain.cpp"
    plain.write_text("int f() { return 1; }\n")
    assert _key_material({"name": "x", "sources": [str(plain)]}) == (
        '{"sources": [["%s", "int f() { return 1; }\\n"]]}' % plain)


@needs_nvcc
@pytest.mark.slow
def test_a_single_cu_with_its_pybind_module_builds_against_the_main_header(tmp_path, pch_env):
    """The common one-file load(): kernels, wrapper and PYBIND11_MODULE in one .cu. Its host unit
    holds the module, so it is built against the light header that has pybind (no full header)."""
    cu = tmp_path / "one.cu"
    cu.write_text((EXT / "scale_kernel.cu").read_text()
                  + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"scale_add\", &scale_add); }\n")
    fb = fastbuild.build_load(load_args(tmp_path, [cu]), NVCC, link=False)
    assert fb.reason == "", fb.log[-4000:]
    assert fb.full_header == [] and set(fb.steps) >= {"device_one", "host_one"}
    host = command(fb, "host_one")
    assert "pybind.h" in Path(host[host.index("-include") + 1]).read_text()
    assert "PyInit_klsp_load_ext" in nm(tmp_path / "b" / "fast_host_one.o", "--defined-only")
    link_objects(tmp_path / "b")


ONE_FILE_EXT = (EXT.parent / "one_file_ext.cu").read_text()


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("broken", [False, True])
def test_a_cu_file_of_the_users_own_extension_takes_the_fast_path(tmp_path, monkeypatch, pch_env, fast_inline_on_cpu,
                                                                   broken):
    """The engine's own build of a .cu with PYBIND11_MODULE (build_cuda, as on save) goes through
    the same fast path as a candidate's load(). On this CPU torch the link misses torch's CUDA
    libraries, so the normal build is asked for next (here a stand-in that only says it was asked:
    the real one would take a minute to fail the same way); the reason names the user's file."""
    import functools

    from torch.utils import cpp_extension

    from kernel_lsp.engine.worker.build import build

    fast_inline_on_cpu(True)
    build.install_hooks()  # as after any earlier build in the process: the hook wraps torch's load
    asked: list[list[str]] = []

    # torch's own load, not the engine's hook around it (installed by earlier tests in a run)
    @functools.wraps(getattr(cpp_extension.load, "_klsp_real", cpp_extension.load))
    def normal_build(name, sources, *a, **kw):
        asked.append(list(sources))
        raise RuntimeError("the normal build was asked for")

    monkeypatch.setattr(cpp_extension, "load", normal_build)
    user_file = str(tmp_path / "my_ext.cu")
    source = ONE_FILE_EXT.replace("return y;", "return y") if broken else ONE_FILE_EXT
    path, result = build.build_cuda(source, user_file, {"arch": "sm_90"})
    assert path is None and not result.ok and len(asked) == 1
    assert "the normal build was asked for" in result.log
    (ext_dir,) = [p for p in (tmp_path / "cache" / "ext").iterdir() if p.is_dir()]
    if broken:
        assert result.fallback_reason.startswith(f'fast host unit of "{user_file}" failed to compile: {user_file}:23:'), \
            result.fallback_reason
    else:
        assert result.fallback_reason.startswith("the fast build does not load: "), result.fallback_reason
        assert "linked again with torch's whole list" in result.fallback_reason, result.fallback_reason
        assert {p.name for p in ext_dir.glob("fast_*.o")} >= {f"fast_device_{ext_dir.name}.o",
                                                              f"fast_host_{ext_dir.name}.o"}
    assert str(ext_dir) not in result.fallback_reason


def test_the_users_cu_is_built_the_normal_way_when_the_fast_path_is_off(tmp_path, monkeypatch, fast_inline_on_cpu):
    import functools

    from torch.utils import cpp_extension

    from kernel_lsp.engine.worker.build import build

    fast_inline_on_cpu(False)
    build.install_hooks()

    # torch's own load, not the engine's hook around it (installed by earlier tests in a run)
    @functools.wraps(getattr(cpp_extension.load, "_klsp_real", cpp_extension.load))
    def normal_build(name, sources, *a, **kw):
        raise RuntimeError("the normal build was asked for")

    monkeypatch.setattr(cpp_extension, "load", normal_build)
    _, result = build.build_cuda(ONE_FILE_EXT, str(tmp_path / "my_ext.cu"), {"arch": "sm_90"})
    assert not result.ok and "the normal build was asked for" in result.log
    assert result.fallback_reason == "fast_inline is off" and result.fast_path is False
