"""Kept baselines, the caller's half: read them from the store for a Task, keep what a Worker
measured. The Worker never touches SQLite: it gets the kept records of the Task's reference in
the evaluate options and says, on `Evaluation.baselines`, whether it used one or measured
(engine/worker/timing/baselines.py builds the key; docs/baselines.md says what the key holds).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Iterable

from kernel_lsp.engine import protocol
from kernel_lsp.model import Evaluation, Task

if TYPE_CHECKING:
    from kernel_lsp.store import Store

log = logging.getLogger(__name__)

SENT = 16  # kept records sent per evaluation: one reference on a few GPUs, shapes and modes
_NOT_KEPT = ("cached", "keep", "why")  # what an Evaluation says about them, not part of the record


def reference_hash(task: Task) -> str:
    """The `reference` part of a baseline key (the Worker hashes the same text the same way)."""
    return protocol.reference_fingerprint(task.reference_source)


def kept_for(store: "Store | None", task: Task) -> list[dict[str, Any]]:
    if store is None:
        return []
    try:
        return store.baselines(reference_hash(task))[:SENT]
    except Exception:  # noqa: BLE001 - a broken store costs a measurement, never the evaluation
        log.warning("could not read kept baselines", exc_info=True)
        return []


def with_kept(store: "Store | None", task: Task, checks: Iterable[str], options: dict[str, Any]) -> dict[str, Any]:
    """The evaluate options with the Task's kept baselines (only when it is timed)."""
    if store is None or "bench" not in set(checks) or protocol.CACHED_BASELINES in options:
        return options
    return {**options, protocol.CACHED_BASELINES: kept_for(store, task)}


async def with_kept_async(store: "Store | None", task: Task, checks: Iterable[str],
                          options: dict[str, Any]) -> dict[str, Any]:
    """`with_kept` off the event loop (a SQLite read)."""
    if store is None or "bench" not in set(checks):
        return options
    return await asyncio.to_thread(with_kept, store, task, list(checks), options)


def to_keep(ev: Evaluation) -> dict[str, Any] | None:
    """The record to keep from an Evaluation: baselines measured now, with a key, not refused
    by the Worker (measured on a shared GPU)."""
    b = ev.baselines
    if not isinstance(b, dict) or b.get("cached") or not b.get("keep") or not b.get("key") or not b.get("eager"):
        return None
    return {k: v for k, v in b.items() if k not in _NOT_KEPT}


def keep(store: "Store | None", ev: Evaluation) -> bool:
    record = to_keep(ev)
    if store is None or record is None:
        return False
    try:
        store.put_baseline(record)
        return True
    except Exception:  # noqa: BLE001 - a broken store costs a later re-measure, never this Evaluation
        log.warning("could not keep the baselines of %s", ev.task, exc_info=True)
        return False


async def keep_async(store: "Store | None", ev: Evaluation) -> bool:
    if store is None or to_keep(ev) is None:
        return False
    return await asyncio.shield(asyncio.to_thread(keep, store, ev))
