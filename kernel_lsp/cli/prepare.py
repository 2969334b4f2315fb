"""`kernel-lsp bench` / `optimize`: the fast build's precompiled torch headers, made in the
background from the start (a build-pool Worker), with a line on stderr; the candidate's build
waits for them rather than making them again. Only for candidates that build a torch extension.
Several processes at once: one prepares, the others say who and wait (caller/prepare_lock.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Iterable, TextIO

from kernel_lsp.engine.caller.pool import PREPARE_TITLE, needs_torch_headers, preparing_wanted
from kernel_lsp.model import Candidate


def start(engine: Any, candidates: Iterable[Candidate | None], err: TextIO) -> "asyncio.Task[None] | None":
    fn = getattr(engine, "prepare_builds", None)  # a Ray cluster builds on its own machines
    if fn is None or not any(needs_torch_headers(c) for c in candidates) or not preparing_wanted()[0]:
        return None

    def announce(check: dict[str, Any]) -> None:
        if check.get("state") == "waiting":  # another process prepares it: once per machine
            print(f"kernel-lsp: waiting for the CUDA build cache (torch {check.get('torch', '?')}), which "
                  f"{check.get('who', 'another kernel-lsp process')} prepares; the first build waits for it",
                  file=err, flush=True)
            return
        print(f"kernel-lsp: {PREPARE_TITLE} (torch {check.get('torch', '?')}; about a minute, "
              "the first build waits for it)", file=err, flush=True)

    async def run() -> None:
        result = await fn(announce)
        if result.get("state") == "made":
            print(f"kernel-lsp: CUDA build cache ready in {result.get('seconds', '?')} s", file=err, flush=True)
        elif result.get("state") == "ready" and result.get("waited_s") is not None:
            print(f"kernel-lsp: CUDA build cache ready (made by kernel-lsp pid {result.get('prepared_by', '?')}; "
                  f"waited {result['waited_s']:.0f} s)", file=err, flush=True)
        elif result.get("state") == "failed":
            print(f"kernel-lsp: could not prepare the CUDA build cache ({result.get('reason')}); "
                  "each build makes what it needs", file=err, flush=True)

    return asyncio.get_running_loop().create_task(run())


async def finish(task: "asyncio.Task[None] | None") -> None:
    """Done with the Executor: a preparation still running is moot (the cache stays whole)."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
