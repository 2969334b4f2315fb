"""What the sandbox costs: per Worker start (target under 50 ms) and per call (target: nothing).

Starts Workers through the real ``WorkerProcess`` with the sandbox off and on, alternating,
and times (a) the start until the Worker's ready line, for a bare Worker (no torch: the
sandbox's own cost stands out) and for the default Worker (torch imported at start), and
(b) the round trip of a ``ping`` request on a warm Worker (nothing in the sandbox sits
between the Worker and its timed region: no seccomp filter, no syscall interposition).

Run: `python benchmarks/sandbox_cost.py [--starts N] [--pings N] [--out-dir DIR]`
(on the GPU machine too, with bwrap on PATH). Writes sandbox_cost.json and sandbox_cost.md
under --out-dir (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_lsp.engine.caller import sandbox  # noqa: E402
from kernel_lsp.engine.caller.process import WorkerProcess, worker_environment  # noqa: E402


async def start_once(mode: str, preload: str | None) -> tuple[float, WorkerProcess]:
    extra = {} if preload is None else {"KERNEL_LSP_WORKER_PRELOAD": preload}
    w = WorkerProcess(sys.executable, worker_environment(extra=extra), str(ROOT), sandbox=mode)
    t0 = time.perf_counter()
    await w.start(300.0)
    return (time.perf_counter() - t0) * 1000.0, w


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    q = statistics.quantiles(values, n=10) if len(values) >= 2 else [values[0]] * 9
    return {"median_ms": statistics.median(values), "p10_ms": q[0], "p90_ms": q[-1],
            "min_ms": values[0], "n": len(values)}


async def measure(starts: int, pings: int, torch_starts: int) -> dict:
    modes = ["off", sandbox.Sandbox()]
    out: dict = {"start": {}, "ping": {}}
    for label, preload, n in (("bare Worker", "", starts), ("default Worker (imports torch)", None, torch_starts)):
        times: dict[str, list[float]] = {"off": [], "bwrap": [], "setup": [], "pid_limit": []}
        for i in range(n + 1):
            for mode in (modes if i % 2 == 0 else modes[::-1]):  # alternate the order
                ms, w = await start_once(mode, preload)
                await w.close()
                if i > 0:  # the first round warms the page cache
                    times["off" if mode == "off" else "bwrap"].append(ms)
                    for key, value in w.sandbox_ms.items():
                        times[key].append(value)
        row = {k: summary(v) for k, v in times.items()}
        row["overhead_ms"] = row["bwrap"]["median_ms"] - row["off"]["median_ms"]
        row["overhead_min_ms"] = row["bwrap"]["min_ms"] - row["off"]["min_ms"]
        # The sandbox's own part of a start: bwrap's namespaces and mounts, then the pid cap.
        row["direct_ms"] = row["setup"]["median_ms"] + row["pid_limit"]["median_ms"]
        out["start"][label] = row
    for mode in modes:
        _, w = await start_once(mode, "")
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            await w.call("ping")
            rtts.append((time.perf_counter() - t0) * 1e6)
        key = "off" if mode == "off" else "bwrap"
        out["ping"][key] = {"median_us": statistics.median(rtts), "min_us": min(rtts), "n": len(rtts)}
        if key == "bwrap":
            out["fences"] = dict(w.fences)
        await w.close()
    out["ping"]["overhead_us"] = out["ping"]["bwrap"]["median_us"] - out["ping"]["off"]["median_us"]
    return out


def machine() -> dict:
    gpu = None
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    st = sandbox.status()
    return {"host": platform.node(), "kernel": platform.release(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "uid": os.geteuid(), "gpu": gpu, "sandbox": st.tool or st.reason}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Sandbox cost ({result['date']})", "",
             f"Machine: {m['host']}, Linux {m['kernel']}, {m['cpus']} CPUs, uid {m['uid']}, "
             f"GPU: {m['gpu'] or 'none'}; {m['sandbox']}. Python {m['python']}.", "",
             "| Worker start | sandbox | median ms | p10 ms | p90 ms | n |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for label, row in result["start"].items():
        for key in ("off", "bwrap"):
            s = row[key]
            lines.append(f"| {label} | {key} | {s['median_ms']:.1f} | {s['p10_ms']:.1f} | {s['p90_ms']:.1f} | {s['n']} |")
    lines += ["", "| Worker start | bwrap setup (median) | pid cap (median) | sandbox's own cost | "
              "A/B difference, medians | A/B difference, minima | target |",
              "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for label, row in result["start"].items():
        lines.append(f"| {label} | {row['setup']['median_ms']:.1f} ms | {row['pid_limit']['median_ms']:.1f} ms | "
                     f"{row['direct_ms']:.1f} ms | {row['overhead_ms']:+.1f} ms | {row['overhead_min_ms']:+.1f} ms "
                     "| < 50 ms |")
    lines += ["", "bwrap setup: from spawning bwrap until the sandbox exists (its info line); pid cap: "
              "nsenter writing the namespace's pid_max. The A/B differences include the noise of "
              "the machine (other jobs share its CPUs)."]
    p = result["ping"]
    lines += ["", "| per call (`ping` round trip) | off | bwrap | overhead |", "| --- | ---: | ---: | ---: |",
              f"| median | {p['off']['median_us']:.0f} us | {p['bwrap']['median_us']:.0f} us | "
              f"{p['overhead_us']:+.0f} us |", "",
              f"Process limit enforced by: {result.get('fences', {}).get('processes', 'n/a')}.",
              "Timed regions run inside the Worker: the sandbox adds no code between a kernel and its "
              "CUDA events (no seccomp filter, no syscall interposition).", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=20, help="bare Worker starts per mode")
    ap.add_argument("--torch-starts", type=int, default=5, help="torch-importing Worker starts per mode")
    ap.add_argument("--pings", type=int, default=500)
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ns = ap.parse_args()
    if not sandbox.status().available:
        print(f"no sandbox here: {sandbox.status().message()}", file=sys.stderr)
        return 2
    result = asyncio.run(measure(ns.starts, ns.pings, ns.torch_starts))
    result["machine"] = machine()
    result["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = Path(ns.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sandbox_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (out / "sandbox_cost.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
