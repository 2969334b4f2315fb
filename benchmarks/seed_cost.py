"""What the LLM Search's torch.compile seed costs and gives, per module Task, on a GPU.

    python benchmarks/seed_cost.py [--out benchmarks/results/seed_cost] [PATH ...]

Per Task (each reference alone in a fresh folder; the start is the reference as ModelNew, as
`kernel-lsp optimize` makes it): the start evaluated with both baselines, then the seed exactly as
a Search with `agent.seed = "inductor"` makes it (kernel_lsp.agent.seed.inductor_seed: one
torch.compile in the Worker, default mode, the writer's file) and evaluated like a child. Reported:
the seconds generation and evaluation took (what a seeded Search pays before the model's first
turn), the seed's verdict and label, and its time against the start, eager and torch.compile.
Results: JSON and a Markdown table with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT = ["examples/layernorm.py", "examples/softmax.py", "benchmarks/tasks/gelu_tanh.py",
           "benchmarks/tasks/relu.py"]


def _ms(ev, name="time"):
    t = getattr(ev, name, None) if ev is not None else None
    return t.median_ms if t is not None else None


async def one(engine, path: Path) -> dict:
    from kernel_lsp.agent.seed import inductor_seed
    from kernel_lsp.engine import find_task
    from kernel_lsp.model import Candidate

    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / path.name
        shutil.copy(path, ref)
        task, cand = find_task(str(ref))
        start = cand or Candidate(source=task.reference_source.rstrip("\n") + "\n\n\nclass ModelNew(Model):\n    pass\n",
                                  kind="python", note="the reference as ModelNew")
        device = dict(await engine.device_info() or {})
        start_ev = await engine.evaluate(task, start, checks=("compile", "verify", "bench"))
        t0 = time.perf_counter()
        seed, why = await inductor_seed(engine, task, start, device)
        gen_s = time.perf_counter() - t0
        row = {"task": path.stem, "path": str(path), "generate_s": round(gen_s, 1), "start_ms": _ms(start_ev),
               "eager_ms": _ms(start_ev, "eager"), "compile_ms": _ms(start_ev, "compiled"),
               "start_verdict": start_ev.verdict, "seed": None, "why": why}
        if seed is None:
            return row
        t0 = time.perf_counter()
        ev = await engine.evaluate(task, seed, checks=("compile", "verify", "bench"), options={"baselines": False})
        row.update({"evaluate_s": round(time.perf_counter() - t0, 1), "seed": seed.note, "verdict": ev.verdict,
                    "flags": list(ev.flags), "seed_ms": _ms(ev), "message": ev.message})
        return row


def _x(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def table(rows: list[dict], command: str) -> str:
    out = ["# The LLM Search's torch.compile seed: cost and start (GPU)", "", f"Command: `{command}`", "",
           "Ratios are the other's time over the seed's (higher: the seed is faster). 'generate' is one "
           "torch.compile in the Worker plus the writer; 'evaluate' the seed's verification and timing.", "",
           "| task | generate s | evaluate s | verdict | seed vs start | vs eager | vs torch.compile | label / why not |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ms = r.get("seed_ms")
        out.append(f"| {r['task']} | {r['generate_s']} | {r.get('evaluate_s', '-')} | {r.get('verdict', '-')} | "
                   f"{_x(r.get('start_ms'), ms)} | {_x(r.get('eager_ms'), ms)} | {_x(r.get('compile_ms'), ms)} | "
                   f"{(r.get('seed') or r.get('why') or '')[:90]} |")
    return "\n".join(out) + "\n"


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    ap.add_argument("--timeout", type=float, default=300.0)
    ns = ap.parse_args(argv)
    from kernel_lsp.engine import Engine

    paths = [Path(p) if Path(p).is_absolute() else ROOT / p for p in (ns.paths or DEFAULT)]
    rows = []
    async with Engine(timeout=ns.timeout) as engine:
        for p in paths:
            try:
                rows.append(await one(engine, p))
            except Exception as exc:  # noqa: BLE001 - one Task's failure is its row, not the end
                rows.append({"task": p.stem, "path": str(p), "generate_s": "-", "why": f"{type(exc).__name__}: {exc}"})
            print(json.dumps(rows[-1]), flush=True)
    command = "python benchmarks/seed_cost.py " + " ".join(shlex.quote(a) for a in argv)
    text = table(rows, command.strip())
    print(text)
    if ns.out:
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.out + ".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
        Path(ns.out + ".md").write_text(text)
    return 0 if rows and all(r.get("verdict") == "correct" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
