"""A Worker process seen from the caller: its environment, its command line (sandboxed
here, in one place, for every executor), its pipes and its death.

``Engine`` (client.py), the ``BuildPool`` (pool.py) and any other executor start Workers
through ``WorkerProcess``; none of them builds a Worker's command line itself.

The Worker's environment is an allowlist minus anything that looks secret, so an
``OPENAI_API_KEY`` in the server's environment never reaches candidate code. Standard
library only (no torch): this runs in the server and the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from kernel_lsp.engine import protocol
from kernel_lsp.engine.caller import sandbox as sandboxing
from kernel_lsp.model import CompileResult, Diagnostic, Span

log = logging.getLogger(__name__)

ENV_ALLOW_EXACT = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "TEMP", "TMP",
    "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHASHSEED", "XDG_CACHE_HOME", "CC", "CXX", "CPATH",
    "LIBRARY_PATH", "MAX_JOBS", "VIRTUAL_ENV", "CONDA_PREFIX", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
})
ENV_ALLOW_PREFIX = ("LC_", "CUDA_", "NVIDIA_", "NVCC_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_",
                    "KERNEL_LSP_", "NCCL_", "CUBLAS_", "CUDNN_")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE", "AUTH")
STDERR_TAIL_BYTES = 64 * 1024
LINE_LIMIT = 256 * 1024 * 1024  # an Evaluation with a profile can be large


# One torch.compile thread per Worker unless the user sets TORCHINDUCTOR_COMPILE_THREADS. Inductor's
# default is a pool of min(32, CPUs) subprocesses, each importing torch and Triton, started by a
# process's first torch.compile: 16 per Worker on the device's 16 cores, 96 for six benches at
# once, which then took 11.7-12.9 s to start their Workers and up to 9.6 s to compile a baseline
# that compiles in 3.2 s alone (H100, 2026-12-05, benchmarks/results/gpu_runs/2026-12-05d). A
# Worker compiles one small module at a time, and its first compile runs in-process anyway (the
# pool is not ready yet). Recording max-autotune's kernels (worker/inductor_code.py), whose GEMM
# precompile uses these threads, asks for more.
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"
WORKER_COMPILE_THREADS = "1"


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def worker_environment(
    device: int | str | None = None,
    extra: dict[str, str] | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The allowlisted environment a Worker gets (``extra`` is filtered the same way)."""
    source = dict(os.environ if base is None else base)
    env = {
        k: v for k, v in source.items()
        if (k in ENV_ALLOW_EXACT or k.startswith(ENV_ALLOW_PREFIX)) and not looks_secret(k)
    }
    for k, v in (extra or {}).items():
        if not looks_secret(k):
            env[k] = v
    # The Worker must import this kernel_lsp even under another interpreter.
    root = str(Path(__file__).resolve().parents[3])  # the folder holding kernel_lsp
    parts = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["PYTHONUNBUFFERED"] = "1"
    if COMPILE_THREADS_ENV not in env:
        env[COMPILE_THREADS_ENV] = WORKER_COMPILE_THREADS
        env[protocol.COMPILE_THREADS_CHOSEN_ENV] = "1"
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(device)
    return env


def default_python() -> str:
    return os.environ.get("KERNEL_LSP_PYTHON") or sys.executable


class WorkerDied(Exception):
    def __init__(self, returncode: int | None, stderr_tail: str) -> None:
        super().__init__(protocol.describe_exit(returncode))
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class WorkerRaised(Exception):
    """The op raised inside the Worker; the Worker itself is alive unless ``fatal``."""

    def __init__(self, error: dict[str, Any], fatal: bool) -> None:
        super().__init__(f"{error.get('type')}: {error.get('message')}")
        self.error = error
        self.fatal = fatal


class EngineTimeout(Exception):
    def __init__(self, message: str, fence: str | None = None) -> None:
        super().__init__(message)
        self.fence = fence  # the sandbox limit the Worker ran into, when one shows


