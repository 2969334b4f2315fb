"""Progress of long work: `window/workDoneProgress` (cancellable) where the client has it,
log messages where it does not."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from lsprotocol import types

log = logging.getLogger(__name__)


class WorkProgress:
    def __init__(self, ls, title: str, on_cancel: Callable[[], None] | None = None) -> None:
        self.ls = ls
        self.title = title
        self.on_cancel = on_cancel
        window = ls.client_capabilities.window
        self.supported = bool(window and window.work_done_progress)
        self.token = f"kernel-lsp-{uuid.uuid4().hex[:12]}"
        self._open = False

    async def begin(self, message: str = "") -> None:
        if not self.supported:
            self._log(f"{self.title}: {message}" if message else self.title)
            return
        try:
            await self.ls.work_done_progress.create_async(self.token)
        except Exception as exc:  # the client refused: fall back to log messages
            log.warning("work done progress refused: %s", exc)
            self.supported = False
            self._log(self.title)
            return
        self.ls.work_done_progress.begin(self.token, types.WorkDoneProgressBegin(
            title=self.title, message=message or None, cancellable=self.on_cancel is not None,
            percentage=0))
        self._open = True
        # window/workDoneProgress/cancel only cancels this future: act on it.
        future = self.ls.work_done_progress.tokens.get(self.token)
        if future is not None and self.on_cancel is not None:
            loop = asyncio.get_running_loop()
            future.add_done_callback(
                lambda f: loop.call_soon_threadsafe(self.on_cancel) if f.cancelled() else None)

    def report(self, message: str, percentage: int | None = None) -> None:
        if not self.supported:
            self._log(f"{self.title}: {message}")
            return
        if self._open:
            self.ls.work_done_progress.report(self.token, types.WorkDoneProgressReport(
                message=message, percentage=None if percentage is None else max(0, min(100, percentage))))

    def end(self, message: str) -> None:
        if not self.supported:
            self._log(f"{self.title}: {message}")
            return
        if self._open:
            self._open = False
            self.ls.work_done_progress.end(self.token, types.WorkDoneProgressEnd(message=message))
            self.ls.work_done_progress.tokens.pop(self.token, None)

    def _log(self, message: str) -> None:
        self.ls.window_log_message(types.LogMessageParams(type=types.MessageType.Info, message=message))
