"""Build while typing: a measured file's new text is built in the CPU build pool after a pause in
typing, so that the save that follows finds its build done (or under way) and only verifies and
times it.

A save's measurement asks the Engine for the same build (`Engine.prebuild` shares one build per
candidate text and options), so a save during a build ahead waits for that build instead of
starting another, and a save after it finds the extension in the build cache. Only the newest
text is built: while one build runs, later edits wait for it and then the newest text is built
(a running build is never cancelled: cancelling drops the pool's process, whose start costs more
than the build). Nothing is shown to the user; the log says what was built and how long it took.

When it does nothing, and why (`why_not`):
- the `build_while_typing` setting is off, running code is off, saves do not measure, or
  evaluations run on a Ray cluster (its builds are remote: a build ahead would not be reused);
- the file has not been measured in this session (a file only opened is not built);
- a `.py` candidate while the build pool is not sandboxed: building a `.py` runs its module code,
  and text caught mid-edit is not what the user chose to run (a `.cu` is only compiled);
- the text names no Task (a `.py` that does not parse names none), or builds nothing.

A `.py` not measured yet that calls `load_inline` gets less, on open and after a pause in typing:
its `main.cpp` compiled as its build will need it (by table or by signature;
`BuildPool.prebuild_binding`; the calls are read from the syntax tree, nothing of the file runs,
so no sandbox is needed), 5-7 s of g++ its first save then skips when the machine has not built
that main.cpp yet. Only in a free build slot (a build
never waits behind it), only when saves build (on_save), and once per text.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernel_lsp.server.state import DocumentState

log = logging.getLogger(__name__)

# A pause this long after the last keystroke starts the build. Short enough that a save after a
# pause finds the build well under way, long enough that typing does not start a build per key.
DELAY_S = 0.4
# ... and this long, the binding of a file not measured yet (typing a new file's first lines
# changes its declarations often; the compile takes seconds).
BINDING_DELAY_S = 1.0


class BuildAhead:
    def __init__(self, server: Any) -> None:
        self.server = server
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._again: set[str] = set()
        self._binding_timers: dict[str, asyncio.TimerHandle] = {}
        self._binding_running: dict[str, asyncio.Task[Any]] = {}
        self._binding_done: dict[str, int] = {}  # uri -> hash of the text last compiled ahead

    def _off(self) -> str | None:
        """What keeps both kinds of work ahead off, whatever the file."""
        settings = self.server.settings
        if not settings.build_while_typing:
            return "build_while_typing is off"
        if not settings.execution_enabled:
            return "running code is off"
        return None

    def why_not(self, state: "DocumentState") -> str | None:
        settings = self.server.settings
        off = self._off()
        if off is not None:
            return off
        if not {"verify", "bench"} & set(settings.on_save):
            return "saves are not measured (on_save)"
        if settings.executor != "local":
            return f"evaluations run on the {settings.executor} executor"
        if state.measurement is None:
            return "the file has not been measured yet"
        return None

    def changed(self, state: "DocumentState") -> None:
        """The buffer changed: (re)start the pause's timer."""
        if self.why_not(state) is None:
            _rearm(self._timers, state, DELAY_S, self._start)

    def closed(self, uri: str) -> None:
        for timers in (self._timers, self._binding_timers):
            old = timers.pop(uri, None)
            if old is not None:
                old.cancel()
        self._again.discard(uri)
        self._binding_done.pop(uri, None)

    # -- main.cpp of a file not measured yet ----------------------------------------------------

    def binding_why_not(self, state: "DocumentState") -> str | None:
        settings = self.server.settings
        off = self._off()
        if off is not None:
            return off
        if not {"compile", "verify", "bench"} & set(settings.on_save):
            return "saves build nothing (on_save)"
        if settings.executor != "local":
            return f"builds run on the {settings.executor} executor"
        if not state.path.endswith(".py") or "load_inline" not in state.text:
            return "no load_inline call"
        if state.measurement is not None:
            return "the file is measured: its edits are built whole"
        return None

    def binding(self, state: "DocumentState") -> None:
        """Opened or changed: (re)start the pause's timer of its binding ahead."""
        if self.binding_why_not(state) is None:
            _rearm(self._binding_timers, state, BINDING_DELAY_S, self._start_binding)

    def _start_binding(self, state: "DocumentState") -> None:
        self._binding_timers.pop(state.uri, None)
        running = self._binding_running.get(state.uri)
        if running is not None and not running.done():
            self.binding(state)  # after this one: the newest text, a pause later
            return
        if self.binding_why_not(state) is not None or self._binding_done.get(state.uri) == hash(state.text):
            return
        _spawn(self._binding_running, state, self._bind(state, state.text),
               lambda s, t: _finished(self._binding_running, s, t, "binding ahead"))

    async def _bind(self, state: "DocumentState", text: str) -> None:
        from kernel_lsp.server.engine_host import ExecutionDisabled

        try:
            engine = self.server.host.engine()
        except ExecutionDisabled:
            return
        t0 = time.monotonic()
        got = await engine.prebuild_binding(text)
        if got.get("state") != "busy":  # a busy pool: the next pause tries again
            self._binding_done[state.uri] = hash(text)
        log.info("binding ahead of %s in %.2f s: %s %s", os.path.basename(state.path), time.monotonic() - t0,
                 got.get("state"), got.get("signatures") or got.get("reason") or "")

    def _start(self, state: "DocumentState") -> None:
        self._timers.pop(state.uri, None)
        running = self._running.get(state.uri)
        if running is not None and not running.done():
            self._again.add(state.uri)  # the newest text is built when this build ends
            return
        _spawn(self._running, state, self._build(state, state.text, state.version), self._done)

    def _done(self, state: "DocumentState", task: asyncio.Task[Any]) -> None:
        _finished(self._running, state, task, "build ahead")
        if state.uri in self._again:
            self._again.discard(state.uri)
            if self.why_not(state) is None:
                self._start(state)

    async def _build(self, state: "DocumentState", text: str, version: int | None) -> None:
        from kernel_lsp.engine.caller.client import needs_build
        from kernel_lsp.engine.caller.tasks import TaskError
        from kernel_lsp.server.engine_host import ExecutionDisabled

        name = os.path.basename(state.path)

        def skipped(why: str) -> None:
            state.built_ahead = {"version": version, "state": "skipped", "why": why}
            log.debug("no build ahead of %s (version %s): %s", name, version, why)

        try:  # a .py that does not parse names no Task (TaskError says where)
            task, candidate = self.server.host.task_for(state.path, text)
            engine = self.server.host.engine()
        except (TaskError, ExecutionDisabled) as exc:
            return skipped(str(exc))
        if candidate is None or not needs_build(candidate):
            return skipped("nothing to build")
        if candidate.kind != "cuda" and not engine.builds_sandboxed():
            return skipped("the build pool is not sandboxed (a .py's build runs its code)")
        t0 = time.monotonic()
        result = await engine.prebuild(task, candidate)
        secs = time.monotonic() - t0
        # The status says it (an editor may show "built"); a failed build's errors come with the save.
        state.built_ahead = {"version": version, "state": "built" if result.ok else "failed",
                             "cached": result.cached, "seconds": round(secs, 3)}
        log.info("built ahead %s (version %s) in %.2f s: %s%s", name, version, secs,
                 "ok" if result.ok else "failed", " (cached)" if result.cached else "")
        self.server.send_status()


def _rearm(timers: dict[str, asyncio.TimerHandle], state: "DocumentState", delay: float, fire: Any) -> None:
    """(Re)start a document's pause timer: ``fire(state)`` once ``delay`` s pass without another."""
    old = timers.pop(state.uri, None)
    if old is not None:
        old.cancel()
    timers[state.uri] = asyncio.get_running_loop().call_later(delay, fire, state)


def _spawn(running: dict[str, asyncio.Task[Any]], state: "DocumentState", work: Any, ended: Any) -> None:
    """Run ``work`` as the document's task in ``running``; ``ended(state, task)`` when it ends."""
    task = asyncio.get_running_loop().create_task(work)
    running[state.uri] = task
    task.add_done_callback(lambda t, s=state: ended(s, t))


def _finished(running: dict[str, asyncio.Task[Any]], state: "DocumentState", task: asyncio.Task[Any], what: str) -> None:
    """The document's task ended: out of ``running``; its failure logged."""
    if running.get(state.uri) is task:
        del running[state.uri]
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s of %s failed: %s", what, os.path.basename(state.path), task.exception())
