"""The fast build's per-unit object cache (worker/build/unit_cache.py), with the real nvcc and g++ here:
a kernel-body edit recompiles the device unit only, a header or flag change recompiles every unit
it reaches, a module object is reused under another extension's name and still imports, a
compiler error is replayed, and two processes at once share the cache without corrupting it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernel_lsp.engine.worker.build import fastbuild, unit_cache

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)
ROOT = Path(__file__).resolve().parents[2]

RELU = re.search(r'relu_cuda_source = r"""(.*?)"""', (ROOT / "benchmarks/tasks/relu_new.py").read_text(), re.S).group(1)
BODY = "y[i] = v > 0.0f ? v : 0.0f;"
HOST = "const int threads = 256;"


@pytest.fixture
def unit_env(tmp_path, monkeypatch, pch_cache):
    """A fresh build cache (so a fresh unit cache), the session's precompiled headers, and an nvcc
    that writes a line per run (the device unit's compiler invocations, counted)."""
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_cache))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # the engine sets it (build._cached_torch_build)
    calls = tmp_path / "nvcc_calls.txt"
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {NVCC} "$@"\n')
    nvcc.chmod(0o755)
    return tmp_path, str(nvcc), calls


def inline_args(tmp_path: Path, name: str, cuda: str, **kw) -> dict:
    args = {"name": name, "cpp_sources": "torch::Tensor relu_cuda(torch::Tensor x);", "cuda_sources": cuda,
            "functions": ["relu_cuda"], "extra_cuda_cflags": ["-O3"], "build_directory": str(tmp_path / "b" / name)}
    args.update(kw)
    return args


def entries() -> dict[str, float]:
    """The unit cache's objects by their text's key (not the copies kept by preprocessed tokens), and
    their mtimes."""
    return {p.parent.name: p.stat().st_mtime_ns for p in unit_cache.units_root().glob(f"*/{unit_cache.OBJECT}")
            if json.loads((p.parent / unit_cache.META).read_text()).get("by") != "tokens"}


def nvcc_runs(calls: Path) -> int:
    """Device-unit compiles: a parallel compile is nvcc's --dryrun (its steps run without nvcc),
    and plain nvcc after it, for the same object, is the same compile's failure being worded."""
    lines = calls.read_text().splitlines() if calls.exists() else []
    runs, planned = 0, ""
    for line in lines:
        obj = line.split()[-1]
        if "--dryrun" in line:
            runs, planned = runs + 1, obj
        elif obj != planned:
            runs += 1
        else:
            planned = ""
    return runs


