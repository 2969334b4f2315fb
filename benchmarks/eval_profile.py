"""Where one evaluation's seconds go, function by function (issue 33: a kernel-body edit <= 1.5 s).

In this process (no Worker, no sandbox: the engine's own `run.evaluate`), the editor loop's GELU
(benchmarks/editor_loop.py) is built and evaluated once to warm everything up, then evaluated
again as a kernel-body edit is (compile, verify, bench; the baselines not timed again, as when
they are kept) under cProfile, once per input-draw setting named in --draws:

  host    get_inputs() draws every set on the host (the rule before issue 33's change)
  default the harness's own rule (harness.DEVICE_INPUTS_BYTES)

Prints each run's phases and its functions by cumulative time; writes the same to
benchmarks/results/eval_profile.{json,md} (--out-dir elsewhere).

  GPU:  python benchmarks/eval_profile.py
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", default="host,default")
    ap.add_argument("--repeat", type=int, default=3, help="profiled evaluations per setting (the median is shown)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("eval_profile: no CUDA GPU here; it profiles the GPU path", file=sys.stderr)
        return 2
    import editor_loop  # noqa: PLC0415  (the GELU file and its body edit)

    from kernel_lsp.engine.worker import harness, run  # noqa: PLC0415
    from kernel_lsp.engine.worker.build import build  # noqa: PLC0415
    from kernel_lsp.model import Candidate, Task  # noqa: PLC0415

    work = Path(tempfile.mkdtemp(prefix="klsp_evalprof_"))
    src = editor_loop.GELU
    edited = src.replace(*editor_loop.GELU_BODY)
    path = work / "gelu.py"
    path.write_text(src)
    task = Task(name="gelu", reference_path=str(path), reference_source=src)
    options = {"device": "cuda", "baselines": False, "ncu": False}
    checks = ["compile", "verify", "bench"]
    first = run.evaluate(task, Candidate(source=src, kind="python"), checks, {**options, "baselines": True}, build)
    print(f"warm-up: {first.verdict}, {first.wall_seconds:.2f} s")
    run.evaluate(task, Candidate(source=edited, kind="python"), checks, options, build)  # its build cached
    rows = []
    default_bytes = harness.DEVICE_INPUTS_BYTES
    for setting in [s.strip() for s in args.draws.split(",") if s.strip()]:
        harness.DEVICE_INPUTS_BYTES = (1 << 62) if setting == "host" else default_bytes
        walls, profs = [], []
        for _ in range(args.repeat):
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            ev = run.evaluate(task, Candidate(source=edited, kind="python"), checks, options, build)
            prof.disable()
            walls.append(time.perf_counter() - t0)
            profs.append((walls[-1], prof, ev))
        profs.sort(key=lambda p: p[0])
        wall, prof, ev = profs[len(profs) // 2]
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
        phases = {k: round(v, 4) for k, v in ((ev.evidence or {}).get("phases") or {}).items()
                  if isinstance(v, (int, float))}
        rows.append({"draws": setting, "verdict": ev.verdict, "wall_s": [round(w, 4) for w in walls],
                     "median_s": round(wall, 4), "phases": phases, "profile": out.getvalue()})
        print(f"\n== draws {setting}: {ev.verdict}, wall {', '.join(f'{w:.3f}' for w in walls)} s; phases {phases}")
        print(out.getvalue())
    harness.DEVICE_INPUTS_BYTES = default_bytes
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M")}
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval_profile.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    md = [f"# One evaluation, by function ({env['gpu']}, torch {env['torch']}, {env['date']})", "",
          "`python benchmarks/eval_profile.py`: the editor loop's GELU after a kernel-body edit (compile, verify, "
          "bench; baselines not timed again), in one process under cProfile.", "",
          "| draws | verdict | wall s (each) | phases |", "| --- | --- | --- | --- |"]
    for r in rows:
        md.append(f"| {r['draws']} | {r['verdict']} | {', '.join(f'{w:.3f}' for w in r['wall_s'])} | "
                  f"{', '.join(f'{k} {v}' for k, v in r['phases'].items())} |")
    for r in rows:
        md += ["", f"## draws: {r['draws']} (the median run)", "", "```", r["profile"].strip(), "```"]
    (out_dir / "eval_profile.md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
