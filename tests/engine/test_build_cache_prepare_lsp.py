"""The precompiled torch headers are made in the background as the server starts (a build-pool
Worker, real g++ and torch here), under a work-done progress, and a build started meanwhile waits
for them instead of making them again.

Named to run first among the fast-build tests: the headers it makes (the session's `pch_cache`)
then serve test_fastbuild_load.py, test_inline_split.py and test_unit_cache.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.lsp_client import EditorClient, config, wait_for

pytest.importorskip("torch")
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
ROOT = Path(__file__).resolve().parents[2]
TITLE = "preparing the CUDA build cache, once per torch version"
from tests.needs import needs_nvcc  # noqa: E402

pytestmark = [pytest.mark.slow, needs_nvcc]

# A save's fast build, in its own process (what a Worker's load_inline hook runs): it needs the
# light headers, so it waits on their lock while the server's preparation makes them.
BUILD = textwrap.dedent("""
    import json, os, re, sys, time
    from pathlib import Path
    from kernel_lsp.engine.worker.build import fastbuild
    src = Path(sys.argv[1]).read_text()
    cuda = re.search(r'relu_cuda_source = r\"\"\"(.*?)\"\"\"', src, re.S).group(1)
    args = {"name": "relu_meanwhile", "cpp_sources": "torch::Tensor relu_cuda(torch::Tensor x);",
            "cuda_sources": cuda, "functions": ["relu_cuda"], "build_directory": sys.argv[2]}
    fb = fastbuild.build_inline(args, sys.argv[3], link=False)
    print(json.dumps({"reason": fb.reason, "steps": fb.steps, "pid": os.getpid(), "end": time.time()}))
