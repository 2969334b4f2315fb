"""One exit-status rule for every command (0 good, 1 a problem or no improvement, 2 could
not run), said in --help, and what each command prints when it could not run: driven through
`kernel_lsp.cli.main` and, where a traceback could leak, a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lsp.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CHEATS = ROOT / "tests" / "engine" / "cheats"


def _gpu() -> bool:
    from tests.conftest import cuda_available

    return cuda_available()


no_gpu = pytest.mark.skipif("_gpu()", reason="checks what happens without a GPU")


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    for name in ("softmax.cu", "softmax.py", "layernorm.cu", "layernorm.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_LSP_MODEL", "KERNEL_LSP_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **(env or {})}
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_LSP_MODEL", "KERNEL_LSP_DEBUG"):
        if var not in (env or {}):
            full.pop(var, None)
    return subprocess.run([sys.executable, "-m", "kernel_lsp.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


# -- help -------------------------------------------------------------------------------

def test_help_states_the_rule(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "exit status:" in text and "0  did what was asked and found it good" in text
    assert "2  could not run" in text and "no model configured" in text
    for command in ("check", "bench", "profile", "optimize", "report", "serve"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        sub = capsys.readouterr().out
        assert "exit status:" in sub and f"kernel-lsp {command}: 0" in sub, command
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    assert "--kernels-only" in capsys.readouterr().out


def test_no_command_is_exit_2(capsys):
    assert main([]) == 2


# -- the top-level guard ----------------------------------------------------------------

def test_unexpected_error_is_one_line_and_exit_2(monkeypatch, capsys):
    import kernel_lsp.cli.check as check

    def boom(ns):
        raise RuntimeError("something odd")

    monkeypatch.setattr(check, "check_main", boom)
    monkeypatch.delenv("KERNEL_LSP_DEBUG", raising=False)
    assert main(["check", "x.cu"]) == 2
    err = capsys.readouterr().err
    assert "kernel-lsp check: RuntimeError: something odd" in err and "KERNEL_LSP_DEBUG=1" in err
    assert "Traceback" not in err
    monkeypatch.setenv("KERNEL_LSP_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["check", "x.cu"])


# -- check ------------------------------------------------------------------------------

def test_check_named_file_without_kernel(workspace, capsys):
    (workspace / "notask.py").write_text("x = 1\n")
    assert main(["check", "notask.py", "--verify", "no"]) == 2
    out = capsys.readouterr().out
    assert "notask.py: not checked: no CUDA kernel" in out
    assert "0 files checked: 0 errors, 0 warnings; 1 not checked (no kernel)" in out


def test_check_one_file_is_singular(workspace, capsys):
    assert main(["check", "softmax.cu", "--verify", "no"]) == 0
    assert "1 file checked: 0 errors, 0 warnings" in capsys.readouterr().out


def test_check_missing_file(workspace, capsys):
    assert main(["check", "nowhere.cu"]) == 2
    assert "no such file or folder: nowhere.cu" in capsys.readouterr().err


@no_gpu
@pytest.mark.slow
def test_check_verify_yes_without_gpu_counts_and_exit_agree(workspace, capsys):
    shutil.copy(EXAMPLES / "relu_scale_inline.py", workspace / "relu_scale_inline.py")
    rc = main(["check", ".", "--verify", "yes", "--json"])
    doc = json.loads(capsys.readouterr().out)
    # Nothing was wrong with the kernels; the correctness check could not run: exit 2, 0 errors.
    assert rc == 2 and doc["errors"] == 0 and doc["not_verified"] == 3
    assert all(f["not_verified"] for f in doc["files"])
    import torch

    if torch.version.cuda is None:  # the cause is a CPU-only torch, not CUDA_HOME
        assert "CPU-only build" in doc["hint"] and "CUDA_HOME" not in doc["hint"]
    rc = main(["check", ".", "--verify", "yes"])
    out = capsys.readouterr().out
    assert rc == 2 and "3 files checked: 0 errors, 0 warnings; 3 not verified" in out
    assert "error:" not in out  # nothing printed as an error when the count says 0


# -- bench and profile without a GPU ----------------------------------------------------

@no_gpu
def test_bench_cu_without_gpu_is_exit_2_with_reason(workspace, capsys):
    assert main(["bench", "softmax.cu"]) == 2
    out = capsys.readouterr().out
    assert "not run" in out and "needs a" in out
    assert main(["bench", "softmax.cu", "--json"]) == 2
    (target,) = json.loads(capsys.readouterr().out)["targets"]
    assert target["status"] == 2 and "needs a" in target["reason"]


@no_gpu
def test_profile_cu_without_gpu_is_exit_2(workspace, capsys):
    assert main(["profile", "layernorm.cu"]) == 2
    assert "not profiled" in capsys.readouterr().out


def test_bench_not_a_task_is_exit_2(workspace, capsys):
    (workspace / "plain.py").write_text("x = 1\n")
    assert main(["bench", "plain.py", "--json"]) == 2
    (target,) = json.loads(capsys.readouterr().out)["targets"]
    assert "not a Task" in target["reason"]
    assert main(["bench", "missing.py"]) == 2


# -- bad input: no traceback, exit 2 ----------------------------------------------------

@pytest.mark.parametrize("command", ["bench", "profile", "optimize", "check"])
def test_binary_cu_is_a_clear_exit_2(tmp_path, command):
    (tmp_path / "blob.cu").write_bytes(bytes(range(256)) * 8)
    shutil.copy(EXAMPLES / "softmax.py", tmp_path / "blob.py")
    args = [command, "blob.cu"] + (["--proposer", "tuner"] if command == "optimize" else [])
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "looks binary" in proc.stderr + proc.stdout


@pytest.mark.parametrize("command", ["bench", "profile", "optimize"])
def test_latin1_comment_is_read_as_check_reads_it(tmp_path, command):
    text = (EXAMPLES / "softmax.cu").read_bytes().replace(b"#include", "// caf\u00e9\n#include".encode("latin-1"), 1)
    (tmp_path / "softmax.cu").write_bytes(text)
    shutil.copy(EXAMPLES / "softmax.py", tmp_path / "softmax.py")
    args = [command, "softmax.cu"] + (["--proposer", "tuner", "--budget", "1"] if command == "optimize" else [])
    proc = run_cli(*args, cwd=tmp_path)
    assert "Traceback" not in proc.stderr + proc.stdout and "UnicodeDecodeError" not in proc.stderr
    if not _gpu():  # it got as far as the build: a .cu needs a GPU to run
        assert proc.returncode == 2 and "needs a" in proc.stdout + proc.stderr


def test_latin1_harness_is_exit_2_without_traceback(tmp_path):
    shutil.copy(EXAMPLES / "softmax.cu", tmp_path / "softmax.cu")
    (tmp_path / "softmax.py").write_bytes(b"# caf\xe9\n" + (EXAMPLES / "softmax.py").read_bytes())
    proc = run_cli("bench", "softmax.cu", cwd=tmp_path)
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.returncode == 2


# -- optimize ---------------------------------------------------------------------------

@no_gpu
def test_optimize_cu_without_gpu_is_exit_2_with_reason(workspace, capsys):
    assert main(["optimize", "softmax.cu", "--proposer", "tuner", "--budget", "2", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert "needs a" in doc["reason"] and doc["status"] == 2
    assert doc["failed_steps"] and any("needs a" in st["reason"] for st in doc["failed_steps"])
    for key in ("speedup_eager", "speedup_compile", "custom_kernel", "spread", "measurement"):
        assert key in doc
    assert main(["optimize", "softmax.cu", "--proposer", "tuner", "--budget", "2", "--out", "f.cu"]) == 2
    captured = capsys.readouterr()
    assert "could not run" in captured.out and "needs a" in captured.out + captured.err
    assert not (workspace / "f.cu").exists()


def test_optimize_llm_without_model_is_immediate(workspace, capsys):
    t0 = time.monotonic()
    assert main(["optimize", "softmax.py", "--proposer", "llm"]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < 10
    assert "no model configured" in err and "--model" in err and "KERNEL_LSP_MODEL" in err
    assert main(["optimize", "softmax.py", "--proposer", "llm", "--json"]) == 2
    assert "no model configured" in json.loads(capsys.readouterr().out)["reason"]


def test_optimize_model_without_endpoint_or_key(workspace, capsys):
    assert main(["optimize", "softmax.py", "--model", "gpt-x"]) == 2
    assert "has no endpoint" in capsys.readouterr().err


def test_optimize_unreachable_endpoint_is_exit_2(workspace, capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t0 = time.monotonic()
    rc = main(["optimize", "softmax.py", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1", "--json"])
    assert rc == 2 and time.monotonic() - t0 < 10
    assert "cannot reach the endpoint" in json.loads(capsys.readouterr().out)["reason"]


def test_optimize_missing_file_and_bad_target(workspace, capsys):
    assert main(["optimize", "missing.py"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["optimize", "softmax.cu:nope", "--proposer", "tuner"]) == 2
    assert "no Target named 'nope'" in capsys.readouterr().err


def test_optimize_no_harness_is_exit_2(tmp_path, monkeypatch, capsys):
    shutil.copy(EXAMPLES / "softmax.cu", tmp_path / "lonely.cu")
    monkeypatch.chdir(tmp_path)
    assert main(["optimize", "lonely.cu", "--proposer", "tuner"]) == 2
    assert "has no harness" in capsys.readouterr().err
