"""`nvcc -c x.cu -o x.o` with its host and device front ends run side by side.

nvcc runs its steps one after another: the host chain (``gcc -E``, ``cudafe++``), then the device
chain (``gcc -E``, ``cicc``, ``ptxas``, ``fatbinary``), then ``gcc -c`` of the host code with the
fat binary embedded. The two chains read the same source and share only the module id, a name that
``cudafe++`` writes to a file and ``cicc`` reads. Written here first, the two chains run at once and
the device unit of a kernel-body edit compiles in the time of the longer chain plus the last
``gcc -c`` (measured in ``benchmarks/results/nvcc_parallel.md``).

The steps are nvcc's own, from ``nvcc --dryrun --keep``: the same tools, flags and files; only
``--gen_module_id_file`` goes (the file is there already). Their output is joined in nvcc's order,
so warnings and ptxas's resource lines read as nvcc prints them. Where the plan is anything else
than the two chains and the last compile (relocatable device code, an unknown step) or any step
fails, plain nvcc runs instead, so a compile error reads exactly as nvcc words it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SERIAL_ENV = "KERNEL_LSP_NVCC_SERIAL"  # set to 1: plain nvcc, one step after another
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_DEVICE_TOOLS = ("cicc", "ptxas", "fatbinary")


@dataclass
class Plan:
    env: dict[str, str]
    host: list[list[str]] = field(default_factory=list)    # gcc -E (no __CUDA_ARCH__), cudafe++
    device: list[list[str]] = field(default_factory=list)  # gcc -E per arch, cicc, ptxas, fatbinary
    last: list[list[str]] = field(default_factory=list)    # gcc -c of the host code
    module_id: str = ""                                      # the file cudafe++ would write


def is_object_compile(cmd: list[str]) -> bool:
    """An ``nvcc -c <one .cu> -o <object>`` this module knows how to split."""
    return (len(cmd) > 4 and os.path.basename(cmd[0]).startswith("nvcc") and "-c" in cmd and cmd[-2] == "-o"
            and cmd[-3].endswith(".cu") and not any(a in ("-rdc=true", "-dc", "--relocatable-device-code=true",
                                                        "-rdc", "--dryrun", "-E", "-M", "-MD") for a in cmd))


def run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """(exit code, output) of the compile ``cmd``, split where it is_object_compile and run as it
    is otherwise; raises subprocess.TimeoutExpired past ``timeout`` and OSError where the compiler
    cannot start, as subprocess.run would."""
    deadline = time.monotonic() + timeout
    if os.environ.get(SERIAL_ENV) != "1" and is_object_compile(cmd):
        keep = Path(tempfile.mkdtemp(prefix="nvcc.", dir=cwd))
        try:
            plan = _plan(cmd, cwd, keep, deadline)
            if plan is not None:
                done = _run_plan(plan, cwd, deadline)
                if done is not None:
                    return 0, done
        finally:
            shutil.rmtree(keep, ignore_errors=True)
    return _serial(cmd, cwd, deadline)


def _serial(cmd: list[str], cwd: Path, deadline: float) -> tuple[int, str]:
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=max(1.0, deadline - time.monotonic()))
    return proc.returncode, proc.stdout or ""


def _plan(cmd: list[str], cwd: Path, keep: Path, deadline: float) -> Plan | None:
    """nvcc's steps for ``cmd``, its intermediate files in ``keep``; None where they are not the
    three parts this module runs."""
    dry = [*cmd[:-2], "--dryrun", "--keep", "--keep-dir", str(keep), *cmd[-2:]]
    try:
        proc = subprocess.run(dry, cwd=cwd, capture_output=True, text=True,
                              timeout=max(1.0, min(30.0, deadline - time.monotonic())))
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    try:
        return _read_plan(proc.stderr + proc.stdout)
    except (ValueError, IndexError):  # a line of another shape than nvcc's of today
        return None


def _read_plan(text: str) -> Plan | None:
    plan = Plan(env=dict(os.environ))
    for raw in text.splitlines():
        if not raw.startswith("#$ "):
            continue
        line = raw[3:].strip()
        assign = _ASSIGN.match(line)
        if assign:
            plan.env[assign.group(1)] = _unquote(assign.group(2))
            continue
        argv = [_expand(a, plan.env) for a in shlex.split(line)]
        if not argv:
            continue
        tool = os.path.basename(argv[0])
        if tool == "rm":
            continue
        if tool == "cudafe++":
            if "--gen_module_id_file" not in argv or plan.device or plan.last:
                return None
            plan.module_id = argv[argv.index("--module_id_file_name") + 1]
            plan.host.append([a for a in argv if a != "--gen_module_id_file"])
        elif tool in _DEVICE_TOOLS:
            if not plan.host or plan.last:
                return None
            plan.device.append(argv)
        elif "-E" in argv and "-o" in argv:
            out = argv[argv.index("-o") + 1]
            if out.endswith(".cpp4.ii") and not plan.host:
                plan.host.append(argv)
            elif out.endswith(".cpp1.ii") and plan.host and not plan.last:
                plan.device.append(argv)
            else:
                return None
        elif "-c" in argv and plan.device:
            plan.last.append(argv)
        else:
            return None  # a step this module does not know (nvlink, a second source): nvcc's own order
    if (len(plan.host) != 2 or os.path.basename(plan.host[1][0]) != "cudafe++" or not plan.device
            or len(plan.last) != 1 or not plan.module_id):
        return None
    return plan


def _unquote(value: str) -> str:
    try:
        return " ".join(shlex.split(value))
    except ValueError:
        return value.strip()


def _expand(arg: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), arg)


def _module_id(source: str, cwd: Path) -> str:
    """A name of nvcc's shape, ``_<hash>_<length>_<file>_<hash>``, unique to this compile."""
    name = re.sub(r"\W", "_", os.path.basename(source))
    seed = f"{(cwd / source).resolve()}:{os.getpid()}:{threading.get_ident()}:{time.time_ns()}".encode()
    digest = hashlib.sha256(seed).hexdigest()
    return f"_{digest[:8]}_{len(name)}_{name}_{digest[8:16]}"


def _run_plan(plan: Plan, cwd: Path, deadline: float) -> str | None:
    """nvcc's output where every step passed, None where one failed or ran out of time (the
    other chain is stopped then: plain nvcc runs next, for its own words)."""
    source = plan.host[0][plan.host[0].index("-o") - 1]
    Path(plan.module_id).write_text(_module_id(source, cwd))
    outputs: dict[str, str] = {}
    running: list[subprocess.Popen[str]] = []
    failed = threading.Event()
    lock = threading.Lock()

    def stop() -> None:
        failed.set()
        with lock:
            for p in running:
                if p.poll() is None:
                    p.kill()

    def chain(name: str, steps: list[list[str]]) -> None:
        text = []
        for argv in steps:
            with lock:
                if failed.is_set():
                    return
                try:
                    p = subprocess.Popen(argv, cwd=cwd, env=plan.env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
                except OSError:
                    failed.set()
                    return
                running.append(p)
            try:
                out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop()
                p.communicate()
                return
            if p.returncode != 0:
                stop()
                return
            text.append(out or "")
        outputs[name] = "".join(text)

    threads = [threading.Thread(target=chain, args=(n, s), daemon=True)
               for n, s in (("host", plan.host), ("device", plan.device))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # each step's communicate() is bounded by the deadline
    if failed.is_set() or len(outputs) != 2:
        return None
    chain("last", plan.last)
    if "last" not in outputs:
        return None
    return f"{outputs['host']}{outputs['device']}{outputs['last']}"
