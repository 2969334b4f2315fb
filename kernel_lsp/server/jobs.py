"""Background jobs of the server: one asyncio task per key, a newer one cancels the older.

Keys name what a job is about (("compile", uri), ("search", uri, target)), so a newer
save cancels an older compile of the same file, and `kernel-lsp.cancel` can name a job.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Hashable

log = logging.getLogger(__name__)


@dataclass
class Job:
    id: str
    key: Hashable
    title: str
    uri: str | None
    task: asyncio.Task[Any]
    message: str = ""
    best_speedup: float | None = None
    visible: bool = True  # shown in kernel-lsp/status and cancelled by a bare kernel-lsp.cancel
    reason: str | None = None  # why it ended without a result (said to the user)

    def status(self) -> dict[str, Any]:
        # bestSpeedup is the Search's progress, unconfirmed: editors drop it when the job ends
        # and show the document's confirmed measurement (status "documents") instead.
        return {"id": self.id, "title": self.title, "uri": self.uri, "message": self.message,
                "bestSpeedup": self.best_speedup, "unconfirmed": self.best_speedup is not None}


class Jobs:
    def __init__(self, on_change: Callable[[], None] | None = None) -> None:
        self._jobs: dict[Hashable, Job] = {}
        self._ids = itertools.count(1)
        self._on_change = on_change or (lambda: None)

    def start(self, key: Hashable, title: str, coro: Coroutine[Any, Any, Any],
              uri: str | None = None, visible: bool = True) -> Job:
        """Run `coro` as the job for `key`, cancelling the one running for it now."""
        old = self._jobs.pop(key, None)
        if old is not None and not old.task.done():
            old.task.cancel()
        task = asyncio.get_running_loop().create_task(coro)
        job = Job(id=f"job-{next(self._ids)}", key=key, title=title, uri=uri, task=task, visible=visible)
        self._jobs[key] = job
        task.add_done_callback(lambda t, j=job: self._finished(j))
        if visible:
            self._on_change()
        return job

    def _finished(self, job: Job) -> None:
        if self._jobs.get(job.key) is job:
            del self._jobs[job.key]
        if not job.task.cancelled() and job.task.exception() is not None:
            log.error("job %s (%s) failed", job.id, job.title, exc_info=job.task.exception())
        if job.visible:
            self._on_change()

    async def wait(self, job: Job) -> Any:
        """The job's result for a request handler: a cancelled job (kernel-lsp.cancel, the
        progress' Cancel button) gives None, while cancelling the request cancels the job."""
        try:
            return await asyncio.shield(job.task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                job.task.cancel()
                raise
            return None

    def get(self, key: Hashable) -> Job | None:
        return self._jobs.get(key)

    def find(self, job_id: str) -> Job | None:
        return next((j for j in self._jobs.values() if j.id == job_id), None)

    def running(self, visible_only: bool = True) -> list[Job]:
        return [j for j in self._jobs.values() if not visible_only or j.visible]

    def cancel(self, job_id: str | None = None) -> int:
        """Cancel one job by id, or every visible job; returns how many were cancelled."""
        targets = [self.find(job_id)] if job_id else self.running()
        count = 0
        for job in targets:
            if job is not None and not job.task.done():
                job.task.cancel()
                count += 1
        return count

    async def aclose(self) -> None:
        tasks = [j.task for j in self._jobs.values() if not j.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
