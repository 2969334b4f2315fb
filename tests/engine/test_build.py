"""build.py: content-hash caches for .cu and load_inline builds, on this CPU-only machine."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lsp.engine.worker.build import build
from kernel_lsp.model import Candidate, Task

ROOT = Path(__file__).resolve().parents[2]
ADD1 = """#include <cuda_runtime.h>
__global__ void add1(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
extern "C" int add1_launch(float* x, int n) {
  add1<<<(n + 255) / 256, 256>>>(x, n);
  return (int)cudaGetLastError();
}
"""
from tests.processes import no_process_started  # noqa: E402
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_root_follows_the_environment(cache, monkeypatch):
    assert build.cache_root() == cache and cache.is_dir()
    monkeypatch.delenv("KERNEL_LSP_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache / "xdg"))
    assert build.cache_root() == cache / "xdg" / "kernel-lsp"


def test_fast_path_detection():
    assert build.has_c_launcher(ADD1)
    assert not build.has_c_launcher(ADD1 + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}\n")
    assert not build.has_c_launcher(ADD1 + "TORCH_LIBRARY(myops, m) {}\n")
    assert not build.has_c_launcher("__global__ void k() {}\n")


def test_arch_resolution(monkeypatch):
    assert build.target_arch({"arch": "9.0"}) == "sm_90"
    monkeypatch.setenv("KERNEL_LSP_ARCH", "sm_80")
    assert build.target_arch() == "sm_80"
    assert build._torch_arch_list("sm_90a") == "9.0a"


@needs_nvcc
def test_load_cuda_builds_once_then_hits_the_cache(cache):
    lib, first = build.load_cuda(ADD1, "/tmp/add1.cu", {"arch": "sm_90"})
    assert first.ok and not first.cached and lib is not None, first.log
    assert hasattr(lib, "add1_launch")  # a ctypes.CDLL with the launcher
    assert any(r.kernel == "add1" for r in first.resources)
    with no_process_started():  # a cache hit: no nvcc, no ptxas, no linker
        lib2, second = build.load_cuda(ADD1, "/tmp/add1.cu", {"arch": "sm_90"})
    assert second.ok and second.cached and lib2 is not None
    assert [r.kernel for r in second.resources] == [r.kernel for r in first.resources]
    assert len(list((cache / "so").glob("*.so"))) == 1
    # Another arch or other flags are another build, not a stale hit.
    _, other = build.load_cuda(ADD1, "/tmp/add1.cu", {"arch": "sm_80"})
    assert other.ok and not other.cached


@needs_nvcc
def test_compile_error_comes_back_with_diagnostics(cache):
    bad = ADD1.replace("x[i] += 1.0f;", "x[i] += undefined_thing;")
    lib, result = build.load_cuda(bad, "/tmp/add1.cu", {"arch": "sm_90"})
    assert lib is None and not result.ok and not result.cached
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert errors and errors[0].span.start_line == 3 and "undefined_thing" in errors[0].message
    assert not list((cache / "so").glob("*.so"))  # nothing half-built is published


@needs_nvcc
def test_two_processes_building_the_same_source_both_succeed(cache, tmp_path):
    src = tmp_path / "same.cu"
    src.write_text(ADD1.replace("1.0f", "2.0f"))
    code = (
        "import json, sys\nfrom kernel_lsp.engine.worker.build import build\n"
        f"path, r = build.build_cuda(open({str(src)!r}).read(), {str(src)!r}, {{'arch': 'sm_90'}})\n"
        "print(json.dumps({'ok': r.ok, 'cached': r.cached, 'path': path}))\n"
    )
    env = {**os.environ, "KERNEL_LSP_CACHE": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, cwd=str(ROOT))
             for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(o["ok"] for o in outs)
    assert sorted(o["cached"] for o in outs) == [False, True]  # built once, the other waited and reused it
    assert outs[0]["path"] == outs[1]["path"] and os.path.exists(outs[0]["path"])


def test_compiler_output_parser():
    log = (
        "k.cu(12): error: identifier \"foo\" is undefined\n"
        "/x/main.cpp:3:7: error: expected ';' before 'return'\n"
        "k.cu(4): warning #177-D: variable \"y\" was declared but never referenced\n"
    )
    diags = build.parse_compiler_output(log, {"k.cu": "/src/k.cu"})
    assert [(d.path, d.span.start_line, d.severity) for d in diags] == [
        ("/src/k.cu", 11, "error"), ("/x/main.cpp", 2, "error"), ("/src/k.cu", 3, "warning")]
    assert diags[1].span.start_col == 6
    only = build.parse_compiler_output("collect2: ld returned 1 exit status\n")
    assert only[0].severity == "error" and "ld returned" in only[0].message


def test_load_python_modules_are_fresh_and_unique():
    src = "counter = []\ndef f():\n    counter.append(1)\n    return len(counter)\n"
    m1, r1 = build.load_python(src, "/tmp/cand.py")
    m2, _ = build.load_python(src, "/tmp/cand.py")
    assert r1.ok and m1 is not m2 and m1.__name__ != m2.__name__
    assert m1.f() == 1 and m1.f() == 2 and m2.f() == 1
    assert sys.modules[m1.__name__] is m1 and m1.__file__ == "/tmp/cand.py"


def test_load_python_dataclass_and_errors():
    m, r = build.load_python("import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int = 1\n", "dc.py")
    assert r.ok and m.P().x == 1
    m, r = build.load_python("x = 1\ny = (\n", "syn.py")
    assert m is None and not r.ok and r.diagnostics[0].source == "python"
    m, r = build.load_python("a = 1\n\ndef g():\n    return 1 / 0\n\ng()\n", "/tmp/raise.py")
    assert m is None and not r.ok
    d = r.diagnostics[-1]
    assert d.span.start_line == 3 and "ZeroDivisionError" in d.message and d.path == "/tmp/raise.py"
    m, r = build.load_python("import sys\nsys.exit(3)\n", "exit.py")
    assert m is None and not r.ok  # a candidate cannot end the Worker by sys.exit at import
    with pytest.raises(MemoryError):
        build.load_python("raise MemoryError('big')\n", "oom.py")


def test_failed_extension_build_is_a_compile_result(cache, monkeypatch):
    """The intercept's failure path, with a stand-in for torch's builder (no 60 s compile)."""
    calls: list[dict] = []

    def fake_load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                         build_directory=None, verbose=False, is_python_module=True):
        calls.append({"name": name, "build_directory": build_directory, "verbose": verbose})
        raise RuntimeError(f"Error building extension '{name}': [1/2] c++ -c main.cpp\n"
                           f"{build_directory}/main.cpp:5:30: error: 'undefined_name' was not declared in this scope\n"
                           "ninja: build stopped: subcommand failed.\n")

    wrapped = build._wrap(fake_load_inline, "inline")
    module = type(sys)("fake_cpp_extension")
    module.load_inline = wrapped
    monkeypatch.setitem(sys.modules, "fake_cpp_extension", module)
    src = "import fake_cpp_extension as c\next = c.load_inline(name='bad ext', cpp_sources=['x'], functions=['f'])\n"
    m, result = build.load_python(src, "/tmp/bad_inline.py")
    assert m is None and not result.ok and not result.cached
    d = [d for d in result.diagnostics if d.source == "nvcc"][0]
    assert "undefined_name" in d.message and d.span.start_line == 4 and d.path.endswith("main.cpp")
    assert result.diagnostics[-1].source == "python" and result.diagnostics[-1].span.start_line == 1
    # The extension got a content-hash name and directory in the cache; nothing was marked done.
    name = calls[0]["name"]
    assert name.startswith("bad_ext_") and calls[0]["build_directory"] == str(cache / "ext" / name)
    assert not (cache / "ext" / name / ".kernel-lsp-done").exists()
    _, again = build.load_python(src, "/tmp/bad_inline.py")
    assert not again.ok and len(calls) == 2 and calls[1]["name"] == name  # a failure is not cached
    _, other = build.load_python(src.replace("['x']", "['y']"), "/tmp/bad_inline.py")
    assert calls[2]["name"] != name  # other sources, other key


@needs_nvcc
async def test_engine_prebuild_uses_the_cpu_pool(cache):
    from kernel_lsp.engine import Engine

    task = Task(name="add1", reference_path="/tmp/add1.py", reference_source="", cuda_path="/tmp/add1.cu")
    candidate = Candidate(source=ADD1.replace("1.0f", "3.0f"), kind="cuda")
    engine = Engine(options={"arch": "sm_90"}, env={"KERNEL_LSP_CACHE": str(cache)})
    try:
        first = await engine.prebuild(task, candidate)
        assert first.ok and not first.cached, first.log
        second = await engine.prebuild(task, candidate)
        assert second.ok and second.cached
        # The GPU Worker's load_cuda in another process would now hit the same cache entry.
        _, here = build.load_cuda(candidate.source, "/tmp/add1.cu", {"arch": "sm_90"})
        assert here.cached
    finally:
        await engine.aclose()


@needs_nvcc
async def test_two_prebuilds_of_one_candidate_at_once_are_one_pool_build(cache):
    """The Search prebuilds a batch and each evaluate asks again: the second ask waits for the
    first build instead of taking a second pool slot (which the next Candidate needs)."""
    from kernel_lsp.engine import Engine
    from kernel_lsp.engine.caller.pool import BuildPool

    task = Task(name="add1", reference_path="/tmp/add1.py", reference_source="", cuda_path="/tmp/add1.cu")
    candidate = Candidate(source=ADD1.replace("1.0f", "5.0f"), kind="cuda")
    other = Candidate(source=ADD1.replace("1.0f", "6.0f"), kind="cuda")
    engine = Engine(options={"arch": "sm_90"}, env={"KERNEL_LSP_CACHE": str(cache)})
    asked: list[str] = []
    try:
        engine._pool = pool = BuildPool(env={"KERNEL_LSP_CACHE": str(cache)})
        real = pool.build

        async def counted(kind, source, *a, **kw):
            asked.append(source)
            return await real(kind, source, *a, **kw)

        pool.build = counted  # type: ignore[method-assign]
        results = await asyncio.gather(engine.prebuild(task, candidate), engine.prebuild(task, candidate),
                                       engine.prebuild(task, other))
        assert all(r.ok for r in results) and results[0] is results[1]
        assert asked.count(candidate.source) == 1 and asked.count(other.source) == 1
        assert engine._prebuilds == {}  # nothing kept once done
        # a cancelled lone waiter ends its build
        job = asyncio.ensure_future(engine.prebuild(task, Candidate(source=ADD1.replace("1.0f", "7.0f"),
                                                                    kind="cuda")))
        await asyncio.sleep(0.2)
        (inner,) = [e[0] for e in engine._prebuilds.values()]
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)
        await asyncio.wait([inner], timeout=30)  # the slot's Worker is ended (nvcc may be mid-run)
        assert inner.cancelled()
    finally:
        await engine.aclose()


def test_hooks_patch_cpp_extension_when_it_is_first_imported():
    pytest.importorskip("torch")
    code = (
        "import sys\nfrom kernel_lsp.engine.worker.build import build\nbuild.install_hooks()\n"
        "assert 'torch' not in sys.modules  # installing the hook imports nothing heavy\n"
        "from torch.utils.cpp_extension import load_inline, load\n"
        "import torch.utils.cpp_extension as c\n"
        "assert hasattr(load_inline, '_klsp_real') and hasattr(load, '_klsp_real') and c.load_inline is load_inline\n"
        "build.install_hooks()\nassert not hasattr(c.load_inline._klsp_real, '_klsp_real')  # idempotent\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT), capture_output=True)


@needs_nvcc
def test_own_nvcc_fallback_when_toolchain_is_absent(cache, monkeypatch):
    monkeypatch.setattr(build, "_toolchain_build", lambda *a, **k: None)
    src = ADD1.replace("1.0f", "5.0f")
    lib, ok = build.load_cuda(src, "/tmp/fallback.cu", {"arch": "sm_90"})
    assert ok.ok and lib is not None and "-shared" in ok.command, ok.log
    _, hit = build.load_cuda(src, "/tmp/fallback.cu", {"arch": "sm_90"})
    assert hit.cached
    _, bad = build.load_cuda(src.replace("5.0f;", "5.0f"), "/tmp/fallback.cu", {"arch": "sm_90"})
    assert not bad.ok
    err = [d for d in bad.diagnostics if d.severity == "error"][0]
    assert err.path == "/tmp/fallback.cu" and err.span.start_line in (3, 4)  # #line maps to the user's file


TWO_EXTENSIONS = '''
from torch.utils.cpp_extension import load_inline
cpp = """
#include <torch/extension.h>
torch::Tensor {f}(torch::Tensor x) {{ return x * {k}; }}
"""
# Names and sources of their own: torch skips a build whose module this process already loaded.
ext_a = load_inline(name="at_once_a", cpp_sources=[cpp.format(f="twice_at_once", k=2)], functions=["twice_at_once"],
                    verbose=True)  # verbose is no part of the cache key
ext_b = load_inline(name="at_once_b", cpp_sources=[cpp.format(f="thrice_at_once", k=3)], functions=["thrice_at_once"])
thrice = ext_b.thrice_at_once  # used at import: waits for that build only
'''


def load_at_once(src, filename):
    """load_python with the fast path on (extensions built at once); (module, result, records)."""
    build.configure_fast_inline(True)
    try:
        with build.capture() as records:
            m, result = build.load_python(src, filename)
    finally:
        build.configure_fast_inline(None)
    return m, result, records


@pytest.mark.slow
def test_a_module_builds_its_extensions_at_once_and_they_are_cached_by_content_across_processes(cache):
    """Two real C++ extensions asked for one after the other at import build side by side: each
    build's time span (its main.cpp written, its .so written) overlaps the other's; the module
    ends with the real extension modules in its globals, and calls work. The same two builds
    (30-60 s here: one pair serves both checks) are then cache hits by content, in this process
    and in another."""
    pytest.importorskip("torch")
    import types

    import torch

    m, result, records = load_at_once(TWO_EXTENSIONS, "/tmp/two.py")
    assert result.ok and not result.cached, result.log
    # They ran in the engine's build pool, idle now: run.evaluate does not take its threads for
    # threads the candidate left running (tests/engine/test_build_threads.py).
    for _ in range(100):
        if build.idle_own_threads():
            break
        time.sleep(0.01)
    assert build.idle_own_threads() and all(t.name.startswith("klsp-ext-build") for t in build.idle_own_threads())
    assert len(records) == 2 and not any(r.cached for r in records)
    assert isinstance(m.ext_a, types.ModuleType) and isinstance(m.ext_b, types.ModuleType)
    assert torch.equal(m.ext_a.twice_at_once(torch.ones(2)), torch.full((2,), 2.0))
    assert torch.equal(m.thrice(torch.ones(2)), torch.full((2,), 3.0))
    dirs = sorted(p for p in (cache / "ext").iterdir() if p.is_dir())
    assert [d.name[:len("at_once_a_")] for d in dirs] == ["at_once_a_", "at_once_b_"]  # one per content hash
    spans = []
    for d in dirs:
        so = next(d.glob("*.so"))
        spans.append(((d / "main.cpp").stat().st_mtime, so.stat().st_mtime))
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 < a1, f"the second build started {b0 - a1:.1f} s after the first ended"
    # Cached: no stand-ins, loaded at once.
    with no_process_started():
        m2, again = build.load_python(TWO_EXTENSIONS, "/tmp/two.py")
    assert again.ok and again.cached and isinstance(m2.ext_a, types.ModuleType)
    assert torch.equal(m2.ext_a.twice_at_once(torch.ones(3)), torch.full((3,), 2.0))
    # A fresh process (another session) loads them from the cache too. The extensions' own records
    # are timed: importing cpp_extension itself is a per-process cost, not the build's.
    code = (
        "import json, torch\nfrom kernel_lsp.engine.worker.build import build\n"
        "with build.capture() as records:\n"
        f"    m, r = build.load_python({TWO_EXTENSIONS!r}, '/tmp/two.py')\n"
        "print(json.dumps({'ok': r.ok, 'cached': [r.cached] + [x.cached for x in records],"
        " 'seconds': [x.seconds for x in records], 'value': m.ext_a.twice_at_once(torch.ones(2)).tolist()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "KERNEL_LSP_CACHE": str(cache)}, cwd=str(ROOT))
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["ok"] and data["cached"] == [True, True, True] and max(data["seconds"]) < 0.1, data
    assert data["value"] == [2.0, 2.0]


def test_a_failed_deferred_build_points_at_its_line(cache, monkeypatch):
    """Of two extensions built at once, the one that fails is reported on its own load_inline
    line, with the compiler's diagnostics; the good one is still built and recorded."""
    def fake_load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                         build_directory=None, verbose=False, is_python_module=True):
        if "bad" in name:
            raise RuntimeError(f"Error building extension '{name}':\n{build_directory}/main.cpp:2:1: "
                               "error: 'nope' was not declared in this scope\n")
        return type(sys)(name)

    module = type(sys)("fake_cpp_extension2")
    module.load_inline = build._wrap(fake_load_inline, "inline")
    monkeypatch.setitem(sys.modules, "fake_cpp_extension2", module)
    src = ("import fake_cpp_extension2 as c\n"
           "good = c.load_inline(name='good', cpp_sources=['x'], functions=['f'])\n"
           "bad = c.load_inline(name='bad', cpp_sources=['y'], functions=['f'])\n")
    m, result, records = load_at_once(src, "/tmp/deferred_bad.py")
    assert m is None and not result.ok
    assert sorted(r.ok for r in records) == [False, True]
    assert any("nope" in d.message and d.source == "nvcc" for d in result.diagnostics)
    call = result.diagnostics[-1]
    assert call.source == "python" and call.span.start_line == 2 and "extension build failed" in call.message
