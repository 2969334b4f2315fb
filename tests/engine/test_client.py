"""Engine against a real Worker subprocess: faults become Evaluations, the Worker restarts."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from kernel_lsp.engine import Engine
from kernel_lsp.engine.caller.client import EngineTimeout, WorkerDied, looks_secret, worker_environment
from kernel_lsp.engine.caller.sandbox import Sandbox
from kernel_lsp.engine.caller.sandbox import status as sandbox_status
from kernel_lsp.model import Candidate, CompileResult, Task
from kernel_lsp.store import Store

# The stand-in run module, and no torch preload: these Workers start in a fraction of a second.
FAKE = {"KERNEL_LSP_RUN_MODULE": "tests.engine.fake_run", "KERNEL_LSP_WORKER_PRELOAD": "",
        "KERNEL_LSP_WORKER_TEST_OPS": "tests.engine.worker_ops"}
TASK = Task(name="toy", reference_path="toy.py", reference_source="# reference\n")


def writable(path) -> Sandbox | str:
    """The sandbox where one runs, with ``path`` writable (these candidates report through files)."""
    return Sandbox(writable=(str(path),)) if sandbox_status().available else "off"


def cand(body: str) -> Candidate:
    return Candidate(source="import os, sys, time, ctypes\n" + body, kind="python")


@pytest.fixture
async def engine():
    e = Engine(timeout=20.0, warm=False, env=FAKE)
    yield e
    await e.aclose()


async def test_evaluate_round_trip_keeps_the_worker_warm(engine):
    ev = await engine.evaluate(TASK, cand("def run():\n    print('noise on stdout')\n    return 7\n"))
    assert ev.verdict == "correct" and ev.message == "ran: 7" and ev.speedup_eager == 2.0
    pid = engine.worker_pid
    ev2 = await engine.evaluate(TASK, cand("def run():\n    return 8\n"))
    assert ev2.verdict == "correct" and engine.worker_pid == pid and engine.restarts == 0


@pytest.mark.parametrize("body, signal_name", [
    ("def run():\n    os.abort()\n", "SIGABRT"),
    ("def run():\n    ctypes.string_at(0)\n", "SIGSEGV"),
])
async def test_crash_is_an_evaluation_and_next_request_gets_a_fresh_worker(engine, body, signal_name):
    await engine.ping()
    first_pid = engine.worker_pid
    ev = await engine.evaluate(TASK, cand(body))
    assert ev.verdict == "crashed" and ev.correct is None
    assert signal_name in ev.message
    assert engine.worker_pid is None
    ok = await engine.evaluate(TASK, cand("def run():\n    return 1\n"))
    assert ok.verdict == "correct" and engine.worker_pid not in (None, first_pid)


async def test_crash_at_import_time_too(engine):
    ev = await engine.evaluate(TASK, cand("os._exit(9)\n"))
    assert ev.verdict == "crashed" and "status 9" in ev.message


@pytest.mark.parametrize("body", ["def run():\n    while True:\n        pass\n",
                                  "def run():\n    time.sleep(60)\n"])
async def test_hang_times_out_within_the_deadline(engine, body):
    await engine.ping()  # the deadline covers the request, not the Worker's start
    t0 = time.monotonic()
    ev = await engine.evaluate(TASK, cand(body), timeout=1.5)
    elapsed = time.monotonic() - t0
    assert ev.verdict == "timeout" and "1.5 s deadline" in ev.message
    assert 1.5 <= elapsed < 2.5
    assert (await engine.evaluate(TASK, cand("def run():\n    return 2\n"))).verdict == "correct"


async def test_memory_error_maps_to_oom(engine):
    ev = await engine.evaluate(TASK, cand("def run():\n    raise MemoryError('simulated')\n"))
    assert ev.verdict == "oom" and "simulated" in ev.message
    assert (await engine.evaluate(TASK, cand("def run():\n    return 3\n"))).verdict == "correct"


@pytest.mark.parametrize("error, named", [
    ("CUDA error: an illegal memory access was encountered", True),
    ("CUDA error: an illegal instruction was encountered", False),
])
async def test_sticky_cuda_error_restarts_the_worker(engine, error, named):
    body = f"def run():\n    raise RuntimeError({error!r})\n"
    await engine.ping()
    pid = engine.worker_pid
    ev = await engine.evaluate(TASK, cand(body))
    assert ev.verdict == "crashed" and ev.message.startswith("illegal memory access") == named
    assert error in ev.message
    assert engine.worker_pid is None
    ok = await engine.evaluate(TASK, cand("def run():\n    return 4\n"))
    assert ok.verdict == "correct" and engine.worker_pid != pid


async def test_compile_error_is_an_evaluation(engine):
    ev = await engine.evaluate(TASK, cand("def run(:\n"))
    assert ev.verdict == "compile_error"
    assert ev.compile is not None and not ev.compile.ok
    assert ev.compile.diagnostics[0].span.start_line == 1 and ev.compile.diagnostics[0].source == "python"


async def test_cancelling_the_caller_kills_the_worker_within_a_second(engine):
    await engine.ping()
    worker = engine._worker
    assert worker is not None
    job = asyncio.create_task(engine.evaluate(TASK, cand("def run():\n    time.sleep(60)\n")))
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    await asyncio.wait_for(worker.proc.wait(), 1.0)
    assert time.monotonic() - t0 < 1.0 and worker.proc.returncode is not None
    assert (await engine.evaluate(TASK, cand("def run():\n    return 5\n"))).verdict == "correct"


async def test_requests_are_serialized(tmp_path):
    engine = Engine(timeout=20.0, warm=False, env=FAKE, sandbox=writable(tmp_path))
    log = tmp_path / "log"
    body = (f"def run():\n    t0 = time.time(); time.sleep(0.4)\n"
            f"    open({str(log)!r}, 'a').write(f'{{t0}} {{time.time()}}\\n')\n")
    evs = await asyncio.gather(*(engine.evaluate(TASK, cand(body + f"# {i}\n")) for i in range(3)))
    assert [e.verdict for e in evs] == ["correct"] * 3
    await engine.aclose()
    spans = sorted(tuple(map(float, ln.split())) for ln in log.read_text().splitlines())
    assert len(spans) == 3
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))  # never overlapping


async def test_secrets_never_reach_the_worker(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    monkeypatch.setenv("KERNEL_LSP_API_TOKEN", "tok-test-secret")  # allowlisted prefix, secret name
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda")
    out = tmp_path / "env.json"
    body = (f"def run():\n    open({str(out)!r}, 'w').write(__import__('json').dumps("
            "[dict(os.environ), open('/proc/self/environ', 'rb').read().decode('utf-8', 'replace')]))\n")
    e = Engine(timeout=20.0, warm=False, device=3, env={**FAKE, "MY_SECRET": "x"}, sandbox=writable(tmp_path))
    try:
        assert (await e.evaluate(TASK, cand(body))).verdict == "correct"
    finally:
        await e.aclose()
    environ, raw = json.loads(out.read_text())
    assert "OPENAI_API_KEY" not in environ and "KERNEL_LSP_API_TOKEN" not in environ and "MY_SECRET" not in environ
    assert "sk-test-secret" not in raw and "tok-test-secret" not in raw
    assert environ["CUDA_HOME"] == "/usr/local/cuda" and environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_environment_allowlist_unit():
    env = worker_environment(base={"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "a", "GITHUB_TOKEN": "b",
                                   "DB_PASSWORD": "c", "TORCH_HOME": "/t", "RANDOM_VAR": "d"})
    assert env["PATH"] == "/bin" and env["TORCH_HOME"] == "/t"
    assert not {"AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "RANDOM_VAR"} & set(env)
    assert looks_secret("openai_api_key") and not looks_secret("CUDA_HOME")


def test_a_worker_compiles_on_one_thread_unless_the_user_says_otherwise(monkeypatch):
    """Inductor's default compile pool is a subprocess per CPU, each importing torch, started by a
    Worker's first torch.compile: six benches at once started 96 of them. One thread, unless the
    user set TORCHINDUCTOR_COMPILE_THREADS (then theirs, and the Worker knows it is theirs)."""
    from kernel_lsp.engine.worker.inductor_code import mode_threads, recording_options

    ours = worker_environment(base={"PATH": "/bin"})
    assert ours["TORCHINDUCTOR_COMPILE_THREADS"] == "1" and ours["KERNEL_LSP_COMPILE_THREADS_CHOSEN"] == "1"
    theirs = worker_environment(base={"PATH": "/bin", "TORCHINDUCTOR_COMPILE_THREADS": "8"})
    assert theirs["TORCHINDUCTOR_COMPILE_THREADS"] == "8" and "KERNEL_LSP_COMPILE_THREADS_CHOSEN" not in theirs
    via_engine = worker_environment(base={"PATH": "/bin"}, extra={"TORCHINDUCTOR_COMPILE_THREADS": "4"})
    assert via_engine["TORCHINDUCTOR_COMPILE_THREADS"] == "4"
    # Recording max-autotune's kernels (the no-LLM path) compiles its GEMM candidates on the CPUs.
    monkeypatch.setenv("KERNEL_LSP_COMPILE_THREADS_CHOSEN", "1")
    assert recording_options("max-autotune-no-cudagraphs", {"max_autotune": True})["compile_threads"] >= 1
    assert "compile_threads" not in recording_options("default", {})
    assert recording_options("default", {})["fx_graph_cache"] is False
    assert mode_threads("max-autotune")["compile_threads"] >= 1 and mode_threads("default") == {}
    monkeypatch.delenv("KERNEL_LSP_COMPILE_THREADS_CHOSEN")
    assert "compile_threads" not in recording_options("max-autotune-no-cudagraphs", {"max_autotune": True})
    assert mode_threads("max-autotune") == {}  # the user's TORCHINDUCTOR_COMPILE_THREADS stands


async def test_evaluations_are_recorded_in_the_store(tmp_path):
    store = Store(tmp_path)
    phases: list[str] = []
    e = Engine(store=store, timeout=20.0, warm=False, env=FAKE)
    try:
        good = cand("def run():\n    return 1\n")
        bad = cand("def run():\n    os.abort()\n")
        await e.evaluate(TASK, good, progress=phases.append)
        await e.evaluate(TASK, bad)
    finally:
        await e.aclose()
    evs = store.evaluations("toy")
    assert [ev.verdict for ev in evs] == ["crashed", "correct"]
    assert store.candidate(good.id).source == good.source and store.task("toy") == TASK
    assert phases[0] == "evaluating" and "starting worker" in phases and phases[-1] == "done"
    store.close()


async def test_request_level_errors_raise_for_non_evaluate_ops(engine):
    with pytest.raises(EngineTimeout):
        await engine.request("sleep", {"seconds": 5}, timeout=0.5)
    with pytest.raises(WorkerDied) as info:
        await engine.request("crash", {"how": "exit", "code": 4})
    assert info.value.returncode == 4
    assert (await engine.device_info())["name"] == "fake"


async def test_missing_interpreter_is_a_clear_error():
    e = Engine(python="/nonexistent/python", warm=False)
    with pytest.raises(FileNotFoundError):
        await e.ping()
    ev = await e.evaluate(TASK, cand("def run():\n    return 1\n"))
    assert ev.verdict == "not_run" and "/nonexistent/python" in ev.message
    await e.aclose()


async def test_python_from_environment(monkeypatch):
    import sys

    monkeypatch.setenv("KERNEL_LSP_PYTHON", sys.executable)
    e = Engine(warm=False)
    assert e.python == sys.executable
    await e.aclose()


@pytest.mark.slow
async def test_end_to_end_with_check_run_module_on_cpu(tmp_path):
    """Through CHECK's real kernel_lsp.engine.worker.run with a CPU-only task."""
    pytest.importorskip("kernel_lsp.engine.worker.run")
    ref = (
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
        "def get_inputs():\n    return [torch.randn(64, 64)]\n"
        "def get_init_inputs():\n    return []\n"
    )
    new = ref + "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x.clamp_min(0)\n"
    wrong = ref + "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x.abs()\n"
    task = Task(name="relu_cpu", reference_path=str(tmp_path / "relu.py"), reference_source=ref)
    store = Store(tmp_path)
    async with Engine(store=store, timeout=300.0) as e:
        good = await e.evaluate(task, Candidate(source=new, kind="python"), checks=("compile", "verify"))
        bad = await e.evaluate(task, Candidate(source=wrong, kind="python"), checks=("compile", "verify"))
    assert good.verdict == "correct" and good.correct, good.message
    assert bad.verdict == "mismatch" and bad.correct is False, bad.message
    assert good.compile is not None and good.compile.ok
    assert [ev.verdict for ev in store.evaluations("relu_cpu")] == ["mismatch", "correct"]


