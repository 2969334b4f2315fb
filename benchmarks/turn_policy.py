"""The GPU turn's policy, replayed: six evaluations at once through the real machine-wide lock
(engine/caller/gpu_lock.py), each one a process that sleeps through the stages a measured
six-at-once run recorded (its Worker's start and build before the turn; then, holding the turn,
verify's input sets, the early timing, torch.compile's CPU compile with the GPU lent, its GPU
part, the final timing), and stops at the same turn points a real evaluation stops at, where the
same Turn methods the Engine calls (to_hand_over, to_lend, hand_over, take_back) decide. Run once
per quantum (gpu_lock.MIN_TURN_S, through $KERNEL_LSP_GPU_MIN_TURN_S), it tells what the policy
alone does to each bench's wall and to the makespan, with no GPU and no noise from one.

What it does not see: the GPU work itself (a stage's seconds are what the measured run's
evaluation spent in it, held constant here), memory (every holder may hand over: the measured run's
Tasks all fit beside each other under gpu_lock's rules), and the CPU contention that made those
seconds (they are replayed as measured at six at once).

  python benchmarks/turn_policy.py                      # quanta 0, 0.5, 1, 2, 3, 4 s
  python benchmarks/turn_policy.py --quanta 0,2 --scale 0.5

Reads the `parallel` rows of first_bench.py JSONs (default: the two six-at-once runs on an H100 of
2026-12-05, under benchmarks/results/gpu_runs/2026-12-05{e,d}/; `--profile` again for others).
Writes benchmarks/results/turn_policy.{json,md}. Standard library and kernel_lsp's caller only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.engine.caller import gpu_lock  # noqa: E402

# The two six-at-once runs on an H100 of 2026-12-05: turns by virtual time (e), and before them (d).
PROFILES = [ROOT / "benchmarks/results/gpu_runs/2026-12-05e/first_bench_warm_h100.json",
            ROOT / "benchmarks/results/gpu_runs/2026-12-05d/first_bench_warm_h100.json"]
KEY = "GPU-turn-policy-replay"
SETS = 5  # verify's input sets: a turn point between each two
# Before the turn (outside the Worker's evaluate): what each bench did before it queued.
BEFORE = ("interpreter start", "opening the store", "reading the Tasks", "starting the Worker",
          "reusing the kept worker", "compiling", "waiting for the early build")


def stages(row: dict[str, Any], compile_gpu_s: float, input_bytes: Any = None) -> dict[str, float]:
    """One measured bench row -> the seconds of each replayed stage, and its Task's data (one
    input set and its outputs, taken as large as the inputs: what the Engine's expectation of its
    GPU work reads, gpu_lock.expected_gpu_s) when the profile says its `input_bytes`."""
    inside: dict[str, float] = {}
    before = 0.0
    for p in row.get("phases") or []:
        name, s = str(p.get("phase")), float(p.get("seconds") or 0)
        if p.get("inside"):
            inside[name] = inside.get(name, 0.0) + s
        elif any(name.startswith(b) or f": {b}" in name for b in BEFORE):
            before += s
    compile_s = inside.get("torch compile", 0.0)
    return {
        "before": before,
        "start": inside.get("reference", 0.0) + inside.get("build candidate", 0.0),
        "verify": inside.get("verify", 0.0),
        "early": inside.get("timing inputs", 0.0) + inside.get("early timing", 0.0),
        "compile_cpu": max(0.0, compile_s - compile_gpu_s),
        "compile_gpu": min(compile_s, compile_gpu_s),
        "final": inside.get("timing", 0.0) + inside.get("cache probe", 0.0),
        **({"data_bytes": 2.0 * input_bytes} if isinstance(input_bytes, (int, float)) else {}),
    }


def gpu_seconds(st: dict[str, float]) -> float:
    return st["start"] + st["verify"] + st["early"] + st["compile_gpu"] + st["final"]


# -- one replayed evaluation (a process of its own: the lock is per open file, waiters per pid) --

async def _replay(st: dict[str, float], scale: float, slices: int = 1) -> dict[str, Any]:
    t0 = time.monotonic()
    # (from, to) while it ran "GPU work", on the machine's monotonic clock (one for every process:
    # each process's own t0 is when it read "go", a few ms apart on a loaded machine, so spans
    # from t0 made two benches seem to hold the turn at once)
    held_log: list[tuple[float, float]] = []

    async def gpu(seconds: float) -> None:
        a = time.monotonic()
        await asyncio.sleep(seconds * scale)
        held_log.append((a, time.monotonic()))

    async def point(turn: gpu_lock.Turn, stage: str) -> None:
        if turn.to_hand_over(stage, None, None, st.get("data_bytes")):
            await turn.hand_over(stage)

    origin = time.time_ns()  # when its evaluation started, as the Engine says it (client.call)
    await asyncio.sleep(st["before"] * scale)
    queued = time.monotonic() - t0
    # Sized before its turn only when the GPU is busy then, as the Engine does (client._task_need);
    # else it says its data at its first turn point (Turn.passed).
    sized = gpu_lock.busy(KEY) and st.get("data_bytes") is not None
    async with gpu_lock.gpu_turn(KEY, "evaluate", origin_ns=origin,
                                 expect_s=gpu_lock.expected_gpu_s(st.get("data_bytes")) if sized else None) as turn:
        got = time.monotonic() - t0
        await gpu(st["start"])
        for i in range(SETS):
            await gpu(st["verify"] / SETS)
            if i < SETS - 1:
                await point(turn, "verify_set")
        await point(turn, "verify")
        for i in range(slices):  # --timing-slices: a turn point between groups of timing rounds
            await gpu(st["early"] / slices)
            await point(turn, "early_timing" if i == slices - 1 else "timing_slice")
        if turn.to_lend(None, None):
            await turn.lend("while torch.compile compiles")
            await asyncio.sleep(st["compile_cpu"] * scale)
            await turn.take_back()
        else:
            await asyncio.sleep(st["compile_cpu"] * scale)  # held, the GPU idle
        await gpu(st["compile_gpu"])
        await point(turn, "torch_compile")
        for i in range(slices):
            await gpu(st["final"] / slices)
            if i < slices - 1:
                await point(turn, "timing_slice")
    end = time.monotonic() - t0
    return {"queued_s": queued / scale, "first_turn_s": got / scale, "wall_s": end / scale,
            "handovers": turn.handovers, "handed_s": turn.handed_s / scale,
            "gpu": held_log}


def one(args: argparse.Namespace) -> None:
    st = json.loads(args.one)
    # Its clock runs at `scale`: so do the seconds the lock expects of an evaluation.
    gpu_lock.EXPECT_BASE_S *= args.scale
    gpu_lock.EXPECT_S_PER_GIB *= args.scale
    gpu_lock.MIN_LEFT_S *= args.scale
    print("ready", flush=True)  # imported: every process starts together, when the parent says go
    sys.stdin.readline()
    print(json.dumps(asyncio.run(_replay(st, args.scale, args.timing_slices))), flush=True)


# -- the replay at each quantum ------------------------------------------------------------------

def replay(staged: dict[str, dict[str, float]], quantum: float, scale: float, slices: int = 1) -> dict[str, Any]:
    """`staged`: each bench's stages (stages()), by its task."""
    with tempfile.TemporaryDirectory(prefix="turn-policy-") as locks:
        env = {**os.environ, "KERNEL_LSP_GPU_LOCK_DIR": locks, "KERNEL_LSP_GPU_MIN_TURN_S": str(quantum),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        procs = [subprocess.Popen([sys.executable, __file__, "--one", json.dumps(st),
                                   "--scale", str(scale), "--timing-slices", str(slices)],
                                  env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for st in staged.values()]
        for p in procs:  # a start barrier: a slow import (a loaded machine) must not shift a bench's stages
            if p.stdout is None or p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a replay process did not start (exit {p.poll()})")
        for p in procs:
            p.stdin.write("go\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        outs = [json.loads((p.communicate(timeout=600)[0] or "{}").strip().splitlines()[-1]) for p in procs]
    spans = sorted(s for o in outs for s in o.get("gpu", []))
    overlap = sum(max(0.0, a_end - b_start) for (_, a_end), (b_start, _) in zip(spans, spans[1:])) / scale
    return {"quantum_s": quantum, "makespan_s": round(max(o["wall_s"] for o in outs), 2),
            "gpu_overlap_s": round(overlap, 3),  # > 0 would mean two held the turn at once
            "benches": [{"task": task, **{k: (round(v, 2) if isinstance(v, float) else v)
                                          for k, v in o.items() if k != "gpu"}}
                        for task, o in zip(staged, outs)]}


def table(path: str, profile: dict[str, Any], rows: list[dict[str, Any]], alone: dict[str, float],
          results: list[dict[str, Any]]) -> str:
    names = [r["task"] for r in rows]
    where = Path(path).resolve()
    lines = [f"## {where.relative_to(ROOT) if where.is_relative_to(ROOT) else path}", "",
             f"Measured with `{profile.get('command', '?')}` on {profile.get('device', '?')} "
             f"({profile.get('when', '?')}); its six-at-once rows replayed.", "",
             "| quantum s | makespan s | " + " | ".join(f"{n} wall s (turns let go)" for n in names)
             + " | mean wall s | worst wall / alone wall |",
             "| --- | --- | " + " | ".join("---" for _ in names) + " | --- | --- |"]
    measured = {r["task"]: r for r in rows}
    lines.append("| measured | " + f"{max(float(r['wall_s']) for r in rows):.1f} | "
                 + " | ".join(f"{float(measured[n]['wall_s']):.1f}" for n in names)
                 + f" | {statistics.mean(float(r['wall_s']) for r in rows):.1f} | "
                 + f"{max(float(measured[n]['wall_s']) / alone[n] for n in names if alone.get(n)):.1f} |")
    for res in results:
        by = {b["task"]: b for b in res["benches"]}
        worst = max(by[n]["wall_s"] / alone[n] for n in names if alone.get(n))
        lines.append(f"| {res['quantum_s']:g} | {res['makespan_s']:.1f} | "
                     + " | ".join(f"{by[n]['wall_s']:.1f} ({by[n]['handovers']})" for n in names)
                     + f" | {statistics.mean(by[n]['wall_s'] for n in names):.1f} | {worst:.1f} |")
    lines += ["", "alone wall s (that run's benches one at a time): "
              + ", ".join(f"{n} {alone[n]:.1f}" for n in names if n in alone), ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", help="a first_bench.py JSON (again for more)")
    ap.add_argument("--quanta", default="0,0.5,1,2,3,4")
    ap.add_argument("--scale", type=float, default=1.0, help="replay at this fraction of real time")
    ap.add_argument("--compile-gpu-s", type=float, default=0.3,
                    help="of torch.compile's seconds, those on the GPU after the lent compile (first runs)")
    ap.add_argument("--mode", default="warm", help="the profile's scenario")
    ap.add_argument("--timing-slices", type=int, default=1,
                    help="each timing (early, final) in this many groups of rounds, a turn point between two")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks/results"))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args)
        return 0
    quanta = [float(q) for q in args.quanta.split(",") if q.strip()]
    sections, runs = [], []
    for path in args.profile or [str(p) for p in PROFILES]:
        try:
            profile = json.loads(Path(path).read_text())
            scenario = next(s for s in profile["scenarios"] if s.get("mode") == args.mode)
            rows = scenario["parallel"]["rows"]
            alone = {r["task"]: float(r["wall_s"]) for r in scenario.get("alone", {}).get("rows", [])}
        except (OSError, ValueError, KeyError, StopIteration, TypeError) as exc:
            print(f"turn_policy: cannot read the profile {path} ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        sizes = profile.get("input_bytes") or {}
        staged = {r["task"]: stages(r, args.compile_gpu_s, sizes.get(r.get("label"))) for r in rows}
        results = []
        for q in quanta:
            res = replay(staged, q, args.scale, args.timing_slices)
            print(f"{Path(path).parent.name}: quantum {q:g} s: makespan {res['makespan_s']:.1f} s, walls "
                  + ", ".join(f"{b['wall_s']:.1f}" for b in res["benches"]), flush=True)
            results.append(res)
        sections.append(table(path, profile, rows, alone, results))
        runs.append({"profile": path, "stages": staged,
                     "alone_wall_s": alone, "results": results})
    shown, skip = [], False  # the command without where it wrote (--out-dir DIR or --out-dir=DIR)
    for a in sys.argv[1:]:
        if not skip and not a.startswith("--out-dir"):
            shown.append(a)
        skip = a == "--out-dir"
    command = " ".join(["python benchmarks/turn_policy.py", *shown])
    md = "\n".join([
        f"# The GPU turn's policy, replayed ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
        f"Command: `{command}` (scale {args.scale}, {args.compile_gpu_s} s of each torch.compile on the GPU)", "",
        "Each bench is a process that sleeps through its measured stages and takes the real lock's turns "
        "(no GPU: what this measures is the policy). The quantum is the least GPU time a turn lasts before "
        "a hand-over at a turn point (gpu_lock.MIN_TURN_S). `measured` is the real run, under the policy of "
        "its day: no quantum, no GPU lent while torch.compile compiles, and (d) references prepared in a turn "
        "of their own and no virtual time.", ""] + sections)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "turn_policy.json").write_text(json.dumps(
        {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": command, "scale": args.scale,
         "compile_gpu_s": args.compile_gpu_s, "runs": runs}, indent=1) + "\n")
    (out / "turn_policy.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
