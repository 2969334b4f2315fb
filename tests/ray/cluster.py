"""A real local Ray cluster on 127.0.0.1 for tests and benchmarks: a head and extra nodes,
each a `ray start --block` process that this module started and stops by its pid.

Ray 2.60 facts this relies on (checked on this machine):
- `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` keeps 127.0.0.1 as 127.0.0.1 (otherwise Ray swaps in
  the machine's interface address); with it, `ray start` refuses to add a worker node, so a
  worker node starts through `start_node.py`, which lifts only that refusal.
- `RAY_AUTH_MODE=token` with one `RAY_AUTH_TOKEN` for every node and the driver (a driver
  without it fails with InvalidAuthToken).
- A `--block` process ends its children on SIGTERM: stop by pid, never `ray stop` (which would
  stop every Ray on the machine, other people's included).
Every port is chosen free on 127.0.0.1, and the temp dir is private, so parallel runs do not meet.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def loopback_env(token: str) -> dict[str, str]:
    """The environment every node and the driver need. Ray reads the first setting when it is
    imported: set these before `import ray` (then check with `assert_loopback()`)."""
    return {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}


def assert_loopback() -> None:
    """Fail before any connection if this process's Ray would swap 127.0.0.1 for the machine's
    interface address (it was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set)."""
    import ray._private.ray_constants as constants

    if constants.ENABLE_RAY_CLUSTER:
        raise RuntimeError("ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: it would leave 127.0.0.1")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


_GIVEN: set[int] = set()


def free_port() -> int:
    """A free port on 127.0.0.1, never one this process handed out before (the kernel may offer
    a just-closed port again, and Ray refuses two components on one port)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid


class LocalCluster:
    def __init__(self, root: Path | None = None, token: str | None = None) -> None:
        # Short: Ray's unix socket paths must stay under 107 characters.
        self.root = Path(root or tempfile.mkdtemp(prefix="klray", dir="/tmp"))
        self.token = token or secrets.token_hex(16)
        self.port = free_port()
        self.client_port = free_port()   # Ray Client (ray://) on the head
        self.nodes: list[Node] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ray_env(self) -> dict[str, str]:
        return loopback_env(self.token)

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        env = {**os.environ, **self.ray_env(), **(extra or {})}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        return env

    def _start(self, name: str, args: list[str], env: dict[str, str] | None, resources: dict[str, float],
               timeout: float) -> Node:
        log = self.root / f"{name}.log"
        common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                  f"--object-store-memory={100 * 1024 * 1024}",
                  f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                  f"--metrics-export-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
                  f"--min-worker-port={0}", f"--max-worker-port={0}"]
        if resources:
            common.append("--resources=" + json.dumps(resources))
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(HERE / "start_node.py"), "start", *args, *common],
                                    stdout=out, stderr=subprocess.STDOUT, env=self._env(env),
                                    cwd=str(self.root), start_new_session=True)
        node = Node(name, proc, log, resources)
        self.nodes.append(node)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = log.read_text(errors="replace")
            if "Ray runtime started" in text:
                return node
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop_node(node)
        raise RuntimeError(f"ray node {name} did not start:\n{log.read_text(errors='replace')[-3000:]}")

    def start_head(self, num_cpus: int = 1, num_gpus: int = 0, resources: dict[str, float] | None = None,
                   env: dict[str, str] | None = None, timeout: float = 60.0) -> Node:
        args = ["--head", f"--port={self.port}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
                f"--temp-dir={self.root / 'ray'}", "--include-dashboard=false",
                f"--dashboard-port={free_port()}", f"--ray-client-server-port={self.client_port}",
                f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}"]
        return self._start("head", args, env, resources or {}, timeout)

    def add_node(self, name: str, num_cpus: int = 1, num_gpus: int = 0, resources: dict[str, float] | None = None,
                 env: dict[str, str] | None = None, timeout: float = 60.0) -> Node:
        args = [f"--address={self.address}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
                f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}"]
        return self._start(name, args, env, resources or {}, timeout)

    def stop_node(self, node: Node, timeout: float = 30.0) -> None:
        """SIGTERM the `ray start --block` process (it ends its raylet and workers); whatever of
        its process tree (ours: listed before the signal) is still there after `timeout` is
        SIGKILLed, as when a machine is lost."""
        if node.proc.poll() is None:
            tree = descendants(node.pid)
            node.proc.send_signal(signal.SIGTERM)
            try:
                node.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            for pid in [node.pid, *tree]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            node.proc.wait(10)
        if node in self.nodes:
            self.nodes.remove(node)

    def stop(self) -> None:
        for node in reversed(list(self.nodes)):
            self.stop_node(node)
        shutil.rmtree(self.root, ignore_errors=True)