class WorkerProcess:
    """One Worker subprocess in its own process group, with its stderr tail.

    ``sandbox``: the ``sandbox`` setting (``"required" | "auto" | "off"``) or a
    ``sandboxing.Sandbox``; resolved at ``start`` (``required`` without a sandbox raises
    ``sandboxing.SandboxUnavailable`` there). ``self.sandbox`` is what the Worker runs in."""

    def __init__(self, python: str, env: dict[str, str], cwd: str | None = None,
                 stderr_limit: int = STDERR_TAIL_BYTES, *,
                 sandbox: "str | sandboxing.Sandbox | None" = "auto") -> None:
        self.python = python
        self.env = env
        self.cwd = cwd
        self.stderr_limit = stderr_limit
        self.sandbox_mode = sandbox
        self.sandbox: "sandboxing.Sandbox | None" = None
        self.sandbox_pid: int | None = None   # the sandbox's first process (host pid), for its limits
        self.fences: dict[str, str] = {}       # how each limit is enforced, for docs and reports
        self.sandbox_ms: dict[str, float] = {}  # spawn -> sandbox ready ("setup"), pid cap ("pid_limit")
        self._t_spawn = 0.0
        self.proc: asyncio.subprocess.Process | None = None
        self.ready: dict[str, Any] = {}
        self._stderr = bytearray()
        self._stderr_task: asyncio.Task[None] | None = None
        self._next_id = 0
        self.warm: dict[str, Any] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def stderr_tail(self, limit: int | None = None) -> str:
        data = bytes(self._stderr[-(limit or self.stderr_limit):])
        return data.decode("utf-8", "replace")

    @property
    def sandboxed(self) -> bool:
        return self.sandbox is not None and self.proc is not None

    def command(self) -> tuple[list[str], dict[str, str], int | None]:
        """(argv, env, info fd to pass): the one place a Worker's command line is built."""
        argv = [self.python, "-m", "kernel_lsp.engine.worker"]
        self.sandbox = sandboxing.resolve(self.sandbox_mode)
        if self.sandbox is None:
            return argv, self.env, None
        if shutil.which(self.python) is None:  # bwrap would start and fail less clearly
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.python)
        rfd, wfd = os.pipe()
        try:
            launch = sandboxing.wrap(argv, self.env, self.cwd, self.sandbox, info_fd=wfd)
        except BaseException:
            os.close(rfd)
            os.close(wfd)
            raise
        self._info_read = rfd
        return launch.argv, launch.env, wfd

    async def start(self, timeout: float) -> dict[str, Any]:
        argv, env, info_fd = self.command()
        self._t_spawn = time.perf_counter()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=env, cwd=self.cwd, start_new_session=True, limit=LINE_LIMIT,
                pass_fds=(info_fd,) if info_fd is not None else (),
            )
        except BaseException:
            if info_fd is not None:
                os.close(self._info_read)
            raise
        finally:
            if info_fd is not None:
                os.close(info_fd)
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        try:
            if info_fd is not None:
                await asyncio.wait_for(self._fence_processes(), timeout)
            message = await asyncio.wait_for(self._read_message(), timeout)
        except asyncio.TimeoutError:
            self._abandon()
            raise EngineTimeout(f"the Worker did not start within {timeout:.0f} s") from None
        except WorkerDied as exc:
            self._abandon()
            failed = [ln for ln in exc.stderr_tail.splitlines() if ln.startswith("bwrap:")]
            if self.sandbox is not None and failed:
                # Nothing ran and it is not the candidate's fault: the Engine reports "not_run".
                raise OSError(f"the sandbox could not start: {failed[-1]}") from None
            raise
        except BaseException:  # cancelled mid-start (an early build given up), or a bug
            self._abandon()
            raise
        self.ready = message.get("ready") or {}
        return self.ready

    def _abandon(self) -> None:
        """A start that failed or was cancelled: nobody will reap this Worker, so kill it and
        let go of its pipes now. Left to the garbage collector after the event loop closed, the
        transport prints "Exception ignored ... Event loop is closed" on the user's terminal."""
        self.kill()
        if self._stderr_task is not None:
            self._stderr_task.cancel()
        transport = getattr(self.proc, "_transport", None) if self.proc is not None else None
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()

    async def _fence_processes(self) -> None:
        """Cap the pids in the sandbox's pid namespace before any candidate code runs (the
        Worker answers nothing before its ready line, and gets no request before this)."""
        rfd = self._info_read
        try:
            data = await asyncio.to_thread(_read_to_eof, rfd)
        finally:
            os.close(rfd)
        self.sandbox_ms["setup"] = (time.perf_counter() - self._t_spawn) * 1000.0
        try:
            self.sandbox_pid = int(json.loads(data or b"{}").get("child-pid"))
        except (ValueError, TypeError):
            # bwrap failed before the sandbox existed: nothing ran, and it is not the candidate's
            # fault (an OSError: the Engine reports "not_run").
            assert self.proc is not None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 5.0)
            if self._stderr_task is not None:
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(asyncio.shield(self._stderr_task), 1.0)
            tail = self.stderr_tail().strip().splitlines()
            raise OSError(f"the sandbox could not start: {tail[-1] if tail else 'bwrap exited early'}")
        assert self.sandbox is not None
        limit = self.sandbox.limits.processes
        cmd = sandboxing.pid_limit_command(self.sandbox_pid, limit)
        ok = False
        if cmd is not None:
            try:
                done = await asyncio.to_thread(subprocess.run, cmd, stdin=subprocess.DEVNULL,
                                               capture_output=True, text=True, timeout=10)
                ok = done.returncode == 0
                if not ok:
                    log.debug("pid_max in the sandbox: %s", done.stderr.strip())
            except (OSError, subprocess.SubprocessError):
                log.debug("nsenter failed", exc_info=True)
        self.sandbox_ms["pid_limit"] = (time.perf_counter() - self._t_spawn) * 1000.0 - self.sandbox_ms["setup"]
        if ok:
            self.fences["processes"] = f"pid namespace limit ({limit})"
        elif os.geteuid() != 0:
            self.fences["processes"] = f"RLIMIT_NPROC ({limit})"
        else:
            self.fences["processes"] = "none (root, and this kernel has no per-namespace pid_max)"

    def fence_report(self) -> str | None:
        """From outside: the sandbox fence a hung or dead Worker ran into, if one shows."""
        if self.sandbox is None or self.sandbox_pid is None:
            return None
        n = sandboxing.count_processes(self.sandbox_pid)
        limit = self.sandbox.limits.processes
        if n is not None and n >= 0.8 * limit:
            return f"the candidate exceeded the process limit ({limit})"
        return None

    def exit_status(self) -> int | None:
        """The Worker's own exit status: bwrap reports a signal death as 128 + signal."""
        rc = self.proc.returncode if self.proc else None
        if rc is not None and self.sandbox is not None and 128 < rc < 128 + 65:
            return -(rc - 128)
        return rc

    async def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            chunk = await self.proc.stderr.read(65536)
            if not chunk:
                return
            self._stderr += chunk
            if len(self._stderr) > 2 * self.stderr_limit:
                del self._stderr[: len(self._stderr) - self.stderr_limit]

    async def _read_message(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise await self._death()
        return protocol.decode(line)

    async def _death(self) -> WorkerDied:
        assert self.proc is not None
        try:
            await asyncio.wait_for(self.proc.wait(), 5.0)
        except asyncio.TimeoutError:
            self.kill()
        if self._stderr_task is not None:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self._stderr_task), 1.0)
        return WorkerDied(self.exit_status(), self.stderr_tail())

    async def call(self, op: str, params: dict[str, Any] | None = None,
                   on_partial: "PartialCallback | None" = None,
                   on_turn: "TurnCallback | None" = None) -> tuple[Any, bool]:
        """(result, fatal). Raises WorkerRaised, WorkerDied. `on_partial(kind, data)`: the
        request's partial results (protocol.partial), as they come, before the answer.
        `on_turn(data)`: awaited at each turn point (protocol.YIELD_TURNS) before the Worker is
        told to go on; what it raises ends the call (the caller then ends the Worker)."""
        if not self.alive or self.proc is None or self.proc.stdin is None:
            raise WorkerDied(self.exit_status(), self.stderr_tail())
        self._next_id += 1
        req_id = self._next_id
        try:
            self.proc.stdin.write(protocol.encode(protocol.request(req_id, op, params)))
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise await self._death() from None
        while True:
            message = await self._read_message()
            if message.get("id") == req_id:
                break
            if protocol.is_partial(message) and message.get("request") == req_id:
                if message.get("kind") == protocol.PARTIAL_TURN_POINT:
                    await self.turn_point(message["partial"], on_turn)
                    continue
                await deliver_partial(on_partial, message)
                continue
            # An answer to an older, abandoned request cannot happen (we kill on abandon); skip it.
        fatal = bool(message.get("fatal"))
        if "error" in message:
            raise WorkerRaised(message["error"], fatal)
        return message.get("result"), fatal

    async def turn_point(self, data: dict[str, Any], on_turn: "TurnCallback | None") -> None:
        """The Worker waits at a turn point: `on_turn(data, release)` first (the GPU handed
        over and back; `release()` asks the Worker to free its cached GPU memory before), then
        its continue line. A turn point nobody asked for is answered at once."""
        turn = data.get("turn")
        if on_turn is not None:
            await on_turn(data, lambda: self.send_line(protocol.release(turn)))
        await self.send_line(protocol.resume(turn))

    async def send_line(self, message: dict[str, Any]) -> None:
        """A line on the Worker's input in the middle of a request (turn points only)."""
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(protocol.encode(message))
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise await self._death() from None

    def kill(self) -> None:
        """SIGKILL the whole process group now (synchronous: safe inside cancellation)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    async def reap(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 10.0)
        if self._stderr_task is not None:
            self._stderr_task.cancel()
            with contextlib.suppress(BaseException):
                await self._stderr_task
        # Close the pipes now: a transport left to the garbage collector after its loop
        # closed raises "Event loop is closed" (a fork bomb's children can hold them open).
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()

    async def close(self, grace: float = 2.0) -> None:
        if self.alive:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.call("shutdown"), grace)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace)  # type: ignore[union-attr]
        self.kill()
        await self.reap()


# on_partial(kind, data): called (and awaited when it returns an awaitable) with each partial
# result of a request (protocol.partial); what it raises is logged, never the request's fault.
PartialCallback = Callable[[str, dict[str, Any]], Any]
# on_turn(data, release): awaited at a turn point (protocol.PARTIAL_TURN_POINT's data: stage,
# turn) before the Worker is told to go on: where the caller hands the GPU over and takes it
# back. `release()` (awaitable): the Worker frees its cached GPU memory (before a hand-over).
TurnCallback = Callable[[dict[str, Any], Callable[[], Awaitable[None]]], Awaitable[Any]]


async def deliver_partial(on_partial: "PartialCallback | None", message: dict[str, Any]) -> None:
    if on_partial is None:
        return
    try:
        got = on_partial(str(message.get("kind") or ""), message["partial"])
        if inspect.isawaitable(got):
            await got
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - a display callback must not fail the evaluation
        log.warning("a partial result's callback failed", exc_info=True)


def _read_to_eof(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def compile_failure(message: str, path: str | None = None) -> CompileResult:
    return CompileResult(ok=False, log=message, diagnostics=[
        Diagnostic(Span(0, 0, 0, 1), "error", message, source="kernel-lsp", path=path)])
