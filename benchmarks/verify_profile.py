"""Where one Task's evaluation spends its time, in this process (no Worker, no sandbox): the
engine's phases and Python's profile of them, top functions by cumulative and own time.

    python benchmarks/verify_profile.py benchmarks/accuracy_suite/softmax_largest.py [--bench] [--device cuda]

The file is a KernelBench-format candidate (``foo_new.py`` beside ``foo.py``, or one file holding
``Model`` and ``ModelNew``). ``--bench``: time it too, with both baselines. Made to find the 48 s of
host copies in the 6 GiB softmax's verify on the H200 (benchmarks/results/gpu_runs/2026-12-05b/).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("task")
    ap.add_argument("--bench", action="store_true", help="time it too, with eager and torch.compile")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    from kernel_lsp.engine.caller.tasks import find_task
    from kernel_lsp.engine.worker.build import build
    from kernel_lsp.engine.worker import run

    try:
        task, cand = find_task(args.task)
    except Exception as exc:  # a file that is not a Task: one line, no traceback
        print(f"verify_profile: {args.task}: {exc}", file=sys.stderr)
        return 2
    checks = ["compile", "verify"] + (["bench"] if args.bench else [])
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    ev = run.evaluate(task, cand, checks, {"baselines": args.bench, "device": args.device}, build)
    prof.disable()
    evidence = ev.evidence or {}
    print(f"{args.task}: {ev.verdict} in {time.perf_counter() - t0:.1f} s: {ev.message[:300]}")
    for name, seconds in (evidence.get("phases") or {}).items():
        print(f"  {name:28s} {seconds:9.3f}")
    print("memory:", evidence.get("memory"))
    for note in evidence.get("notes") or []:
        print("note:", note)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0 if ev.verdict == "correct" else 1


if __name__ == "__main__":
    sys.exit(main())