def defined(obj: Path) -> str:
    return subprocess.run(["nm", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout


@needs_nvcc
@pytest.mark.slow
def test_a_kernel_body_edit_recompiles_the_device_unit_only(unit_env):
    tmp_path, nvcc, calls = unit_env
    a = fastbuild.build_inline(inline_args(tmp_path, "relu_a", RELU), nvcc, link=False)
    assert a.reason == "", a.log[-3000:]
    assert sorted(a.compiled) == ["device", "host", "main"] and a.reused == []
    assert nvcc_runs(calls) == 1
    before = entries()
    assert len(before) == 3

    # another candidate: the same kernel with another body (its extension name carries a new hash)
    b = fastbuild.build_inline(inline_args(tmp_path, "relu_b", RELU.replace(BODY, "y[i] = fmaxf(v, 0.0f);")),
                               nvcc, link=False)
    assert b.reason == "", b.log[-3000:]
    assert b.compiled == ["device"] and sorted(b.reused) == ["host", "main"]
    assert nvcc_runs(calls) == 2                      # one more nvcc run: the device unit's
    after = entries()
    assert {k: after[k] for k in before} == before    # the kept objects were not rewritten
    assert len(after) == 4
    # main.cpp's object is relu_a's, its module entry point renamed to this extension's
    main_b = defined(tmp_path / "b" / "relu_b" / "fast_main.o")
    assert re.search(r" T PyInit_relu_b$", main_b, re.M) and not re.search(r" T PyInit_relu_a$", main_b, re.M)
    assert "fmaxf" in (tmp_path / "b" / "relu_b" / "fast_device.cu").read_text()

    # an edit of the host code only: its unit, nothing else
    c = fastbuild.build_inline(inline_args(tmp_path, "relu_c", RELU.replace(HOST, "const int threads = 512;")),
                               nvcc, link=False)
    assert c.reason == "" and c.compiled == ["host"] and sorted(c.reused) == ["device", "main"]
    assert nvcc_runs(calls) == 2


@needs_nvcc
@pytest.mark.slow
def test_a_body_edit_that_adds_lines_reuses_the_host_unit_only_when_its_tokens_are_the_same(unit_env):
    """The host unit keeps the file's line numbers, so a kernel body one line longer moves its text;
    its preprocessed tokens decide: the same without a __LINE__ after the kernel (reused), not the
    same with TORCH_CHECK there (its line is in the tokens: compiled again)."""
    tmp_path, nvcc, calls = unit_env
    longer = "const float w = v;\n    y[i] = w > 0.0f ? w : 0.0f;"
    plain = "\n".join(ln for ln in RELU.splitlines() if "TORCH_CHECK" not in ln)
    a = fastbuild.build_inline(inline_args(tmp_path, "plain_a", plain), nvcc, link=False)
    assert a.reason == "" and sorted(a.compiled) == ["device", "host", "main"], a.log[-3000:]
    b = fastbuild.build_inline(inline_args(tmp_path, "plain_b", plain.replace(BODY, longer)), nvcc, link=False)
    assert b.reason == "", b.log[-3000:]
    assert b.compiled == ["device"] and sorted(b.reused) == ["host", "main"] and "host_preprocess" in b.steps
    # The reused object is the one the new text compiles to (no __LINE__ of the file in it).
    fresh = tmp_path / "fresh.o"
    cmd = next(c for c in b.commands if c[-1] == "fast_host.o")
    subprocess.run([*cmd[:-1], str(fresh)], cwd=tmp_path / "b" / "plain_b", check=True, capture_output=True)
    assert defined(fresh) == defined(tmp_path / "b" / "plain_b" / "fast_host.o")

    c = fastbuild.build_inline(inline_args(tmp_path, "checked_a", RELU), nvcc, link=False)
    assert c.reason == "" and "host" in c.compiled, c.log[-3000:]
    d = fastbuild.build_inline(inline_args(tmp_path, "checked_b", RELU.replace(BODY, longer)), nvcc, link=False)
    assert d.reason == "" and sorted(d.compiled) == ["device", "host"] and d.reused == ["main"], d.log[-3000:]


@needs_nvcc
@pytest.mark.slow
def test_a_header_or_flag_change_recompiles_every_unit_that_reads_it(unit_env):
    tmp_path, nvcc, calls = unit_env
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "klsp_cfg.h").write_text("#define KLSP_SCALE 1.0f\n")
    cuda = "#include <klsp_cfg.h>\n" + RELU.replace(BODY, "y[i] = KLSP_SCALE * (v > 0.0f ? v : 0.0f);")
    cpp = "#include <klsp_cfg.h>\ntorch::Tensor relu_cuda(torch::Tensor x);"

    def build(name: str, **kw) -> fastbuild.FastBuild:
        fb = fastbuild.build_inline(inline_args(tmp_path, name, cuda, cpp_sources=cpp,
                                                extra_include_paths=[str(inc)], **kw), nvcc, link=False)
        assert fb.reason == "", fb.log[-3000:]
        return fb

    assert sorted(build("cfg_a").compiled) == ["device", "host", "main"]
    assert build("cfg_b").compiled == []              # nothing changed but the name: all three kept
    (inc / "klsp_cfg.h").write_text("#define KLSP_SCALE 2.0f\n")  # the user's header, included by all
    # ... but main.cpp by table: its one text includes none of cpp_sources' headers
    assert sorted(build("cfg_c").compiled) == ["device", "host"]
    flags = build("cfg_e", extra_cuda_cflags=["-O3", "-DKLSP_FLAG=1"], extra_cflags=["-DKLSP_FLAG=1"])
    assert sorted(flags.compiled) == ["device", "host", "main"]
    assert nvcc_runs(calls) == 3


@needs_nvcc
@pytest.mark.slow
def test_a_compile_error_is_replayed_not_recompiled(unit_env):
    tmp_path, nvcc, calls = unit_env
    bad = RELU.replace(BODY, "y[i] = undefined_thing;")
    first = fastbuild.build_inline(inline_args(tmp_path, "bad_a", bad), nvcc, link=False)
    assert first.reason.startswith("fast device unit failed to compile:") and "undefined_thing" in first.reason
    assert '"cuda.cu"' in (tmp_path / "b" / "bad_a" / "fast_device.cu").read_text()  # no build folder in it
    again = fastbuild.build_inline(inline_args(tmp_path, "bad_b", bad), nvcc, link=False)
    # The same error, naming this candidate's own cuda.cu (written beside its units).
    assert again.reason == first.reason.replace("/bad_a/", "/bad_b/"), (again.reason, first.reason)
    assert "/bad_b/cuda.cu(14): error" in again.reason
    assert again.compiled == [] and "device" in again.reused
    assert nvcc_runs(calls) == 1


def test_the_name_stays_in_the_key_unless_only_the_module_uses_it():
    ctx = unit_cache.UnitContext("ext_1")
    d = "#define TORCH_EXTENSION_NAME ext_1\n"
    assert unit_cache.name_mode(d + "int f();", ctx, 3)[1] == "free"
    assert unit_cache.name_mode(d + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}", ctx, 3)[1] == "module"
    # pybind11 2 names the module from its own PyModuleDef: a renamed object would keep the old name
    assert unit_cache.name_mode(d + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}", ctx, 2)[1] == "named"
    assert unit_cache.name_mode(d + "TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) {}", ctx, 3)[1] == "named"
    assert unit_cache.name_mode(d + 'const char* s = "ext_1";', ctx, 3)[1] == "named"
    assert unit_cache.name_mode(d + "int ext_1_cuda();", ctx, 3)[1] == "free"  # a longer word is not the name
    header = unit_cache.UnitContext("ext_1", (("/h.h", "0"),), headers_use_name=True)
    assert unit_cache.name_mode(d + "int f();", header, 3)[1] == "named"
    # two names, one text: one key when free, two when named
    other = unit_cache.UnitContext("ext_2")
    d2 = "#define TORCH_EXTENSION_NAME ext_2\n"
    free = [unit_cache.unit_key(x + "int f();", ["c++"], "id", c, 3)[0] for x, c in ((d, ctx), (d2, other))]
    named = [unit_cache.unit_key(x + "TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) {}", ["c++"], "id", c, 3)[0]
             for x, c in ((d, ctx), (d2, other))]
    assert free[0] == free[1] and named[0] != named[1]


CPU_MODULE = "torch::Tensor twice(torch::Tensor x) { return x * 2; }"
IMPORT = textwrap.dedent("""
    import importlib.machinery, importlib.util, sys, torch
    name, so = sys.argv[1], sys.argv[2]
    spec = importlib.util.spec_from_loader(name, importlib.machinery.ExtensionFileLoader(name, so))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    print(mod.__name__, mod.twice(torch.ones(3)).tolist())
""")


@pytest.mark.slow
def test_a_module_object_reused_under_another_name_imports_as_that_extension(tmp_path, monkeypatch, pch_cache):
    """main.cpp of one extension, reused for another (its PyInit_ renamed), linked against this
    CPU torch and imported under the new name, in a fresh interpreter."""
    import dataclasses

    import torch

    if unit_cache.pybind11_major(fastbuild.torch_flags(NVCC).includes) < 3:
        pytest.skip("pybind11 < 3: the name stays in the key, nothing is renamed")
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_cache))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cpu = dataclasses.replace(fastbuild.torch_flags(NVCC),
                              ldflags=(f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"))
    monkeypatch.setattr(fastbuild, "torch_flags", lambda nvcc: cpu)
    out = {}
    for name in ("klsp_twice_a", "klsp_twice_b"):
        args = {"name": name, "cpp_sources": CPU_MODULE, "functions": ["twice"], "build_directory": str(tmp_path / name)}
        (tmp_path / name).mkdir()
        res, done = fastbuild._start()
        text = f"#define TORCH_EXTENSION_NAME {name}\n" + '#line 1 "main.cpp"\n' + fastbuild.main_cpp(args)
        fb = fastbuild._build_units([fastbuild.Unit("main", "main", text)], args, NVCC, res, done, True, 600)
        assert fb.reason == "" and fb.so, fb.log[-3000:]
        out[name] = fb
        env = {**os.environ, "LD_LIBRARY_PATH": lib}
        proc = subprocess.run([sys.executable, "-c", IMPORT, name, fb.so], capture_output=True, text=True, env=env,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == [name, "[2.0,", "2.0,", "2.0]"]
    assert out["klsp_twice_a"].compiled == ["main"] and out["klsp_twice_b"].reused == ["main"]


WORKER = textwrap.dedent("""
    import json, re, sys
    from pathlib import Path
    from kernel_lsp.engine.worker.build import fastbuild
    cuda, name, out = Path(sys.argv[1]).read_text(), sys.argv[2], sys.argv[3]
    args = {"name": name, "cpp_sources": "torch::Tensor relu_cuda(torch::Tensor x);", "cuda_sources": cuda,
            "functions": ["relu_cuda"], "extra_cuda_cflags": ["-O3"], "build_directory": out}
    fb = fastbuild.build_inline(args, sys.argv[4], link=False)
    print(json.dumps({"reason": fb.reason, "compiled": fb.compiled, "reused": fb.reused}))
""")


@needs_nvcc
@pytest.mark.slow
def test_two_processes_at_once_share_the_cache_without_corrupting_it(unit_env):
    tmp_path, nvcc, calls = unit_env
    src = tmp_path / "relu.cu"
    src.write_text(RELU)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(src), f"relu_p{i}", str(tmp_path / f"p{i}"), nvcc],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["reason"] == "" for r in results), results
    # each unit compiled once between them: whoever came second waited for the lock and reused it
    for step in ("device", "host", "main"):
        assert sum(step in r["compiled"] for r in results) == 1, results
        assert sum(step in r["reused"] for r in results) == 1, results
    assert nvcc_runs(calls) == 1
    root = unit_cache.units_root()
    assert not list(root.glob("*/*.tmp")) and len(entries()) == 3
    for meta in root.glob(f"*/{unit_cache.META}"):
        assert json.loads(meta.read_text())["step"] in ("device", "host", "main")
    for i in range(2):  # both builds' objects are whole: the launchers the host calls, the device defines
        d = tmp_path / f"p{i}"
        assert "__klsp_launch_relu_kernel" in defined(d / "fast_device.o")
        assert f"PyInit_relu_p{i}" in defined(d / "fast_main.o")
    # and an entry that lost its meta (a crash between the two writes) is a miss, compiled again
    (entry,) = [p.parent for p in root.glob(f"*/{unit_cache.META}") if "device" in p.read_text()]
    (entry / unit_cache.META).unlink()
    again = fastbuild.build_inline(inline_args(tmp_path, "relu_p2", RELU), nvcc, link=False)
    assert again.compiled == ["device"] and sorted(again.reused) == ["host", "main"]


# -- the device unit's light prelude (inline_split.device_prelude) -----------------------------------

# Names __half through token pasting, which the light prelude's look at the code cannot see.
HIDDEN_HALF = RELU.replace(BODY, "T(__, ha, lf) h = T(__flo, at2ha, lf)(v); y[i] = v > 0.0f ? T(_, _ha, lf2float)(h) : 0.0f;") \
    .replace("__global__", "#define T(a, b, c) a##b##c\n__global__", 1)


@needs_nvcc
@pytest.mark.slow
def test_a_plain_float_kernel_builds_with_the_light_prelude_in_one_run(unit_env):
    tmp_path, nvcc, calls = unit_env
    got = fastbuild.build_inline(inline_args(tmp_path, "light", RELU), nvcc, link=False)
    assert got.reason == "" and got.full_prelude == [], got.reason
    text = (tmp_path / "b" / "light" / "fast_device.cu").read_text()
    assert "cuda_fp16.h" not in text and "<algorithm>" not in text
    assert nvcc_runs(calls) == 1


@needs_nvcc
@pytest.mark.slow
def test_a_kernel_the_light_prelude_misjudges_builds_with_the_full_one(unit_env):
    tmp_path, nvcc, calls = unit_env
    got = fastbuild.build_inline(inline_args(tmp_path, "hidden_half", HIDDEN_HALF), nvcc, link=False)
    assert got.reason == "" and got.full_prelude == ["device"], got.reason
    assert "device_full_prelude" in got.steps
    assert "cuda_fp16.h" in (tmp_path / "b" / "hidden_half" / "fast_device.cu").read_text()
    assert nvcc_runs(calls) == 2
    # A real error in a light unit is reported from the first run: no second compile.
    bad = fastbuild.build_inline(inline_args(tmp_path, "bad_light", RELU.replace(BODY, "y[i] = nowhere;")),
                                 nvcc, link=False)
    assert bad.reason.startswith("fast device unit failed to compile:") and "nowhere" in bad.reason
    assert bad.full_prelude == [] and nvcc_runs(calls) == 3


def test_half_and_bfloat16_code_gets_the_full_prelude():
    from kernel_lsp.engine.worker.build import inline_split

    for code in ("__half x;", "half2 y;", "__nv_bfloat16 z;", "__hadd(a, b)", "__float2half_rn(v)", "hexp2(x)",
                 "h2exp(x)", "std::max(a, b)", "at::Half"):
        assert inline_split.device_prelude(code) == inline_split.DEVICE_PRELUDE, code
    for code in ("__host__ __device__ float f(float v) { return tanhf(v); }", "y[i] = blockIdx.x;"):
        assert inline_split.device_prelude(code) == inline_split.DEVICE_PRELUDE_LIGHT, code


@needs_nvcc
@pytest.mark.slow
def test_a_faster_linker_that_fails_gives_way_to_the_default_and_is_not_tried_again(unit_env, monkeypatch):
    tmp_path, nvcc, _ = unit_env
    import torch

    if not torch.version.cuda:  # a CPU torch has no CUDA libraries to link against: empty stand-ins
        stubs = tmp_path / "stubs"
        stubs.mkdir()
        (stubs / "e.c").write_text("int klsp_stub;\n")
        for lib in ("c10_cuda", "torch_cuda"):
            subprocess.run(["gcc", "-shared", "-o", str(stubs / f"lib{lib}.so"), str(stubs / "e.c")], check=True)
        monkeypatch.setenv("LIBRARY_PATH", str(stubs))
    monkeypatch.setenv("KERNEL_LSP_LINKER", "klspbroken")  # no such linker: -fuse-ld fails
    monkeypatch.setattr(fastbuild, "_linker_works", lambda cxx, name: True)
    a = fastbuild.build_inline(inline_args(tmp_path, "link_a", RELU), nvcc)
    assert a.reason == "" and a.so and os.path.exists(a.so), a.log[-3000:]
    assert a.linker.startswith("default (klspbroken failed"), a.linker
    assert a.binding == "by table"  # the linker's refusal is not blamed on main.cpp's binding
    assert len(entries()) == 3  # main.cpp compiled once (test_inline_split_gpu.py counts the same on a GPU)
    assert "-fuse-ld=klspbroken" in a.commands[-2] and "-fuse-ld=klspbroken" not in a.commands[-1]
    monkeypatch.setattr(fastbuild, "_linker_refused", set())  # a new process: the note in the cache says it
    b = fastbuild.build_inline(inline_args(tmp_path, "link_b", RELU.replace(BODY, "y[i] = fmaxf(v, 0.0f);")), nvcc)
    assert b.reason == "" and b.linker == "default" and b.lean, b.linker  # torch_python alone of torch's
    assert "-lc10" not in b.commands[-1] and "-lc10" in b.full_link  # the whole list kept for a relink
    # An extension that does not load lean is linked again, in place, with torch's whole list.
    assert fastbuild.relink_full(b) == "" and not b.lean and "relink" in b.steps and os.path.exists(b.so)
    assert b.commands[-1][-1].startswith(b.so) and "-lc10" in b.commands[-1]
    assert fastbuild.relink_full(b) == "it was not linked lean"
    notes = list((unit_cache.units_root().parent / "linkers").glob("klspbroken-*.failed"))
    assert len(notes) == 1 and notes[0].read_text().strip()
