"""KernelBench-format Search throughput (engine_throughput.py --engine-inline K, issue 21).

One Search per task over the task's load_inline candidate (``benchmarks/tasks/<name>_new.py``):
the start, then the tuner's one-parameter variants (``agent/tuner.variants``), or, where the tuner
finds nothing to tune in this source, the same launch with 128 / 512 / 1024 threads (a scripted
proposer). All K Searches run at once over one Engine: one GPU Worker verifies and times one
candidate at a time while the CPU build pool builds the next ones (the fast split build, its
per-unit object cache: a variant recompiles only the unit it changed). Options as a Search uses
them: the start without baselines here (they are measured once per Task), children with
``{"baselines": False}``; each Search confirms its winner against its start at the end (that GPU
time is counted, its re-timings are not counted as candidates).

Candidates per GPU-minute = candidates evaluated / the wall time from the first Search's start to
the last Search's end (the GPU Worker is held throughout), times 60. The precompiled torch headers
are made first (``Engine.prepare_builds``: once per torch version, reported, not counted), and the
GPU Worker is started and warmed first (not counted).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from pathlib import Path
from typing import Any

TASKS = Path(__file__).resolve().parent / "tasks"
TARGET_PER_GPU_MIN = 20.0        # issue 21 (4.8 before the fast build, measured one candidate at a time)
VARIANTS_PER_TASK = 3
_THREADS = re.compile(r"const int threads = (\d+);")


def variants(source: str, count: int = VARIANTS_PER_TASK) -> list[tuple[str, str]]:
    """(source, note): the tuner's variants, else the scripted thread counts."""
    from kernel_lsp.agent import tuner

    found = tuner.variants(source, "python")
    if not found:
        m = _THREADS.search(source)
        if m:
            found = [(source[:m.start(1)] + str(n) + source[m.end(1):], f"threads {m.group(1)} -> {n}")
                     for n in (128, 512, 1024) if str(n) != m.group(1)]
    return found[:count]


class ScriptedProposer:
    """Proposes a fixed list of variants of the start, a batch per round, then nothing."""

    name = "scripted"
    model = None
    can_repair = False
    uses_profile = False

    def __init__(self, sources: list[tuple[str, str]]) -> None:
        self.queue = list(sources)

    async def propose(self, request: Any) -> list[Any]:
        from kernel_lsp.agent.proposer import Proposal
        from kernel_lsp.model import Candidate

        out = []
        while self.queue and len(out) < max(1, request.count):
            src, note = self.queue.pop(0)
            out.append(Proposal(candidate=Candidate(source=src, kind="python", parent=request.parent.id,
                                                    origin="tuner", note=note), form="tuner"))
        return out

    async def aclose(self) -> None:
        return None


async def run_phase(engine: Any, names: list[str], res: dict[str, Any], log: Any = print,
                    eval_timeout: float = 180.0, deadline_s: float | None = None) -> dict[str, Any]:
    """The phase on ``engine`` (the real Engine, or a stand-in in the CPU test); fills and returns
    ``res["inline_search"]``."""
    from kernel_lsp.agent.budget import Budget
    from kernel_lsp.agent.search import Search, SearchOptions
    from kernel_lsp.engine import find_task

    out: dict[str, Any] = {"tasks": list(names), "variants_per_task": VARIANTS_PER_TASK, "searches": []}
    res["inline_search"] = out
    prepare = getattr(engine, "prepare_builds", None)
    if prepare is not None:
        t0 = time.monotonic()
        out["prepare"] = await prepare()
        out["prepare_s"] = round(time.monotonic() - t0, 2)
        log(f"precompiled headers: {out['prepare'].get('state')} in {out['prepare_s']:.1f} s (not counted)")
    t0 = time.monotonic()
    out["device"] = await engine.device_info()
    out["worker_start_s"] = round(time.monotonic() - t0, 2)

    async def one(name: str) -> dict[str, Any]:
        row: dict[str, Any] = {"task": name}
        try:
            task, start = find_task(str(TASKS / f"{name}_new.py"))
            assert start is not None, "no ModelNew"
            kids = variants(start.source)
            row["variants"] = [n for _, n in kids]
            opts = SearchOptions(budget=Budget(proposals=len(kids), seconds=deadline_s),
                                 children=max(1, len(kids)), eval_timeout=eval_timeout,
                                 start_engine_options={"baselines": False})
            search = Search(engine, None, task, start, ScriptedProposer(kids), opts)
            t = time.monotonic()
            result = await search.run()
            row.update(seconds=round(time.monotonic() - t, 2), evaluated=search._evaluated,
                       verdicts=[n.evaluation.verdict for n in search.nodes.values() if n.evaluation],
                       improved=result.improved, speedup=result.speedup, reason=result.reason)
        except Exception as exc:  # noqa: BLE001 - one task's failure is a row
            row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        log(f"inline search {name}: {row.get('evaluated', 0)} evaluated in {row.get('seconds', '-')} s "
            f"{row.get('verdicts', row.get('error'))}")
        return row

    t0 = time.monotonic()
    out["searches"] = list(await asyncio.gather(*(one(n) for n in names)))
    wall = time.monotonic() - t0
    done = [r for r in out["searches"] if "evaluated" in r]
    n = sum(r["evaluated"] for r in done)
    correct = sum(v == "correct" for r in done for v in r["verdicts"])
    out.update(wall_s=round(wall, 2), candidates=n, correct=correct,
               per_gpu_min=round(60.0 * n / wall, 2) if wall > 0 and n else None,
               target_per_gpu_min=TARGET_PER_GPU_MIN,
               median_search_s=statistics.median(r["seconds"] for r in done) if done else None)
    log(f"inline search: {n} candidates ({correct} correct) on {len(done)} tasks in {wall:.1f} s: "
        f"{out['per_gpu_min']} per GPU-minute (target >= {TARGET_PER_GPU_MIN:g})")
    return out


def markdown_row(out: dict[str, Any]) -> str:
    """The summary table's KernelBench-format row."""
    rate = out.get("per_gpu_min")
    met = "-" if rate is None else ("yes" if rate >= TARGET_PER_GPU_MIN else "**no**")
    done = [r for r in out.get("searches", []) if "evaluated" in r]
    return (f"| candidates per GPU-minute, KernelBench format (ModelNew + load_inline), {len(done)} tasks' "
            f"Searches at once (start + {out.get('variants_per_task')} tuner variants each) | "
            f"{'-' if rate is None else f'{rate:.1f}'} (n={out.get('candidates', 0)}, {out.get('correct', 0)} correct, "
            f"{out.get('wall_s', '-')} s wall; headers made first in {out.get('prepare_s', '-')} s, not counted) | "
            f"- | >= {TARGET_PER_GPU_MIN:g} | {met} |")
