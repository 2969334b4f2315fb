"""A build failure is a `compile_error` with the compiler's first error and its line wherever it
happens (the candidate's import, `ModelNew.__init__`, the first `forward`), and a machine that
cannot build CUDA at all says so with exit 2 (issue 20, items 7 and 9).

Real nvcc on the CPU: the fast build compiles the CUDA text with nvcc before torch's own
build is tried (on a CPU build of torch that one cannot run; on a GPU machine it says the same).
The precompiled torch header is built once per session (a minute on 2 cores)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernel_lsp.engine.worker.build import build, build_failure  # noqa: E402
from kernel_lsp.engine.worker import run  # noqa: E402
from kernel_lsp.model import Candidate, CompileResult, Diagnostic, Span, Task  # noqa: E402
from kernel_lsp.verdicts import NO_CUDA_TOOLKIT  # noqa: E402

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
from tests.needs import needs_nvcc  # noqa: E402  (fails, not skips, where nvcc is required)
ROOT = Path(__file__).resolve().parents[2]

REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 128)]


def get_init_inputs():
    return []
'''

# The missing ";" is reported by nvcc on the next line, the "}" (line 9 of every candidate below).
CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.f)
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
'''
BUILD = ('load_inline(name="{name}", cpp_sources="torch::Tensor relu_cuda(torch::Tensor x);", '
         'cuda_sources=cuda_source, functions=["relu_cuda"])')

AT_IMPORT = CUDA + f"\next = {BUILD.format(name='relu_at_import')}\n" + '''

class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_cuda(x)
'''
IN_INIT = CUDA + f'''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = {BUILD.format(name='relu_in_init')}

    def forward(self, x):
        return self.ext.relu_cuda(x)
'''
IN_FORWARD = CUDA + f'''

class ModelNew(nn.Module):
    def forward(self, x):
        if not hasattr(self, "ext"):
            self.ext = {BUILD.format(name='relu_in_forward')}
        return self.ext.relu_cuda(x)
'''
SWALLOWED = CUDA + f'''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        try:
            self.ext = {BUILD.format(name='relu_swallowed')}
        except Exception:
            self.ext = None

    def forward(self, x):
        return torch.relu(x) if self.ext is None else self.ext.relu_cuda(x)
'''


@pytest.fixture
def cache(tmp_path, monkeypatch, pch_cache):
    if torch.cuda.is_available():
        pytest.skip("a CPU build of torch: on a GPU torch's own build runs (test_gpu_edges.py)")
    monkeypatch.setenv("KERNEL_LSP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KERNEL_LSP_PCH_CACHE", str(pch_cache))
    monkeypatch.setattr(build, "_fast_inline", None)
    return tmp_path


def evaluate(source: str, tmp_path: Path):
    ref = tmp_path / "relu.py"
    ref.write_text(REFERENCE)
    task = Task(name="relu", reference_path=str(ref), reference_source=REFERENCE)
    return run.evaluate(task, Candidate(source=source, kind="python"), ["compile", "verify"],
                        {"device": "cpu", "baselines": False, "arch": "sm_90"}, build)


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("source", [AT_IMPORT, IN_INIT, IN_FORWARD], ids=["import", "init", "forward"])
def test_a_build_failure_anywhere_is_a_compile_error_with_the_line(cache, source):
    ev = evaluate(source, cache)
    assert ev.verdict == "compile_error" and ev.correct is False, ev.message
    assert ev.message == 'does not build: line 9 (cuda.cu:8 as compiled): error: expected a ";"', ev.message
    assert source.splitlines()[8] == "}"
    assert ev.compile is not None and not ev.compile.ok
    assert ev.evidence["build_error"]["line"] == 9 and ev.evidence["build_error"]["compiled_line"] == 8
    assert "BuildError" not in ev.message


@needs_nvcc
@pytest.mark.slow
def test_a_same_file_candidate_that_does_not_build_is_a_compile_error(cache):
    # Model and ModelNew in one file: the build fails while the harness loads the reference,
    # and it is still the candidate's code that does not build (not a broken harness, exit 2).
    source = IN_INIT + "\n\n" + REFERENCE.split("import torch.nn as nn\n", 1)[1]
    ref = cache / "both.py"
    ref.write_text(source)
    task = Task(name="both", reference_path=str(ref), reference_source=source)
    ev = run.evaluate(task, Candidate(source=source, kind="python"), ["compile", "verify"],
                      {"device": "cpu", "baselines": False, "arch": "sm_90"}, build)
    assert ev.verdict == "compile_error", ev.message
    assert ev.message.startswith("does not build: line 9 (cuda.cu:8 as compiled)"), ev.message


@needs_nvcc
@pytest.mark.slow
def test_a_build_failure_the_candidate_catches_is_noted(cache):
    ev = evaluate(SWALLOWED, cache)
    assert ev.verdict == "correct", ev.message  # it fell back to torch.relu, which is right
    notes = ev.evidence["notes"]
    assert any("went on without it" in n and "line 9" in n for n in notes), notes


def test_the_toolkit_messages_are_told_from_compiler_errors():
    missing = CompileResult(ok=False, diagnostics=[Diagnostic(Span(0, 0, 0, 1), "error",
                            "CUDA_HOME environment variable is not set. Please set it to your CUDA install root.")],
                            log="CUDA_HOME environment variable is not set.")
    assert build_failure.first_error(missing) is None
    assert build_failure.no_toolkit(missing.log)
    for text in ("/bin/sh: 1: /opt/none/bin/nvcc: not found", "[Errno 2] No such file or directory: 'nvcc'",
                 "nvcc was not found ($CUDA_HOME/bin, PATH, /usr/local/cuda/bin)"):
        assert build_failure.no_toolkit(text), text
    real = 'cuda.cu(8): error: expected a ";"'
    assert not build_failure.no_toolkit(real)
    assert build_failure.cannot_build_here(missing)
    # torch's ninja build with a CUDA_HOME that holds no nvcc: its last line is no compiler error.
    ninja = CompileResult(ok=False, log="FAILED: cuda.cuda.o\n/bin/sh: 1: /opt/none/bin/nvcc: not found\n"
                          "ninja: build stopped: subcommand failed.", diagnostics=[Diagnostic(
                              Span(0, 0, 0, 1), "error", "ninja: build stopped: subcommand failed.")])
    assert build_failure.cannot_build_here(ninja)
    # The fast build's nvcc saw the code's own error before torch's build could not run: the code's.
    missing.fallback_reason = f"fast device unit failed to compile: /tmp/x/cuda.cu(8): error: expected a \";\""
    first = build_failure.first_error(missing)
    assert first is not None and first.span.start_line == 7 and first.message == 'expected a ";"'
    assert not build_failure.cannot_build_here(missing)


def _without_cuda_env(tmp_path: Path) -> dict[str, str]:
    empty = tmp_path / "no-cuda"
    (empty / "bin").mkdir(parents=True)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not os.path.exists(os.path.join(p, "nvcc")))
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_PATH",)}
    env.update(PATH=path, CUDA_HOME=str(empty), KERNEL_LSP_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))
    return env


@pytest.mark.slow
def test_no_cuda_toolkit_is_cannot_run_here_exit_2(tmp_path):
    env = _without_cuda_env(tmp_path)
    assert shutil.which("nvcc", path=env["PATH"]) is None
    fixed = AT_IMPORT.replace("fmaxf(x[i], 0.f)\n", "fmaxf(x[i], 0.f);\n")  # the code is fine
    (tmp_path / "relu.py").write_text(REFERENCE)
    (tmp_path / "model_new.py").write_text('REFERENCE = "relu.py"\n' + fixed)
    proc = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "bench", "model_new.py", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    (target,) = json.loads(proc.stdout)["targets"]
    assert target["verdict"] == "not_run" and target["status"] == 2, target
    assert target["message"].startswith(NO_CUDA_TOOLKIT), target["message"]
    assert "nothing here is wrong with the kernel" in target["reason"]
    expected = "CPU-only build" if torch.version.cuda is None else "no CUDA toolkit (nvcc)"
    assert expected in target["message"] and "CUDA_HOME environment variable" not in target["message"]
