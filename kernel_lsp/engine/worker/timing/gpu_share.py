"""Is anyone else using this GPU while we time?

GPUs in labs and clusters are shared, and a wider Search runs several Workers per GPU. Other
processes' work slows our timings and widens their spread; it never makes a candidate wrong,
so it is reported on the Evaluation (`shared_gpu`), not flagged against the candidate.

The process list comes from NVML (`pynvml`, from the nvidia-ml-py package) when it imports,
else from `nvidia-smi --query-compute-apps`. In a container the listed PIDs may be the host's:
when this process's PID is never among them, one of the listed processes is taken to be us.
A driver that hides processes of other PID namespaces (other containers) hides their use of
the GPU too: then "not shared" means "no other process seen", and the spread still tells.
Standard library only at import; torch is asked for the device's UUID.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from typing import Any, Callable


def _norm(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def parse_smi_apps(text: str, uuid: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
    --format=csv,noheader,nounits` that belong to the GPU `uuid`."""
    out = []
    want = _norm(uuid)
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or _norm(parts[0]) != want:
            continue
        try:
            pid = int(parts[1])
        except ValueError:
            continue
        try:
            memory: float | None = float(parts[3])
        except ValueError:
            memory = None  # "[N/A]", "[Insufficient Permissions]"
        out.append({"pid": pid, "name": parts[2], "memory_mib": memory})
    return out


def _nvml(uuid: str) -> list[dict[str, Any]] | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID("GPU-" + _norm(uuid))
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # NVML present but unusable here: try nvidia-smi
        return None
    out = []
    for p in procs:
        try:
            name = pynvml.nvmlSystemGetProcessName(p.pid)
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            name = ""
        memory = getattr(p, "usedGpuMemory", None)
        out.append({"pid": int(p.pid), "name": os.path.basename(name),
                    "memory_mib": memory / (1 << 20) if isinstance(memory, int) else None})
    return out


