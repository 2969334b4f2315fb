"""Where the time goes.

* `hot_ops(fn, inputs, device)`: torch.profiler over a few calls; the top ops by self time
  (device time on CUDA, CPU time otherwise) with their share and call count.
* `ncu_profile(task, candidate, options)`: Nsight Compute on a small child script that builds
  the Candidate and calls it once between cudaProfilerStart/Stop (`--profile-from-start off`,
  `--clock-control none` so clocks stay as the benchmark saw them). Per kernel: duration,
  DRAM and SM throughput (% of peak), achieved and theoretical occupancy, registers, shared
  memory, grid/block and waves, cache hit rates, DRAM bytes, the sectors a global load uses,
  shared-memory bank conflicts, tensor-pipe use, the main warp stalls, and the limiting unit;
  summarized per kernel name (calls, total time, share), the hottest first. An ncu that does not
  know one of the extra metrics is run again with the base set. Without `ncu` on PATH or without
  a GPU: a dict with a clear `note`.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from kernel_lsp.model import Candidate, Task

NCU_METRICS = {
    "gpu__time_duration.sum": "duration",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "launch__registers_per_thread": "registers",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
}
# What a kernel engineer reads next: why the memory or the SM is busy (or idle).
NCU_EXTRA_METRICS = {
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__waves_per_multiprocessor": "waves_per_sm",
    "launch__shared_mem_per_block_static": "static_shared_bytes",
    "launch__shared_mem_per_block_dynamic": "dynamic_shared_bytes",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "lts__t_sector_hit_rate.pct": "l2_hit_pct",
    "l1tex__t_sector_hit_rate.pct": "l1_hit_pct",
    "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": "global_load_sector_use_pct",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "shared_bank_conflicts",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pipe_pct",
    "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct": "stall_memory_dependency_pct",
    "smsp__warp_issue_stalled_barrier_per_warp_active.pct": "stall_barrier_pct",
    "smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct": "stall_math_pipe_pct",
}
_ALL_METRICS = {**NCU_METRICS, **NCU_EXTRA_METRICS}


_TIME_UNITS_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
                  "second": 1e3, "s": 1e3}


def hot_ops(fn: Callable[..., Any], inputs: list[Any], device: torch.device | str, top: int = 10,
            calls: int = 3) -> dict[str, Any]:
    device = torch.device(device)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with torch.no_grad():
        fn(*inputs)  # warm-up outside the trace (lazy init, autotuning)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        with profile(activities=activities) as prof:
            for _ in range(calls):
                fn(*inputs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    on_device = device.type == "cuda"
    rows = []
    for evt in prof.key_averages():
        self_us = float(getattr(evt, "self_device_time_total", 0.0) or getattr(evt, "self_cuda_time_total", 0.0)) \
            if on_device else float(evt.self_cpu_time_total)
        if self_us <= 0:
            continue
        rows.append({"name": evt.key, "self_us": self_us / calls, "count": int(evt.count) // calls or 1})
    total = sum(r["self_us"] for r in rows) or 1.0
    rows.sort(key=lambda r: r["self_us"], reverse=True)
    for r in rows:
        r["share_pct"] = 100.0 * r["self_us"] / total
    return {"tool": "torch.profiler", "time": "device" if on_device else "cpu",
            "total_us": total, "ops": rows[:top]}


def limiting_unit(dram_pct: float | None, sm_pct: float | None) -> str:
    """Speed-of-light reading: the busier unit limits, unless neither is busy (latency)."""
    d, s = dram_pct or 0.0, sm_pct or 0.0
    if max(d, s) < 60.0:
        return "latency"
    return "memory" if d >= s else "compute"


def parse_ncu_csv(text: str) -> list[dict[str, Any]]:
    """Kernels from `ncu --csv --metrics ...` output (one row per kernel x metric)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    kernels: dict[str, dict[str, Any]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        kid = row.get("ID", "")
        name = row.get("Kernel Name", "")
        metric = row.get("Metric Name", "")
        if not metric:
            continue
        k = kernels.setdefault(kid, {"id": kid, "kernel": name})
        key = _ALL_METRICS.get(metric, metric)
        raw = (row.get("Metric Value") or "").replace(",", "")
        try:
            value: Any = float(raw)
        except ValueError:
            value = raw
        unit = row.get("Metric Unit", "")
        if key == "duration" and isinstance(value, float):
            value = value * _TIME_UNITS_MS.get(unit, 1e-6)
            key = "duration_ms"
        k[key] = value
    out = list(kernels.values())
    for k in out:
        k["limiter"] = limiting_unit(k.get("dram_pct"), k.get("sm_pct"))
    return out


_CHILD = r"""
import json, sys
import torch
from kernel_lsp.model import Task, Candidate
from kernel_lsp.engine.worker.harness import Harness
from kernel_lsp.engine.worker.timing.profile import _child_builder
job = json.load(open(sys.argv[1]))
task = Task.from_dict(job["task"])
cand = Candidate.from_dict(job["candidate"]) if job["candidate"] else None
h = Harness(task, cand, _child_builder(), device="cuda", seed=job["seed"])
h.build_model()
fn = h.model
if cand is not None:
    fn, res = h.build_candidate()
    if fn is None:
        sys.exit("candidate did not build: " + res.log[-500:])
inputs = h.make_inputs(job["seed"]).values
with torch.no_grad():
    fn(*inputs); torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn(*inputs); torch.cuda.synchronize()
    torch.cuda.profiler.stop()
"""


def _child_builder() -> Any:
    """The Worker's build cache: the module kernel_lsp.engine.worker.build.build (load_python, load_cuda)."""
    from kernel_lsp.engine.worker.build import build

    return build


def find_ncu() -> str | None:
    """ncu on PATH, else the toolkit's bin, else an NsightCompute folder of a toolkit."""
    found = shutil.which("ncu") or shutil.which("ncu", path="/usr/local/cuda/bin")
    if found:
        return found
    for hit in sorted(glob.glob("/usr/local/cuda*/NsightCompute*/ncu"), reverse=True):
        if os.access(hit, os.X_OK):
            return hit
    return None


def summarize(kernels: list[dict[str, Any]], top: int = 8) -> dict[str, Any]:
    """Per kernel name, the hottest first: calls, total and mean time, share of the profiled
    time, and the metrics of its longest launch; beyond `top` names, a count and their time
    (never a kernel cut in the middle)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for k in kernels:
        groups.setdefault(str(k.get("kernel", "?")), []).append(k)
    total = sum(float(k.get("duration_ms") or 0.0) for k in kernels) or 0.0
    rows = []
    for name, launches in groups.items():
        spent = sum(float(k.get("duration_ms") or 0.0) for k in launches)
        longest = max(launches, key=lambda k: float(k.get("duration_ms") or 0.0))
        row = {"kernel": name, "calls": len(launches), "total_ms": round(spent, 6),
               "share_pct": round(100.0 * spent / total, 1) if total else None}
        row.update({k: v for k, v in longest.items() if k not in ("id", "kernel", "duration_ms")})
        row["duration_ms"] = spent / len(launches)  # per call, as one launch reads
        rows.append(row)
    rows.sort(key=lambda r: -r["total_ms"])
    out: dict[str, Any] = {"kernels": rows[:top], "total_ms": round(total, 6), "launches": len(kernels)}
    if len(rows) > top:
        rest = rows[top:]
        out["other_kernels"] = {"names": len(rest), "total_ms": round(sum(r["total_ms"] for r in rest), 6)}
    return out


def ncu_profile(task: Task, candidate: Candidate | None, options: dict[str, Any]) -> dict[str, Any]:
    ncu = find_ncu()
    if ncu is None:
        return {"tool": "ncu", "note": "Nsight Compute (ncu) is not on PATH: no per-kernel hardware counters"}
    if not torch.cuda.is_available():
        return {"tool": "ncu", "note": "no CUDA GPU: Nsight Compute needs one"}
    timeout = float(options.get("profile_timeout", 300))
    with tempfile.TemporaryDirectory(prefix="klsp-ncu-") as tmp:
        job = os.path.join(tmp, "job.json")
        script = os.path.join(tmp, "child.py")
        with open(job, "w") as fh:
            json.dump({"task": task.to_dict(), "candidate": candidate.to_dict() if candidate else None,
                       "seed": int(options.get("seed", 42))}, fh)
        with open(script, "w") as fh:
            fh.write(_CHILD)
        env = dict(os.environ)
        # the folder that holds kernel_lsp/ (this file is kernel_lsp/engine/worker/timing/profile.py)
        root = Path(os.path.abspath(__file__)).parents[4]
        env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
        dropped = ""
        for metrics in (_ALL_METRICS, NCU_METRICS):
            cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
                   "--csv", "--print-units", "base", "--metrics", ",".join(metrics), sys.executable, script, job]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            except subprocess.TimeoutExpired:
                return {"tool": "ncu", "note": f"ncu ran past {timeout:.0f} s", "command": cmd}
            if "failed to find metric" not in (proc.stdout + proc.stderr).lower() or metrics is NCU_METRICS:
                break
            dropped = "this ncu does not know some of the extra metrics: the base set only"
    kernels = parse_ncu_csv(proc.stdout)
    result: dict[str, Any] = {"tool": "ncu", **summarize(kernels),
                              "command": " ".join(cmd[:-2]) + " child.py job.json"}
    if dropped:
        result["metrics_note"] = dropped
    if proc.returncode != 0 or not kernels:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
        result["note"] = f"ncu exited {proc.returncode} with {len(kernels)} kernels: " + " | ".join(tail)
    return result