def test_worker_dies_with_its_client_process(tmp_path):
    """A client killed outright (no aclose) must not leave a Worker spinning on the GPU."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "client.py"
    script.write_text(
        "import asyncio, os, signal, sys\nfrom kernel_lsp.engine import Engine\n"
        f"FAKE = {FAKE!r}\n"
        "async def main():\n"
        "    e = Engine(warm=False, env=FAKE)\n"
        "    await e.ping()\n"
        "    print(e.worker_pid, flush=True)\n"
        "    asyncio.ensure_future(e.request('sleep', {'seconds': 60}))\n"
        "    await asyncio.sleep(0.3)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=str(root),
                         env={**os.environ, "PYTHONPATH": str(root)}, timeout=60)
    assert out.returncode == -signal.SIGKILL
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        try:  # an unreaped zombie counts as gone
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
                break
        except (OSError, IndexError):
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the Worker outlived its client")


async def test_extension_candidates_are_compiled_in_the_pool_first(engine):
    phases: list[str] = []
    source = cand("# builds with torch.utils.cpp_extension.load_inline\ndef run():\n    return 6\n")
    ev = await engine.evaluate(TASK, source, progress=phases.append)
    assert ev.verdict == "correct"
    assert phases.index("compiling") < phases.index("evaluating") and engine._pool is not None
    plain: list[str] = []
    await engine.evaluate(TASK, cand("def run():\n    return 7\n"), progress=plain.append)
    assert "compiling" not in plain


async def test_an_ask_right_after_a_cancelled_lone_prebuild_gets_a_build_of_its_own():
    """A save cancelled mid-build (its ask was the build's only one) ends that build; the next
    save of the same text, right after, starts a new build instead of joining the cancelled one
    (which would cancel that save's evaluation too)."""

    class SlowPool:
        def __init__(self) -> None:
            self.started = 0

        async def build(self, kind, source, filename, options, timeout=None, readable=None):
            self.started += 1
            await asyncio.sleep(0.2)
            return CompileResult(ok=True)

        async def aclose(self) -> None:
            pass

    engine = Engine(options={"arch": "sm_90"}, env=FAKE, sandbox="off")
    engine._pool = pool = SlowPool()  # type: ignore[assignment]
    source = cand("# builds with load_inline\n")
    try:
        first = asyncio.ensure_future(engine.prebuild(TASK, source))
        await asyncio.sleep(0.05)
        first.cancel()
        await asyncio.sleep(0)  # the lone ask is cancelled, and its build with it
        assert first.cancelled()
        again = await asyncio.wait_for(engine.prebuild(TASK, source), 10)
        assert again.ok and pool.started == 2
        assert engine._prebuilds == {}
    finally:
        await engine.aclose()
