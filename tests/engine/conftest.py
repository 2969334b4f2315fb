"""Fixtures shared by the engine tests: the fast-build ones (test_inline_split.py, test_binding.py,
test_fastbuild_load.py) and the GPU turn's (test_gpu_lock.py, test_gpu_turns.py, test_turn_need.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


@pytest.fixture(scope="session")
def pch_cache(tmp_path_factory):
    """One folder of precompiled torch headers for the session (each takes a minute or two on
    2 cores), so that every fast-build test pays for them once."""
    return tmp_path_factory.mktemp("klsp-pch")


@pytest.fixture
def fast_inline_on_cpu(tmp_path, monkeypatch):
    """Turns the fast path on or off for one test, in a fresh build cache (a CPU build of torch:
    on a GPU the full build runs for a minute; test_inline_split_gpu.py covers it there)."""
    import torch

    from kernel_lsp.engine.worker.build import build

    if torch.cuda.is_available():
        pytest.skip("on a GPU the full build runs for a minute; test_inline_split_gpu.py covers it there")
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_fast_inline", None)  # restored after the test
    return build.configure_fast_inline


@pytest.fixture
def lock_dir(request, tmp_path, monkeypatch):
    """A lock folder of the test's own for the machine-wide GPU turn. The turn's quantum
    (gpu_lock.MIN_TURN_S) is off for the CPU tests of the hand-over's mechanics, whose holders hand
    over a moment after they take the turn; test_turn_quantum.py tests the quantum, and the
    gpu-marked tests run with it as users do."""
    monkeypatch.setenv("KERNEL_LSP_GPU_LOCK_DIR", str(tmp_path / "locks"))
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("KERNEL_LSP_GPU_MIN_TURN_S", "0")
    return tmp_path / "locks"


@pytest.fixture
def cpu_link(tmp_path, monkeypatch, pch_cache):
    """A fresh build cache, the session's precompiled headers, and torch's link list for this CPU
    build (its CUDA libraries are not there; the CUDA runtime comes from the toolkit)."""
    import torch

    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_cache))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("KERNEL_LSP_LEAN_LINK", "0")
    from kernel_lsp.engine.worker.build import fastbuild

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    cudart = os.path.join(fastbuild._cuda_home(NVCC), "lib64")
    cpu = dataclasses.replace(fastbuild.torch_flags(NVCC), ldflags=(
        f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python", f"-L{cudart}", "-lcudart"))
    monkeypatch.setattr(fastbuild, "torch_flags", lambda nvcc: cpu)
    return tmp_path, {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{cudart}"}


def run_in_extension(env: dict, name: str, so: str, body: str) -> str:
    """``body`` run in a fresh Python with the extension at ``so`` imported as ``m`` (its stdout)."""
    import subprocess
    import sys

    code = ("import importlib.machinery, importlib.util, sys, torch\n"
            "spec = importlib.util.spec_from_loader(sys.argv[1], importlib.machinery.ExtensionFileLoader(*sys.argv[1:3]))\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n" + body)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code, name, so], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
