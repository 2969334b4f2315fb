"""The kept Worker: a GPU Worker that outlives one `kernel-lsp bench` for a short idle time, so
that the next command on this machine (same user, same Worker launch configuration) reuses it
instead of paying the spawn, sandbox, ``import torch`` and CUDA init again (docs/baselines.md).

Two halves, both caller side (standard library only, no torch):

- the keeper (``python -m kernel_lsp.engine.caller.keeper CONFIG``): a small detached process
  (its own session, stdin/stdout on /dev/null, stderr to its log file) that owns ONE
  ``WorkerProcess`` (the same command line, sandbox, environment and pid fence as any Worker)
  and serves it on a Unix socket to one client connection at a time. Up to kept_workers() keepers
  of one configuration live at once, one per slot (its socket named by ``slot_key``), so commands
  started together each keep a Worker. It relays each request to
  ``WorkerProcess.call`` and the answer back; it exits, ending its Worker, after IDLE seconds
  without a client, when the Worker dies or answers ``fatal``, when a client leaves in the
  middle of a request, and on SIGTERM.
- ``KeptWorker``: what the Engine holds instead of a ``WorkerProcess`` (the same interface).
  ``start`` connects to the keeper of this configuration, or starts one; ``close`` detaches
  (the keeper and its Worker stay for the idle time); ``kill`` ends the keeper and its Worker
  for real (a timeout, a death, a fatal answer, a cancellation, a sandbox fence).

The socket's name is a hash of everything that defines the Worker: the interpreter, the whole
command line (the sandbox's binds included), its environment (names and values, hashed, never
written anywhere), the folder it runs in, the user, and the kernel-lsp version and source files:
a change to any of them starts another Worker. Socket, lock and log live in a private folder
(0700; the socket 0600), and the keeper answers only connections of its own user.

Wire format on the socket (JSON lines, protocol.encode/decode):
  client -> ``{"attach": {"idle": s}}``, then requests ``{"id", "op", "params"}``
  keeper -> ``{"keeper": {...}}`` or ``{"busy": why}``; then ``{"hello": {...}}`` once its
  Worker is ready (or ``{"failed": {...}}``); then per request ``{"id", "result", "fatal"}``,
  ``{"id", "error", "fatal"}`` or ``{"id", "died": {"returncode", "stderr_tail"}}``, each after
  the request's partial results (``protocol.partial``), relayed as they come. At a turn point
  (``protocol.YIELD_TURNS``) the client answers with the continue line (``protocol.resume``),
  after a ``protocol.release`` line when it hands the GPU over, on the socket; the keeper passes
  them to its Worker: the only things a client sends in the middle of a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kernel_lsp.engine import protocol
from kernel_lsp.engine.caller import sandbox as sandboxing
from kernel_lsp.engine.caller.process import (
    LINE_LIMIT,
    STDERR_TAIL_BYTES,
    EngineTimeout,
    PartialCallback,
    TurnCallback,
    WorkerDied,
    WorkerProcess,
    WorkerRaised,
    deliver_partial,
)

log = logging.getLogger(__name__)

KEEP_ENV = "KERNEL_LSP_KEEP_WORKER"      # seconds a CLI's GPU Worker stays; 0 turns keeping off
DIR_ENV = "KERNEL_LSP_KEEPER_DIR"        # where sockets and logs go (default below)
DEFAULT_IDLE_S = 120.0
KEPT_ENV = "KERNEL_LSP_KEPT_WORKERS"     # how many of one configuration may be kept at once
# Six: the commands started at once in the measure (benchmarks/first_bench.py --parallel 6),
# each finding a kept Worker of its own instead of starting one (2.7 s each on an H100 at six at
# once, 2026-12-06). An idle kept Worker holds its CUDA context on the GPU: 633 MiB on an H100
# (nvidia-smi, one kept Worker after benchmarks/editor_loop.py), so six hold under 4 GiB, for
# their idle time only.
DEFAULT_KEPT = 6
SPAWN_WAIT_S = 20.0                      # how long a new keeper may take to listen
LOG_LIMIT = 1024 * 1024
_SUN_PATH_MAX = 104                      # a Unix socket's path must fit sockaddr_un


class KeeperUnavailable(Exception):
    """No kept Worker for this command (busy with another command, or the keeper could not
    start): the Engine starts a fresh Worker instead, and says why."""


def keep_setting(flag: float | None) -> float:
    """Seconds the CLI's GPU Worker stays after the command: ``--keep-worker`` when given, else
    $KERNEL_LSP_KEEP_WORKER, else the default; 0 (or less) for no kept Worker."""
    if flag is not None:
        return max(0.0, float(flag))
    return max(0.0, _env_number(KEEP_ENV, float, DEFAULT_IDLE_S, "a number of seconds"))


def kept_workers() -> int:
    """How many kept Workers of one configuration may live at once: $KERNEL_LSP_KEPT_WORKERS
    (at least 1), else DEFAULT_KEPT. A command finds an idle one, else starts one in a free slot,
    else (all in use) starts a Worker that is not kept."""
    return max(1, _env_number(KEPT_ENV, int, DEFAULT_KEPT, "a whole number"))


def _env_number(name: str, parse: Any, default: Any, what: str) -> Any:
    """$name read by `parse`; the default when unset or unreadable (with a warning saying so)."""
    raw = os.environ.get(name, "").strip()
    if raw:
        try:
            return parse(raw)
        except ValueError:
            log.warning("%s=%r is not %s; using %s", name, raw, what, default)
    return default


class KeeperBusy(KeeperUnavailable):
    """That kept Worker serves another command now."""


class _NoKeeper(Exception):
    """Nobody listens on a slot's socket (and this client was not to start one there)."""


