"""The built-in tuner on the examples, on a GPU (issue 4's target).

For each examples/*.cu: one Search with the TunerProposer (no LLM), through the real Engine
and Store. Reports the confirmed speedup over the starting source, the Search's wall time,
and the share of that wall time spent outside compile and GPU work (time when no Engine
call -- evaluate, prebuild, profile, device_info -- was in flight): the agent's own
overhead. Target: the tuner improves at least three examples; overhead under 10 %.

Run on the GPU machine: `python benchmarks/agent_tuner.py [--budget N] [--out-dir DIR]`.
Writes agent_tuner.json and agent_tuner.md under --out-dir (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.agent import Budget, Search, SearchOptions, TunerProposer  # noqa: E402
from kernel_lsp.engine import Engine, find_task  # noqa: E402
from kernel_lsp.store import Store  # noqa: E402


class TimedEngine:
    """The Engine, with the intervals during which any call into it was in flight."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.intervals: list[tuple[float, float]] = []
        self.store = engine.store

    def __getattr__(self, name: str):
        attr = getattr(self.engine, name)
        if name not in ("evaluate", "prebuild", "profile", "device_info"):
            return attr

        async def timed(*args, **kwargs):
            start = time.monotonic()
            try:
                return await attr(*args, **kwargs)
            finally:
                self.intervals.append((start, time.monotonic()))

        return timed

    def busy_seconds(self, start: float, end: float) -> float:
        """Length of the union of the intervals inside [start, end]."""
        total, cursor = 0.0, start
        for a, b in sorted(self.intervals):
            a, b = max(a, cursor), min(b, end)
            if b > a:
                total += b - a
                cursor = b
        return total


async def tune(path: Path, budget: int, workdir: Path) -> dict:
    task, candidate = find_task(str(path))
    store = Store(workdir / f"{path.stem}.sqlite")
    async with Engine(timeout=300) as engine:
        timed = TimedEngine(engine)
        await engine.device_info()  # the Worker's start and CUDA init are not the Search's
        started = time.monotonic()
        result = await Search(timed, store, task, candidate, TunerProposer(),
                              SearchOptions(budget=Budget(proposals=budget, patience=3))).run()
        wall = time.monotonic() - started
        busy = timed.busy_seconds(started, started + wall)
    start_ms = result.start_evaluation.time.median_ms if result.start_evaluation and result.start_evaluation.time else None
    best_ms = result.best_evaluation.time.median_ms if result.best_evaluation and result.best_evaluation.time else None
    return {
        "example": path.name, "improved": result.improved, "confirmed": result.confirmed,
        "speedup": result.speedup, "start_ms": start_ms, "best_ms": best_ms,
        "best_change": result.best.note if result.best else None,
        "candidates_evaluated": result.candidates_evaluated, "reason": result.reason,
        "wall_s": wall, "engine_busy_s": busy, "outside_share": (wall - busy) / wall if wall else None,
        "device": (result.start_evaluation.device or {}).get("name") if result.start_evaluation else None,
    }


def render(rows: list[dict]) -> str:
    improved = sum(1 for r in rows if r.get("improved"))
    total_wall = sum(r.get("wall_s") or 0 for r in rows)
    total_out = sum((r.get("wall_s") or 0) - (r.get("engine_busy_s") or 0) for r in rows)
    device = next((r["device"] for r in rows if r.get("device")), "unknown GPU")
    lines = [f"# The tuner on the examples ({device}, {datetime.date.today()})", "",
             f"Improved {improved} of {len(rows)} examples; agent overhead (wall time with no Engine call "
             f"in flight) {100 * total_out / total_wall if total_wall else 0:.1f} % of {total_wall:.0f} s.", "",
             "| example | improved | speedup | start | best | change | candidates | wall (s) | outside compile+GPU |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['example']} | error: {r['error']} | | | | | | | |")
            continue
        fmt = lambda v, unit="": "-" if v is None else f"{v:.4g}{unit}"  # noqa: E731
        lines.append(f"| {r['example']} | {r['improved']} | {fmt(r['speedup'], 'x')} | {fmt(r['start_ms'], ' ms')} | "
                     f"{fmt(r['best_ms'], ' ms')} | {r['best_change'] or r['reason']} | {r['candidates_evaluated']} | "
                     f"{r['wall_s']:.1f} | {100 * (r['outside_share'] or 0):.1f} % |")
    return "\n".join(lines) + "\n"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=8, help="proposals per Search (default 8)")
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--only", nargs="*", help="example stems to run (default: all)")
    ns = parser.parse_args()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="kernel-lsp-tuner-"))
    for path in sorted((ROOT / "examples").glob("*.cu")):
        if ns.only and path.stem not in ns.only:
            continue
        print(f"tuning {path.name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(await tune(path, ns.budget, work))
        except Exception as exc:  # one example's failure must not hide the others
            rows.append({"example": path.name, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = Path(ns.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_tuner.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = render(rows)
    (out / "agent_tuner.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