def _smi(uuid: str) -> list[dict[str, Any]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return parse_smi_apps(proc.stdout, uuid)


def query_processes(uuid: str) -> tuple[str, list[dict[str, Any]]] | None:
    """(source, processes with a compute context on the GPU `uuid`), or None when unknown."""
    got = _nvml(uuid)
    if got is not None:
        return "nvml", got
    got = _smi(uuid)
    if got is not None:
        return "nvidia-smi", got
    return None


class Watch:
    """Samples the GPU's process list (at the start, on `sample()`, at `finish()`)."""

    def __init__(self, device: Any, uuid: str | None = None, own_pid: int | None = None) -> None:
        self.uuid = uuid if uuid is not None else _device_uuid(device)
        self.own_pid = own_pid if own_pid is not None else os.getpid()
        self.samples: list[list[dict[str, Any]]] = []
        self.source: str | None = None
        self.sample()

    def sample(self) -> None:
        if not self.uuid:
            return
        got = query_processes(self.uuid)
        if got is None:
            return
        self.source, procs = got
        self.samples.append(procs)

    def finish(self) -> dict[str, Any] | None:
        """None when no other process was seen (or nothing could be asked); else the report."""
        self.sample()
        return shared_report(self.samples, self.own_pid, self.source or "")


def _ancestors(pid: int, limit: int = 32) -> list[int]:
    """pid's parent chain from /proc (empty where /proc cannot tell)."""
    out = []
    for _ in range(limit):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            break
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 2:
            break
        pid = int(fields[1])
        if pid <= 1:
            break
        out.append(pid)
    return out


def shared_report(samples: list[list[dict[str, Any]]], own_pid: int, source: str,
                  ancestors: Any = _ancestors) -> dict[str, Any] | None:
    """Other processes seen in `samples`: neither this process nor one it started (a compile
    pool's worker is ours)."""
    if not samples:
        return None
    ours_listed = any(p["pid"] == own_pid for procs in samples for p in procs)
    others: dict[int, dict[str, Any]] = {}
    count = 0
    for procs in samples:
        if ours_listed:
            theirs = [p for p in procs if p["pid"] != own_pid and own_pid not in ancestors(p["pid"])]
        else:
            theirs = list(procs)  # host PIDs: one of them is this Worker
        for p in theirs:
            others.setdefault(p["pid"], p)
        count = max(count, len(theirs) if ours_listed else max(0, len(procs) - 1))
    if count == 0:
        return None
    report: dict[str, Any] = {"count": count, "processes": list(others.values())[:16], "source": source}
    if not ours_listed:
        report["note"] = "PIDs from another namespace: one of the listed processes is this Worker"
    return report


def _device_uuid(device: Any) -> str | None:
    if getattr(device, "type", None) != "cuda":
        return None
    try:
        import torch

        props = torch.cuda.get_device_properties(device)
        uuid = getattr(props, "uuid", None)
        return str(uuid) if uuid is not None else None
    except Exception:
        return None


# -- out of memory on a shared GPU ---------------------------------------------------------------
# An out-of-memory error while other processes hold the GPU's memory says nothing about the
# candidate: it is "could not run" (not_run, exit 2), retried once if their memory frees.

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_REQUEST = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
# Seconds an out-of-memory evaluation waits for other processes' memory to free before it
# gives up (bounded further by what is left of the caller's deadline), and how often it looks.
SHARED_OOM_WAIT_S = 60.0
SHARED_OOM_POLL_S = 0.5


def requested_bytes(message: str) -> int | None:
    """The allocation torch's out-of-memory message says failed ("Tried to allocate 2.00 GiB")."""
    m = _REQUEST.search(message or "")
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


_HOLDER = re.compile(r"Process (\d+) has ([\d.]+) (B|KiB|MiB|GiB|TiB) memory in use")


def holders_in_message(message: str) -> list[dict[str, Any]]:
    """The other processes torch's out-of-memory message names ("Process 807 has 131.79 GiB
    memory in use"; torch asks NVML with the host's pids). The fallback where this Worker cannot
    list them itself: on the H200 (gVisor, sandboxed Worker) the listing came back empty while
    torch's message named the holder."""
    out = []
    for pid, amount, unit in _HOLDER.findall(message or ""):
        out.append({"pid": int(pid), "name": "", "memory_mib": round(float(amount) * _UNITS[unit] / (1 << 20), 1)})
    return out


def others_holding(device: Any, own_pid: int | None = None) -> tuple[str, list[dict[str, Any]]] | None:
    """(source, the other processes with memory on this GPU), or None when it cannot be asked
    (a CPU, no NVML nor nvidia-smi). This process and the ones it started are not others."""
    uuid = _device_uuid(device)
    if not uuid:
        return None
    got = query_processes(uuid)
    if got is None:
        return None
    source, procs = got
    report = shared_report([procs], own_pid if own_pid is not None else os.getpid(), source)
    theirs = [p for p in (report or {}).get("processes", []) if (p.get("memory_mib") or 0) > 0]
    if report and report.get("note") and theirs:
        # PIDs of another namespace: one of them is this Worker; drop the one whose memory is
        # closest to what this process holds (its cached blocks plus a CUDA context).
        own = _own_mib(device)
        if own is not None:
            theirs.remove(min(theirs, key=lambda p: abs((p.get("memory_mib") or 0) - own)))
    return source, theirs


CONTEXT_MIB = 512  # about what a CUDA context with torch's kernels loaded holds on an H200


def _own_mib(device: Any) -> float | None:
    try:
        import torch

        return torch.cuda.memory_reserved(device) / (1 << 20) + CONTEXT_MIB
    except Exception:
        return None


# Memory the process list does not show: a Worker in its own PID namespace (the sandbox) lists
# no other process, and torch's message names none. What is taken beyond this Worker's own
# (its allocator's reserve and a CUDA context) is then another process's; above this much it is
# blamed on them. The margin covers a context larger than CONTEXT_MIB (cuBLAS workspaces,
# loaded kernels). Four sandboxed benches on an H100: 4.85 GiB free of 79, this Worker 6.6 GiB,
# so 67.7 GiB held by the others, none of them listed (2026-12-05).
UNSEEN_MIN_BYTES = 2 << 30
UNSEEN_NAME = "other processes this Worker cannot list (free memory says so)"


def unseen_holding(device: Any) -> list[dict[str, Any]]:
    """[one entry with the memory other processes hold beyond what this Worker holds], from free
    and total memory, when that is above UNSEEN_MIN_BYTES; else [] (also when torch cannot tell)."""
    free = free_bytes(device)  # after this process's cached blocks went back
    try:
        import torch

        total = int(torch.cuda.mem_get_info(device)[1])
    except Exception:
        return []
    own = _own_mib(device)
    if free is None or own is None:
        return []
    rest = total - free - int(own * (1 << 20))
    if rest < UNSEEN_MIN_BYTES:
        return []
    return [{"pid": None, "name": UNSEEN_NAME, "memory_mib": round(rest / (1 << 20), 1)}]


def holders(device: Any, message: str) -> tuple[str, list[dict[str, Any]]] | None:
    """(source, the other processes holding this GPU's memory) after an out-of-memory `message`:
    the process list, else the ones torch's message names, else free memory's estimate
    (unseen_holding); None when none of them can be asked."""
    seen = others_holding(device)
    if seen and seen[1]:
        return seen
    named = holders_in_message(message)
    if named:
        return "torch's out-of-memory message", named
    unseen = unseen_holding(device)
    return ("free memory", unseen) if unseen else seen


def held_bytes(processes: list[dict[str, Any]]) -> int:
    return int(sum((p.get("memory_mib") or 0) for p in processes) * (1 << 20))


def blames_others(message: str, processes: list[dict[str, Any]], free_bytes: int | None) -> bool:
    """Would the failed allocation have fit without the others' memory? Unknown request: yes
    when they hold any. A request beyond free memory plus all they hold is the candidate's own."""
    held = held_bytes(processes)
    if held <= 0:
        return False
    want = requested_bytes(message)
    if want is None or free_bytes is None:
        return True
    return want <= free_bytes + held


def wait_for_memory(need: int | None, held_at_oom: int, wait_s: float,
                    free_now: Callable[[], int | None], held_now: Callable[[], int | None],
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> tuple[bool, float]:
    """(freed, seconds waited): freed once the request fits in free memory, or the others hold
    at most half of what they held at the error (or are gone); gives up after `wait_s`."""
    t0 = clock()
    while True:
        free, held = free_now(), held_now()
        if need is not None and free is not None and free >= need * 1.05:
            return True, clock() - t0
        if held is not None and held <= held_at_oom // 2:
            return True, clock() - t0
        if clock() - t0 >= wait_s:
            return False, clock() - t0
        sleep(min(SHARED_OOM_POLL_S, max(0.0, wait_s - (clock() - t0))))


def free_bytes(device: Any) -> int | None:
    """Free memory on the GPU now, after handing this process's cached blocks back."""
    try:
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
        return int(torch.cuda.mem_get_info(device)[0])
    except Exception:
        return None