# -- where and under which name ---------------------------------------------------------------

def _private(folder: Path) -> Path:
    """``folder``, made if need be, owned by this user and closed to everyone else (0700)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(folder)
    if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.getuid():
        raise KeeperUnavailable(f"{folder} is not a folder of this user: no kept Worker")
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)
    return folder


def keeper_dir() -> Path:
    """$KERNEL_LSP_KEEPER_DIR, else $XDG_RUNTIME_DIR/kernel-lsp, else the cache root's keeper/
    ($KERNEL_LSP_CACHE, $XDG_CACHE_HOME/kernel-lsp or ~/.cache/kernel-lsp, as the build cache),
    else /tmp/kernel-lsp-UID where those paths are too long for a socket."""
    chosen = os.environ.get(DIR_ENV)
    if chosen:
        return _private(Path(chosen))
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        base = Path(runtime) / "kernel-lsp"
    else:
        cache = os.environ.get("KERNEL_LSP_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kernel-lsp")
        base = Path(cache) / "keeper"
    if len(str(base)) + 40 > _SUN_PATH_MAX:
        base = Path("/tmp") / f"kernel-lsp-{os.getuid()}"
    return _private(base)


@functools.cache
def source_stamp() -> str:
    """The kernel-lsp version and its source files (names, sizes, times): a changed file means
    another Worker, never an old one that runs old code."""
    import kernel_lsp

    root = Path(kernel_lsp.__file__).resolve().parent
    h = hashlib.sha256(str(getattr(kernel_lsp, "__version__", "?")).encode())
    for path in sorted(root.rglob("*.py")):
        with contextlib.suppress(OSError):
            st = path.stat()
            h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def sandbox_to_json(sandbox: "sandboxing.Sandbox | None") -> Any:
    return None if sandbox is None else dataclasses.asdict(sandbox)


def sandbox_from_json(data: Any) -> "sandboxing.Sandbox | str":
    if not data:
        return "off"
    return sandboxing.Sandbox(readable=tuple(data.get("readable") or ()), writable=tuple(data.get("writable") or ()),
                              limits=sandboxing.Limits(**(data.get("limits") or {})))


def worker_key(python: str, env: dict[str, str], cwd: str | None, sandbox: "sandboxing.Sandbox | None") -> str:
    """The hash that names a kept Worker: everything its launch depends on."""
    argv = [python, "-m", "kernel_lsp.engine.worker"]
    launch_env = env
    if sandbox is not None:
        launch = sandboxing.wrap(argv, env, cwd, sandbox)  # the full bwrap line, binds included
        argv, launch_env = launch.argv, launch.env
    doc = {"python": python, "keeper_python": sys.executable, "argv": argv, "env": sorted(launch_env.items()),
           "cwd": os.path.abspath(cwd) if cwd else os.getcwd(), "uid": os.getuid(), "source": source_stamp()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def slot_key(key: str, slot: int) -> str:
    """The name of the `slot`th kept Worker of a configuration (slot 0: the configuration's key)."""
    return key if slot == 0 else f"{key}-{slot}"


def paths_for(key: str, folder: Path | None = None) -> dict[str, Path]:
    folder = folder or keeper_dir()
    return {"socket": folder / f"w-{key}.sock", "lock": folder / f"w-{key}.lock", "log": folder / f"w-{key}.log"}


def _gone(pid: int | None) -> bool:
    """True when ``pid`` no longer runs (a zombie counts as gone)."""
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


# -- the client: what the Engine holds ----------------------------------------------------------

class KeptWorker:
    """A ``WorkerProcess`` look-alike whose Worker lives in a keeper (module docstring)."""

    kept = True

    def __init__(self, python: str, env: dict[str, str], cwd: str | None = None,
                 stderr_limit: int = STDERR_TAIL_BYTES, *, sandbox: "str | sandboxing.Sandbox | None" = "auto",
                 idle: float = DEFAULT_IDLE_S) -> None:
        self.python = python
        self.env = env
        self.cwd = cwd
        self.stderr_limit = stderr_limit
        self.sandbox_mode = sandbox
        self.sandbox: "sandboxing.Sandbox | None" = None
        self.idle = idle
        self.key = ""
        self.paths: dict[str, Path] = {}
        self.keeper_pid: int | None = None
        self.worker_pid: int | None = None
        self.sandbox_pid: int | None = None
        self.fences: dict[str, str] = {}
        self.sandbox_ms: dict[str, float] = {}
        self.ready: dict[str, Any] = {}
        self.warm: dict[str, Any] | None = None
        self.reused = False          # the Worker served an earlier command
        self.idle_for: float | None = None  # how long it had waited for this one
        self.spawned = False         # this client started the keeper
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._dead = False
        self._returncode: int | None = None
        self._tail = ""
        self._next_id = 0

    # the WorkerProcess interface ----------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.worker_pid

    @property
    def alive(self) -> bool:
        return self._writer is not None and not self._dead and not _gone(self.keeper_pid)

    @property
    def sandboxed(self) -> bool:
        return self.sandbox is not None and self.worker_pid is not None

    def stderr_tail(self, limit: int | None = None) -> str:
        return self._tail[-(limit or self.stderr_limit):]

    def exit_status(self) -> int | None:
        return self._returncode

    def fence_report(self) -> str | None:
        if self.sandbox is None or self.sandbox_pid is None:
            return None
        n = sandboxing.count_processes(self.sandbox_pid)
        limit = self.sandbox.limits.processes
        if n is not None and n >= 0.8 * limit:
            return f"the candidate exceeded the process limit ({limit})"
        return None

    def describe(self) -> dict[str, Any]:
        """For `bench --json` and --timings: whether this Worker is kept and was reused."""
        return {"kept": True, "reused": self.reused, "idle_s": self.idle, "pid": self.worker_pid,
                "idle_for_s": None if self.idle_for is None else round(self.idle_for, 1)}

    async def start(self, timeout: float) -> dict[str, Any]:
        if self._writer is None:
            await self.attach(timeout)
        return await self.finish_start(timeout)

    async def attach(self, timeout: float) -> dict[str, Any]:
        """Take an idle kept Worker of this configuration, else start a keeper in the first free
        slot (kept_workers() of them). Raises KeeperUnavailable (all in use, or it could not
        start), SandboxUnavailable."""
        self.sandbox = sandboxing.resolve(self.sandbox_mode)
        base = worker_key(self.python, self.env, self.cwd, self.sandbox)
        slots = kept_workers()
        busy = KeeperBusy(f"all {slots} kept Workers are in use by other kernel-lsp commands "
                          f"(${KEPT_ENV} sets how many)")
        free: list[int] = []
        for slot in range(slots):  # an idle one first: it is warm
            try:
                return await self._take(slot_key(base, slot), timeout, spawn=False)
            except _NoKeeper:
                free.append(slot)
            except KeeperBusy as exc:
                busy = exc if slots == 1 else busy  # one slot: the keeper's own words
        for slot in free:  # else a new one (a keeper that cannot start ends the search)
            try:
                return await self._take(slot_key(base, slot), timeout, spawn=True)
            except KeeperBusy as exc:  # another command started one there first
                busy = exc if slots == 1 else busy
        raise busy

    async def _take(self, key: str, timeout: float, spawn: bool) -> dict[str, Any]:
        """Connect to the keeper named `key` (starting it when `spawn` and nobody listens) and
        take its Worker. Raises _NoKeeper (nobody listens, `spawn` False), KeeperUnavailable."""
        self.key = key
        try:
            self.paths = paths_for(self.key)
            reader, writer = await asyncio.wait_for(self._connect_or_spawn(timeout, spawn), timeout)
        except asyncio.TimeoutError:
            raise KeeperUnavailable(f"the keeper did not answer within {timeout:.0f} s") from None
        except OSError as exc:
            raise KeeperUnavailable(f"no kept Worker ({exc})") from None
        self._reader, self._writer = reader, writer
        try:
            writer.write(protocol.encode({"attach": {"idle": self.idle}}))
            await writer.drain()
            first = await asyncio.wait_for(self._line(), 10.0)
        except (OSError, asyncio.TimeoutError, ValueError, WorkerDied) as exc:
            self._detach()
            raise KeeperUnavailable(f"the keeper did not answer ({type(exc).__name__})") from None
        if "busy" in first:
            self._detach()
            raise KeeperBusy(str(first["busy"]))
        info = first.get("keeper") or {}
        self.keeper_pid = info.get("pid")
        self.worker_pid = info.get("worker_pid")
        self.reused = bool(info.get("reused"))
        self.idle_for = info.get("idle_for_s")
        return info

    async def finish_start(self, timeout: float) -> dict[str, Any]:
        """The keeper's hello: its Worker ready (started now, or kept from an earlier command)."""
        try:
            message = await asyncio.wait_for(self._line(), timeout + 15.0)
        except asyncio.TimeoutError:
            self.kill()
            raise EngineTimeout(f"the Worker did not start within {timeout:.0f} s") from None
        except WorkerDied:
            self.kill()
            raise
        if "failed" in message:
            self._dead = True
            self._detach()
            failed = message["failed"]
            self._returncode, self._tail = failed.get("returncode"), str(failed.get("stderr_tail") or "")
            kind = failed.get("kind")
            if kind == "died":
                raise WorkerDied(self._returncode, self._tail)
            if kind == "timeout":
                raise EngineTimeout(str(failed.get("message")))
            if kind == "sandbox":
                raise sandboxing.SandboxUnavailable(str(failed.get("message")))
            raise OSError(str(failed.get("message")))
        hello = message.get("hello") or {}
        self.worker_pid = hello.get("worker_pid")
        self.sandbox_pid = hello.get("sandbox_pid")
        self.fences = dict(hello.get("fences") or {})
        self.sandbox_ms = dict(hello.get("sandbox_ms") or {})
        self.ready = hello.get("ready") or {}
        self.warm = hello.get("warm")
        return self.ready

    async def call(self, op: str, params: dict[str, Any] | None = None,
                   on_partial: "PartialCallback | None" = None,
                   on_turn: "TurnCallback | None" = None) -> tuple[Any, bool]:
        """(result, fatal). Raises WorkerRaised, WorkerDied (as WorkerProcess.call); the
        request's partial results, relayed by the keeper, go to `on_partial` as they come; at a
        turn point `on_turn` is awaited, then the continue line goes to the keeper, which
        passes it to its Worker."""
        if not self.alive or self._writer is None:
            raise WorkerDied(self._returncode, self._tail)
        self._next_id += 1
        req_id = self._next_id
        try:
            self._writer.write(protocol.encode(protocol.request(req_id, op, params)))
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError):
            self._dead = True
            raise WorkerDied(self._returncode, self._tail + "\n(the kept Worker's keeper went away)") from None
        message = await self._line()
        while protocol.is_partial(message):
            if message.get("request") == req_id and message.get("kind") == protocol.PARTIAL_TURN_POINT:
                await self._turn_point(message["partial"], on_turn)
            elif message.get("request") == req_id:
                await deliver_partial(on_partial, message)
            message = await self._line()
        if "died" in message:
            died = message["died"] or {}
            self._dead = True
            self._returncode, self._tail = died.get("returncode"), str(died.get("stderr_tail") or "")
            raise WorkerDied(self._returncode, self._tail)
        fatal = bool(message.get("fatal"))
        if fatal:
            self._dead = True  # the keeper ends this Worker after its answer
        if "error" in message:
            raise WorkerRaised(message["error"], fatal)
        if op == "warm":
            self.warm = message.get("result")
        return message.get("result"), fatal

    async def _turn_point(self, data: dict[str, Any], on_turn: "TurnCallback | None") -> None:
        turn = data.get("turn")
        if on_turn is not None:
            await on_turn(data, lambda: self._send(protocol.release(turn)))
        await self._send(protocol.resume(turn))

    async def _send(self, message: dict[str, Any]) -> None:
        """A line to the keeper in the middle of a request (turn points only)."""
        assert self._writer is not None
        try:
            self._writer.write(protocol.encode(message))
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError):
            self._dead = True
            raise WorkerDied(self._returncode, self._tail + "\n(the kept Worker's keeper went away)") from None

    def kill(self) -> None:
        """End the keeper and its Worker now, for real (synchronous: safe inside cancellation)."""
        self._dead = True
        for pid in (self.worker_pid, self.keeper_pid):
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        self._detach()

    async def reap(self) -> None:
        self._detach()
        for pid in (self.keeper_pid, self.worker_pid) if self._dead else ():
            for _ in range(100):
                if _gone(pid):
                    break
                await asyncio.sleep(0.05)

    async def close(self, grace: float = 2.0) -> None:
        """Detach: the keeper keeps the Worker for its idle time (a dead one is ended)."""
        if self._dead:
            self.kill()
            await self.reap()
            return
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), grace)
        self._reader = self._writer = None

    # the connection ------------------------------------------------------------------------

    def _detach(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        self._reader = self._writer = None

    async def _line(self) -> dict[str, Any]:
        assert self._reader is not None
        try:
            line = await self._reader.readline()
        except (ConnectionResetError, asyncio.IncompleteReadError):
            line = b""
        if not line:
            self._dead = True
            raise WorkerDied(self._returncode, self._tail + "\n(the kept Worker's keeper went away)")
        return protocol.decode(line)

    async def _connect_or_spawn(self, timeout: float,
                                spawn: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = str(self.paths["socket"])
        if not spawn and not os.path.exists(sock):
            raise _NoKeeper(sock)  # no lock file made for a slot nobody uses
        lock_fd = os.open(self.paths["lock"], os.O_RDWR | os.O_CREAT, 0o600)
        try:
            await asyncio.to_thread(fcntl.flock, lock_fd, fcntl.LOCK_EX)
            try:
                return await asyncio.open_unix_connection(sock, limit=LINE_LIMIT)
            except (FileNotFoundError, ConnectionRefusedError):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(sock)  # a stale socket: nobody listens on it
            if not spawn:
                raise _NoKeeper(sock)
            self._spawn(timeout)
            self.spawned = True
            deadline = time.monotonic() + min(SPAWN_WAIT_S, timeout)
            while True:
                try:
                    return await asyncio.open_unix_connection(sock, limit=LINE_LIMIT)
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline:
                        raise KeeperUnavailable(f"the keeper did not start (see {self.paths['log']})") from None
                    await asyncio.sleep(0.02)
        finally:
            os.close(lock_fd)  # releases the lock

    def _spawn(self, timeout: float) -> None:
        """Start the keeper, detached (it forks again and leaves; its log is its stderr)."""
        logp = self.paths["log"]
        with contextlib.suppress(OSError):
            if logp.stat().st_size > LOG_LIMIT:
                logp.unlink()
        config = {"socket": str(self.paths["socket"]), "python": self.python, "cwd": self.cwd,
                  "sandbox": sandbox_to_json(self.sandbox), "idle": self.idle, "start_timeout": timeout,
                  "key": self.key}
        log_fd = os.open(logp, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Its environment is the Worker's (allowlisted, no secrets): nothing is written to disk.
            subprocess.run([sys.executable, "-m", "kernel_lsp.engine.caller.keeper", json.dumps(config)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_fd, env=self.env,
                           cwd=self.cwd, start_new_session=True, timeout=30, check=True)
        except (subprocess.SubprocessError, OSError) as exc:
            raise KeeperUnavailable(f"the keeper could not start: {exc}") from None
        finally:
            os.close(log_fd)


# -- the keeper process -------------------------------------------------------------------------

class Keeper:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.socket_path = config["socket"]
        self.idle = float(config.get("idle") or DEFAULT_IDLE_S)
        self.worker = WorkerProcess(config["python"], dict(os.environ), config.get("cwd"),
                                    sandbox=sandbox_from_json(config.get("sandbox")))
        self.busy = False
        self.served = 0
        self.last_client = time.monotonic()
        self.done = asyncio.Event()
        self._starting: asyncio.Task[Any] | None = None
        self._inode: int | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.done.set)
        server = await self._listen()
        if server is None:
            return
        self._starting = asyncio.create_task(self.worker.start(float(self.config.get("start_timeout") or 300.0)))
        watch = asyncio.create_task(self._watch())
        log.info("keeper %d serves %s (idle %g s)", os.getpid(), self.socket_path, self.idle)
        try:
            await self.done.wait()
        finally:
            watch.cancel()
            server.close()
            self._unlink()
            if not self._starting.done():
                self._starting.cancel()
                with contextlib.suppress(BaseException):
                    await self._starting
                self.worker.kill()
            await self.worker.close()
            log.info("keeper %d ends (served %d commands)", os.getpid(), self.served)

    async def _listen(self) -> asyncio.base_events.Server | None:
        path = self.socket_path
        if os.path.exists(path):
            try:
                _, w = await asyncio.open_unix_connection(path)
                w.close()
                log.info("another keeper listens on %s; leaving", path)
                return None
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        old = os.umask(0o177)  # the socket is born 0600
        try:
            server = await asyncio.start_unix_server(self._client, path=path, limit=LINE_LIMIT)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._inode = os.stat(path).st_ino
        return server

    def _unlink(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.socket_path).st_ino == self._inode:
                os.unlink(self.socket_path)

    async def _watch(self) -> None:
        """Idle time and the Worker's own death while nobody is attached."""
        while not self.done.is_set():
            await asyncio.sleep(0.2)
            if self.busy:
                continue
            if time.monotonic() - self.last_client > self.idle:
                log.info("idle for %g s: ending the Worker", self.idle)
                self.done.set()
            elif self._starting is not None and self._starting.done() and not self.worker.alive:
                log.info("the Worker died while idle: %s", self.worker.stderr_tail(2000))
                self.done.set()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
        except OSError:
            uid = -1
        if uid != os.getuid() or self.done.is_set():
            writer.close()
            return
        try:  # read it even from a client refused below: unread data would reset the connection
            attach = protocol.decode(await asyncio.wait_for(reader.readline(), 10.0)).get("attach") or {}
        except (asyncio.TimeoutError, ValueError, OSError):
            writer.close()
            return
        if self.busy or self.done.is_set():
            with contextlib.suppress(OSError):
                await self._send(writer, {"busy": "the kept Worker is in use by another kernel-lsp command"
                                          if self.busy else "the kept Worker is ending"})
            writer.close()
            return
        self.busy = True
        mid_request = False
        try:
            if attach.get("idle"):
                self.idle = float(attach["idle"])  # the newest command's setting
            idle_for = time.monotonic() - self.last_client
            await self._send(writer, {"keeper": {"pid": os.getpid(), "worker_pid": self.worker.pid,
                                                 "reused": self.served > 0, "idle_for_s": round(idle_for, 2),
                                                 "idle_s": self.idle}})
            if not await self._hello(writer):
                return
            self.served += 1
            while not self.done.is_set():
                line = await reader.readline()
                if not line:
                    return  # the client detached: keep the Worker
                message = protocol.decode(line)
                mid_request = True
                answer, end = await self._relay(reader, writer, message)
                if answer is None:  # the client left in the middle of a request
                    log.info("the client left during %s: ending the Worker", message.get("op"))
                    self.done.set()
                    return
                await self._send(writer, answer)
                mid_request = False
                if end:
                    self.done.set()
                    return
        except (OSError, ValueError) as exc:
            log.info("client connection failed: %s", exc)
            if mid_request:
                self.done.set()
        finally:
            self.busy = False
            self.last_client = time.monotonic()
            with contextlib.suppress(Exception):
                writer.close()

    async def _hello(self, writer: asyncio.StreamWriter) -> bool:
        assert self._starting is not None
        w = self.worker
        try:
            ready = await asyncio.shield(self._starting)
        except WorkerDied as exc:
            failed = {"kind": "died", "returncode": exc.returncode, "stderr_tail": exc.stderr_tail}
        except EngineTimeout as exc:
            failed = {"kind": "timeout", "message": str(exc), "stderr_tail": w.stderr_tail()}
        except sandboxing.SandboxUnavailable as exc:
            failed = {"kind": "sandbox", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - OSError and the like: nothing could run
            failed = {"kind": "os", "message": f"{exc}", "stderr_tail": w.stderr_tail()}
        else:
            if w.alive:
                await self._send(writer, {"hello": {
                    "ready": ready, "warm": w.warm, "worker_pid": w.pid, "sandbox_pid": w.sandbox_pid,
                    "fences": w.fences, "sandbox_ms": w.sandbox_ms}})
                return True
            failed = {"kind": "died", "returncode": w.exit_status(), "stderr_tail": w.stderr_tail()}
        await self._send(writer, {"failed": failed})
        self.done.set()
        return False

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     message: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        """(answer, end the keeper after it); answer None when the client left meanwhile. The
        request's partial results go to the client as they come (the client's own id)."""
        req_id, op = message.get("id"), str(message.get("op"))
        resumes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def relay_partial(kind: str, data: dict[str, Any]) -> None:
            writer.write(protocol.encode(protocol.partial(req_id, kind, data)))  # drained with the answer

        releases: list[Any] = []

        async def relay_turn(data: dict[str, Any], release: Any) -> None:
            """A turn point: the client decides (it may ask for the Worker's memory, then hand
            the GPU over); its continue line goes on to the Worker (WorkerProcess.turn_point
            writes it)."""
            releases[:] = [release]
            writer.write(protocol.encode(protocol.partial(req_id, protocol.PARTIAL_TURN_POINT, data)))
            await writer.drain()
            await resumes.get()
            releases.clear()

        async def client_lines() -> None:
            """Until the client leaves (EOF): it sends nothing before the answer but the lines of
            turn points (release, continue)."""
            while True:
                line = await reader.readline()
                if not line:
                    return
                try:
                    got = protocol.decode(line)
                except ValueError:
                    continue
                if protocol.is_resume(got):
                    resumes.put_nowait(got)
                elif protocol.is_release(got) and releases:
                    with contextlib.suppress(WorkerDied):  # the call itself reports a dead Worker
                        await releases[0]()

        call = asyncio.create_task(self.worker.call(op, message.get("params"), on_partial=relay_partial,
                                                    on_turn=relay_turn))
        gone = asyncio.create_task(client_lines())
        await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not call.done():
            call.cancel()
            with contextlib.suppress(BaseException):
                await call
            return None, True
        gone.cancel()
        with contextlib.suppress(BaseException):
            await gone
        try:
            result, fatal = call.result()
        except WorkerDied as exc:
            return {"id": req_id, "died": {"returncode": exc.returncode, "stderr_tail": exc.stderr_tail}}, True
        except WorkerRaised as exc:
            return {"id": req_id, "error": exc.error, "fatal": exc.fatal}, exc.fatal or not self.worker.alive
        if op == "warm":
            self.worker.warm = result
        return {"id": req_id, "result": result, "fatal": fatal}, fatal or op == "shutdown"

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
        writer.write(protocol.encode(message))
        await writer.drain()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    config = json.loads(args[0])
    # Detach for good: the command that started us waits only for this first process.
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s keeper[{os.getpid()}] %(message)s")
    try:
        asyncio.run(Keeper(config).run())
    except Exception:  # noqa: BLE001 - logged for whoever reads the log
        log.exception("the keeper failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
