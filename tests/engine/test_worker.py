"""The Worker process on its own: the JSON-lines protocol over real pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lsp.engine import protocol
from kernel_lsp.engine.caller.client import worker_environment

ROOT = Path(__file__).resolve().parents[2]


def start(preload: str | None = "") -> subprocess.Popen:
    # preload "": skip importing bench (and torch) so these protocol tests start fast.
    extra = {"KERNEL_LSP_WORKER_TEST_OPS": "tests.engine.worker_ops"}
    if preload is not None:
        extra["KERNEL_LSP_WORKER_PRELOAD"] = preload
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernel_lsp.engine.worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=worker_environment(extra=extra), cwd=str(ROOT),
    )
    ready = json.loads(proc.stdout.readline())
    assert ready["id"] is None and ready["ready"]["pid"] == proc.pid
    return proc


@pytest.fixture
def worker():
    proc = start()
    yield proc
    proc.kill()
    proc.wait()


def test_default_worker_preloads_bench_and_warms():
    pytest.importorskip("torch")
    proc = start(preload=None)
    try:
        ping = call(proc, 1, "ping")["result"]
        assert ping["preloaded"] == ["kernel_lsp.engine.worker.timing.bench"] and ping["torch_imported"]
        warm = call(proc, 2, "warm")["result"]
        assert warm["torch"] and warm["cuda"] in (True, False) and warm["seconds"] >= 0
        info = call(proc, 3, "device_info")["result"]
        assert isinstance(info, dict) and info
    finally:
        proc.kill()
        proc.wait()


def call(proc: subprocess.Popen, req_id: int, op: str, params: dict | None = None) -> dict:
    proc.stdin.write(protocol.encode(protocol.request(req_id, op, params)))
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def test_round_trip_and_unknown_op(worker):
    ping = call(worker, 1, "ping")["result"]
    assert ping["pid"] == worker.pid and ping["preloaded"] == [] and not ping["torch_imported"]
    assert call(worker, 2, "echo", {"x": [1, 2, {"y": "z"}], "print": "p"})["result"]["x"] == [1, 2, {"y": "z"}]
    answer = call(worker, 3, "no_such_op")
    assert answer["id"] == 3 and answer["error"]["type"] == "UnknownOp"


def test_stdout_noise_never_reaches_the_protocol(worker):
    # print, a raw write to fd 1, and a C printf through libc: all must go to stderr.
    source = (
        "import ctypes, os, sys\n"
        "print('{\"id\": 99, \"result\": \"forged\"}')\n"
        "os.write(1, b'raw\\n')\n"
        "ctypes.CDLL(None).printf(b'from C printf\\n')\n"
        "ctypes.CDLL(None).fflush(None)\n"
        "def main():\n    print('more noise'); return 42\n"
    )
    answer = call(worker, 1, "run_python", {"source": source, "filename": "noisy.py", "call": "main"})
    assert answer == {"id": 1, "result": answer["result"], "fatal": False}
    assert answer["result"]["value"] == 42 and answer["result"]["compile"]["ok"] is True
    assert call(worker, 2, "ping")["id"] == 2
    worker.stdin.close()
    assert worker.wait(timeout=10) == 0  # EOF on its input: the Worker exits cleanly
    err = worker.stderr.read().decode()
    assert "forged" in err and "raw" in err and "from C printf" in err and "more noise" in err


def test_candidate_cannot_read_the_request_stream(worker):
    source = "import sys, os\ndef main():\n    return [sys.stdin.read(), os.read(0, 100).decode()]\n"
    answer = call(worker, 1, "run_python", {"source": source, "filename": "reader.py", "call": "main"})
    assert answer["result"]["value"] == ["", ""]  # /dev/null, not the protocol
    assert call(worker, 2, "ping")["result"]["requests"] == 2


def test_exception_in_op_is_an_error_answer_and_worker_lives(worker):
    answer = call(worker, 1, "raise", {"type": "MemoryError", "message": "boom"})
    assert answer["error"]["type"] == "MemoryError" and "boom" in answer["error"]["traceback"]
    assert protocol.is_oom_error(answer["error"])
    assert call(worker, 2, "ping")["id"] == 2


def test_sticky_cuda_error_marks_the_answer_fatal(worker):
    answer = call(worker, 1, "raise", {"type": "RuntimeError",
                                       "message": "CUDA error: an illegal memory access was encountered"})
    assert answer["fatal"] is True
    assert worker.wait(timeout=10) == 0  # it exits after answering


def test_protocol_helpers():
    assert protocol.classify_death(-11, "")[0] == "crashed"
    assert "SIGSEGV" in protocol.classify_death(-11, "")[1]
    assert protocol.classify_death(1, "torch.OutOfMemoryError: CUDA out of memory")[0] == "oom"
    verdict, message = protocol.classify_death(-6, "CUDA error: an illegal memory access was encountered")
    assert verdict == "crashed" and message.startswith("illegal memory access")
    assert "status 3" in protocol.describe_exit(3)
    assert protocol.is_sticky_cuda_error("CUDA error: an illegal instruction was encountered")
    assert not protocol.is_illegal_access("CUDA error: an illegal instruction was encountered")
    with pytest.raises(ValueError):
        protocol.decode(b"[1, 2]")


def test_worker_imports_no_lsp_packages():
    code = (
        "import sys, kernel_lsp.engine.worker, kernel_lsp.engine.worker.build.build\n"
        "bad = [m for m in ('pygls', 'lsprotocol', 'tree_sitter', 'openai', 'rich') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(ROOT), env={**os.environ})