""")


def made_markers(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in root.glob("*/made.json")]


@pytest.fixture
def fresh_headers(pch_cache):
    """The session's header folder without the light headers (made again here when an earlier test
    in this session made them first; in the usual order this test is the first)."""
    for gch in pch_cache.glob("*/klsp_torch.h.gch"):
        gch.unlink()
    for made in pch_cache.glob("*/made.json"):
        made.unlink()
    return pch_cache


async def test_the_server_prepares_the_headers_with_progress_and_a_build_meanwhile_waits(tmp_path, fresh_headers):
    env = {**os.environ, "KERNEL_LSP_CACHE": str(tmp_path / "cache"), "KERNEL_LSP_PCH_CACHE": str(fresh_headers),
           "KERNEL_LSP_PREPARE_BUILDS": "1", "TORCH_CUDA_ARCH_LIST": "9.0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    lsp: EditorClient = await config(env=env).start()  # a real server, in this test's caches
    try:
        await lsp.initialize_session(types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"), root_uri=tmp_path.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=tmp_path.as_uri(), name="ws")]))

        def begin() -> str | None:
            for token, values in lsp.progress_reports.items():
                if any(getattr(v, "kind", "") == "begin" and getattr(v, "title", "") == TITLE for v in values):
                    return token
            return None

        token = await wait_for(begin, timeout=120, what="the preparation's progress to begin")
        started = time.time()
        build = subprocess.Popen([sys.executable, "-c", BUILD, str(ROOT / "benchmarks/tasks/relu_new.py"),
                                  str(tmp_path / "meanwhile"), NVCC],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        end = await wait_for(lambda: next((v for v in lsp.progress_reports[token] if getattr(v, "kind", "") == "end"),
                                          None), timeout=600, interval=0.5, what="the preparation to end")
        assert end.message.startswith("ready in "), end.message
        begun = next(v for v in lsp.progress_reports[token] if getattr(v, "kind", "") == "begin")
        assert "precompiled headers" in (begun.message or "")
        out, err = await asyncio.to_thread(build.communicate, timeout=600)
        assert build.returncode == 0, err[-3000:]
        meanwhile = json.loads(out.strip().splitlines()[-1])
    finally:
        await lsp.shutdown_session()
        await lsp.stop()
    # the build waited for the headers and used them: its units compiled, none of them made by it
    assert meanwhile["reason"] == "", meanwhile
    assert not [s for s in meanwhile["steps"] if s.startswith("pch") and s != "pch_wait"], meanwhile
    assert meanwhile["steps"].get("pch_wait", 0) > 0, meanwhile  # and its steps say how long it waited
    markers = made_markers(fresh_headers)
    assert len(markers) == 2 and {m["pid"] for m in markers} != {meanwhile["pid"]}
    assert len({m["pid"] for m in markers}) == 1          # both made by the one preparing Worker
    assert all(m["at"] >= started - 120 for m in markers)  # during this test, not earlier
    assert meanwhile["end"] >= max(m["at"] for m in markers)


# A new KernelBench-style file: its module code leaves a mark if it ever runs.
NEW_FILE = textwrap.dedent('''
    import torch
    from torch.utils.cpp_extension import load_inline

    open(__file__ + ".ran", "w").write("ran")

    cuda = r"""
    #include <torch/extension.h>
    torch::Tensor blend(torch::Tensor a, torch::Tensor b, double w, int64_t k, bool flip) { return a * w + b; }
    """
    ext = load_inline(name="blend", cpp_sources="torch::Tensor blend(torch::Tensor a, torch::Tensor b, double w, "
                      "int64_t k, bool flip);", cuda_sources=cuda, functions=["blend"])
''')


def prebuilt_objects(cache: Path) -> list[dict]:
    return [m for m in (json.loads(p.read_text()) for p in cache.glob("units/*/meta.json"))
            if m.get("name") == "klsp_prebuilt" and m.get("by") != "tokens"]  # not its copy by tokens


async def test_a_new_load_inline_file_gets_its_main_cpp_compiled_when_opened_without_running_it(tmp_path, pch_cache):
    """Opened, never saved: the server has the build pool compile the main.cpp the file's build
    needs (the table binding's: the calls are read from its syntax tree), and the file's first
    build then takes that object."""
    cache = tmp_path / "cache"
    env = {**os.environ, "KERNEL_LSP_CACHE": str(cache), "KERNEL_LSP_PCH_CACHE": str(pch_cache),
           "KERNEL_LSP_PREPARE_BUILDS": "0", "TORCH_CUDA_ARCH_LIST": "9.0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    lsp: EditorClient = await config(env=env).start()
    path = tmp_path / "blend.py"
    try:
        await lsp.initialize_session(types.InitializeParams(
            capabilities=client_capabilities("neovim"), root_uri=tmp_path.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=tmp_path.as_uri(), name="ws")],
            initialization_options={"onSave": ["compile", "verify", "bench"]}))
        path.write_text(NEW_FILE)
        lsp.text_document_did_open(types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(
            uri=path.as_uri(), language_id="python", version=1, text=NEW_FILE)))
        made = await wait_for(lambda: prebuilt_objects(cache), timeout=300, interval=0.5,
                              what="the opened file's main.cpp compiled ahead")
    finally:
        await lsp.shutdown_session()
        await lsp.stop()
    assert len(made) == 1 and made[0]["seconds"] > 0
    assert not Path(str(path) + ".ran").exists()  # read, not run
    # The file's first build (what a save's Worker runs): main.cpp from the cache.
    args = {"name": "blend_first", "cpp_sources": "torch::Tensor blend(torch::Tensor a, torch::Tensor b, double w, "
            "int64_t k, bool flip);", "cuda_sources": "torch::Tensor blend(torch::Tensor a, torch::Tensor b, double w, "
            "int64_t k, bool flip) { return a * w + b; }\n__global__ void blend_unused_kernel() {}\n", "functions": ["blend"],
            "build_directory": str(tmp_path / "first")}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys
        from kernel_lsp.engine.worker.build import fastbuild
        fb = fastbuild.build_inline(json.loads(sys.argv[1]), sys.argv[2], link=False)
        print(json.dumps({"reason": fb.reason, "binding": fb.binding, "reused": fb.reused, "compiled": fb.compiled}))
        """), json.dumps(args), NVCC], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first["reason"] == "" and first["binding"] == "by table", first
    assert "main" in first["reused"] and "main" not in first["compiled"], first
