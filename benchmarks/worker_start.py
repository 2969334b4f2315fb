"""How long the GPU Worker takes to be ready, with its CUDA init overlapped (the default) and as
it was (serial): spawn -> ready (imports), `warm` (CUDA init), `device_info`, and the first
evaluation of a small PyTorch Task (reference, verify, timing with kept baselines off), each
measured from the caller, alternating the two ways, `--repeat` times each.

  GPU (the H200; about a minute):  python benchmarks/worker_start.py
  Any machine:                     python benchmarks/worker_start.py --device cpu --repeat 1
  N Workers starting at once:      python benchmarks/worker_start.py --at-once 6 [--sandbox on]

Writes benchmarks/results/worker_start.{json,md} (--out-dir elsewhere); with --at-once N,
worker_start_x{N}.{json,md}: the same steps for N Engines started together (each its own Worker
process), which tells whether six benches at once wait on imports (spawn -> ready), on CUDA
init (warm) or on the GPU (first evaluate, which takes the machine-wide turn). Standard library and
kernel_lsp only on the caller's side; the Workers import torch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.engine import protocol  # noqa: E402
from kernel_lsp.engine.caller.client import Engine  # noqa: E402
from kernel_lsp.engine.caller.tasks import find_task  # noqa: E402

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=0.0) * 2.0


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return []
'''


async def one(way: str, device: str, folder: Path, sandbox: str | None = None) -> dict[str, Any]:
    env = {} if way == "overlapped" else {protocol.WORKER_ROLE_ENV: "serial"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "relu2.py"
    path.write_text(TASK)
    task, cand = find_task(str(path), TASK)
    out: dict[str, Any] = {"way": way}
    kw: dict[str, Any] = {} if sandbox is None else {"sandbox": sandbox}
    async with Engine(timeout=300.0, warm=False, env=env, prebuild=False, **kw) as engine:
        engine.see([task])
        t0 = time.monotonic()
        await engine.ping(timeout=300.0)
        out["ready_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        warm = await engine.request("warm", timeout=300.0)
        engine._worker.warm = warm  # type: ignore[union-attr]
        out["warm_s"] = time.monotonic() - t1
        out["early_cuda"] = warm.get("early_cuda")
        t2 = time.monotonic()
        info = await engine.device_info()
        out["device_info_s"] = time.monotonic() - t2
        out["gpu"] = info.get("name")
        t3 = time.monotonic()
        ev = await engine.evaluate(task, cand, options={"device": device, "baselines": False})
        out["evaluate_s"] = time.monotonic() - t3
        out["verdict"] = ev.verdict
        out["phases"] = (ev.evidence or {}).get("phases")
        out["total_s"] = time.monotonic() - t0
    return out


async def run(device: str, repeat: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="klsp-start-") as tmp:
        for i in range(repeat):
            for way in (("overlapped", "serial") if i % 2 == 0 else ("serial", "overlapped")):
                rows.append(await one(way, device, Path(tmp)))
                print(json.dumps(rows[-1], default=str), flush=True)
    return rows


async def at_once(n: int, device: str, sandbox: str | None) -> list[dict[str, Any]]:
    """N Engines started together, each in its own folder: their rows, in the order they ended."""
    with tempfile.TemporaryDirectory(prefix="klsp-start-") as tmp:
        rows = await asyncio.gather(*(one("overlapped", device, Path(tmp) / str(i), sandbox) for i in range(n)))
    for i, row in enumerate(rows):
        row["way"] = f"{n} at once"
        row["index"] = i
        print(json.dumps(row, default=str), flush=True)
    return list(rows)


def markdown_at_once(rows: list[dict[str, Any]], n: int, device: str, sandbox: str | None) -> str:
    cmd = f"python benchmarks/worker_start.py --at-once {n}" + ("" if device == "cuda" else f" --device {device}") \
        + (f" --sandbox {sandbox}" if sandbox else "")
    lines = [f"# {n} GPU Workers starting at once", "", f"{rows[0].get('gpu') if rows else '?'}; `{cmd}`. "
             "All started together; each Engine's own steps, in seconds.", "",
             "| Worker | spawn -> ready | warm | device_info | first evaluate | total | verdict |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['index']} | {r['ready_s']:.2f} | {r['warm_s']:.2f} | {r['device_info_s']:.2f} | "
                     f"{r['evaluate_s']:.2f} | {r['total_s']:.2f} | {r['verdict']} |")
    lines.append("")
    for key, what in (("ready_s", "spawn -> ready"), ("warm_s", "warm"), ("total_s", "total")):
        lines.append(f"- median {what}: {statistics.median(r[key] for r in rows):.2f} s")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]], device: str) -> str:
    lines = ["# GPU Worker start", "", f"{rows[0].get('gpu') if rows else '?'}; `python benchmarks/worker_start.py"
             + ("" if device == "cuda" else f" --device {device}") + "`. Medians (seconds) over the runs.", "",
             "| way | runs | spawn -> ready | warm | device_info | first evaluate | total |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for way in ("serial", "overlapped"):
        mine = [r for r in rows if r["way"] == way]
        if not mine:
            continue

        def med(key: str) -> str:
            return f"{statistics.median(r[key] for r in mine):.2f}"
        lines.append(f"| {way} | {len(mine)} | {med('ready_s')} | {med('warm_s')} | {med('device_info_s')} | "
                     f"{med('evaluate_s')} | {med('total_s')} |")
    lines += ["", "serial: torch import, then CUDA init (warm), then the evaluation modules (at the first request). "
              "overlapped: CUDA's driver and context made in a thread while torch and the evaluation modules "
              "import (kernel_lsp/engine/worker/early.py)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--at-once", type=int, default=0, metavar="N",
                    help="start N Workers together (as N benches at once do) instead of one at a time")
    ap.add_argument("--sandbox", choices=("on", "off", "auto"), default=None,
                    help="the Workers' sandbox (default: the Engine's)")
    ns = ap.parse_args(argv)
    out = Path(ns.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if ns.at_once:
        if ns.at_once < 1:
            ap.error("--at-once wants a positive count")
        rows = asyncio.run(at_once(ns.at_once, ns.device, ns.sandbox))
        stem = f"worker_start_x{ns.at_once}"
        (out / f"{stem}.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
        text = markdown_at_once(rows, ns.at_once, ns.device, ns.sandbox)
        (out / f"{stem}.md").write_text(text)
        print(text)
        return 0 if all(r["verdict"] == "correct" for r in rows) else 1
    rows = asyncio.run(run(ns.device, ns.repeat))
    (out / "worker_start.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    text = markdown(rows, ns.device)
    (out / "worker_start.md").write_text(text)
    print(text)
    return 0 if all(r["verdict"] == "correct" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
