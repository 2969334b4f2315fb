"""The server's link to a Ray cluster (`executor = "ray"`, docs/ray.md).

Connecting (`ray.init`, starting one warm actor per GPU) takes seconds: it runs as a task on
the event loop whose blocking calls live in threads (ray_executor.py), under a timeout. While
it runs, an evaluation waits for it; when the cluster cannot be reached, or is lost later, the
local Engine runs the evaluations, the user is told once why, and the status notification
(`cluster`) says so until the cluster answers again. A changed setting reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

from lsprotocol import types

from kernel_lsp.engine.caller.executor import ray_connect_timeout

if TYPE_CHECKING:
    from kernel_lsp.server.engine_host import EngineHost

log = logging.getLogger(__name__)

# ray.init (a Ray Client connection starts a server process on the head and installs kernel_lsp
# there: tens of seconds on a busy head); a refused port fails at once (the executor probes first).
CONNECT_TIMEOUT = 45.0
RETRY_AFTER = 60.0       # an unreachable cluster is tried again by the next evaluation after this
CLOSE_TIMEOUT = 20.0


def connect_timeout() -> float:
    """CONNECT_TIMEOUT, or KERNEL_LSP_RAY_CONNECT_TIMEOUT (seconds) for a slow cluster."""
    return ray_connect_timeout(CONNECT_TIMEOUT)


def cluster_key(settings: Any) -> tuple[Any, ...] | None:
    """What a connection depends on; None: the local Executor is asked for."""
    if (getattr(settings, "executor", "local") or "local") != "ray" or not settings.execution_enabled:
        return None
    return (settings.ray_address or "auto", settings.gpu, settings.max_gpus, settings.timeout, settings.arch)


class ClusterLink:
    def __init__(self, host: "EngineHost") -> None:
        self.host = host
        self.key: tuple[Any, ...] | None = None
        self.executor_: Any = None            # the RayExecutor while one is open
        self.connecting: asyncio.Task[None] | None = None
        self.view: dict[str, Any] | None = None  # what `kernel-lsp/status` carries as `cluster`
        self.failed_at: float | None = None
        self.lost_at: float | None = None     # when the connected cluster stopped answering
        self._closing: set[asyncio.Task[Any]] = set()

    # -- what the editor sees ----------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        """{"executor": "ray", "state": "connecting" | "connected" | "lost" | "unreachable",
        "address", "gpus", "nodes", "message"}; None with the local Executor."""
        return dict(self.view) if self.view is not None else None

    def _set_view(self, view: dict[str, Any] | None) -> None:
        self.view = view
        self.host.ls.send_status()

    def _show(self, message: str, kind: types.MessageType) -> None:
        try:
            self.host.ls.show(f"kernel-lsp: {message}", kind)
        except Exception:  # no client (a bare server in tests)
            log.info("%s", message)

    # -- settings ------------------------------------------------------------------------------

    def settings_changed(self) -> None:
        """Connect, reconnect or disconnect when the settings that matter changed."""
        key = cluster_key(self.host.ls.settings)
        if key == self.key:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop (a bare server): connect on first use
            return
        self._switch(key)

    def _switch(self, key: tuple[Any, ...] | None) -> None:
        self.key = key
        old, self.executor_ = self.executor_, None
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
        self.connecting = None
        self.failed_at = self.lost_at = None
        closing = self._background(old.aclose()) if old is not None else None
        if key is None:
            if self.view is not None:
                self._set_view(None)
            return
        self.connecting = asyncio.get_running_loop().create_task(self._connect(key, closing))

    def _background(self, coro: Any) -> asyncio.Task[None]:
        async def bounded() -> None:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(coro, CLOSE_TIMEOUT)

        t = asyncio.get_running_loop().create_task(bounded())
        self._closing.add(t)
        t.add_done_callback(self._closing.discard)
        return t

    # -- connecting ----------------------------------------------------------------------------

    async def _connect(self, key: tuple[Any, ...], closing: asyncio.Task[None] | None = None) -> None:
        from kernel_lsp.engine.caller.executor_api import ExecutorUnavailable

        address, gpu, max_gpus, timeout, arch = key
        self._set_view({"executor": "ray", "state": "connecting", "address": address, "gpus": 0, "nodes": [],
                        "message": f"connecting to the Ray cluster at {address}"})
        if closing is not None:  # one Ray connection per process: the old one ends first
            await asyncio.shield(closing)
        if "://" not in address and address not in ("auto", "local"):
            # A host:port driver is a Ray worker process: Ray may end it when the head goes away.
            self._show(f"ray_address {address} makes this server part of the cluster; from an editor use "
                       f"the head's Ray Client port (ray://HOST:10001) so a lost head cannot stop the server",
                       types.MessageType.Info)
        from kernel_lsp.engine.caller.ray_executor import RayExecutor, _import_ray

        try:  # importing ray takes a second or more: not on the event loop
            await asyncio.to_thread(_import_ray)
        except ExecutorUnavailable as exc:  # Ray is not installed
            self._unreachable(address, str(exc))
            return
        ex: Any = None

        def on_status(status: dict[str, Any]) -> None:
            if ex is not None and ex is self.executor_:
                self._on_status(status)

        ex = RayExecutor(address, store=self.host.store(), gpu=gpu, max_gpus=max_gpus or None, timeout=timeout,
                         options={"arch": arch} if arch else None, on_status=on_status,
                         connect_timeout=connect_timeout())
        try:
            await ex.connect()
        except asyncio.CancelledError:  # the settings changed while connecting: nothing left behind
            self._background(ex.aclose())
            raise
        except ExecutorUnavailable as exc:
            self._unreachable(address, str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - whatever Ray raised: one sentence, local goes on
            log.exception("connecting to the Ray cluster at %s failed", address)
            self._background(ex.aclose())
            self._unreachable(address, f"cannot connect to the Ray cluster at {address}: {exc}")
            return
        if self.key != key:  # the settings changed meanwhile
            self._background(ex.aclose())
            return
        self.executor_ = ex
        self.failed_at = None
        self._set_view(ex.status())

    def _unreachable(self, address: str, why: str) -> None:
        self.failed_at = time.monotonic()
        self._set_view({"executor": "ray", "state": "unreachable", "address": address, "gpus": 0, "nodes": [],
                        "message": why})
        self._show(f"{why}; evaluations run on this machine instead (the cluster is tried again "
                   f"on the next evaluation after {RETRY_AFTER:.0f} s, or when the setting changes)",
                   types.MessageType.Warning)

    def _on_status(self, status: dict[str, Any]) -> None:
        before = (self.view or {}).get("state")
        state = status.get("state")
        if state == "closed":
            return
        self._set_view(status)
        address = status.get("address")
        self.lost_at = (self.lost_at or time.monotonic()) if state == "lost" else None
        if state == "lost" and before != "lost":
            self._show(f"{status.get('message') or f'the Ray cluster at {address} stopped answering'}; "
                       f"evaluations run on this machine until it answers again", types.MessageType.Warning)
        elif state == "connected" and before == "lost":
            self._show(f"the Ray cluster at {address} answers again: {status.get('message', '')}",
                       types.MessageType.Info)

    # -- use -----------------------------------------------------------------------------------

    async def executor(self, note: Callable[[str], Any] | None = None) -> Any:
        """The connected RayExecutor, or None (local Executor asked for, cluster unreachable or
        lost). A connection under way is awaited; an old failure is retried in the background."""
        key = cluster_key(self.host.ls.settings)
        if key != self.key or (key is not None and self.connecting is None and self.executor_ is None
                               and self.failed_at is None):
            self._switch(key)
        if key is None:
            return None
        if self.failed_at is not None and time.monotonic() - self.failed_at > RETRY_AFTER:
            self._switch(key)  # retried in the background: this evaluation runs locally
            return None
        if self.connecting is not None and not self.connecting.done():
            if note is not None:
                note(f"connecting to the Ray cluster at {key[0]}")
            connecting = self.connecting
            try:
                await asyncio.shield(connecting)
            except asyncio.CancelledError:
                if not connecting.cancelled():
                    raise  # this evaluation was cancelled, not the connection
        ex = self.executor_
        if ex is not None and getattr(ex, "state", None) == "connected":
            return ex
        if self.lost_at is not None and time.monotonic() - self.lost_at > RETRY_AFTER:
            self._switch(key)  # a connection that gave up does not come back: a new one, in the background
        return None

    async def aclose(self) -> None:
        if self.connecting is not None and not self.connecting.done():
            self.connecting.cancel()
            with contextlib.suppress(BaseException):
                await self.connecting
        ex, self.executor_ = self.executor_, None
        self.key = None
        if ex is not None:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(ex.aclose(), CLOSE_TIMEOUT)
        for t in list(self._closing):
            with contextlib.suppress(BaseException):
                await t
