"""`kernel-lsp bench PATH...` and `kernel-lsp profile PATH...` (wired in kernel_lsp/cli/__init__.py).

Caller side: no torch here; everything runs in a Worker through `Engine`. A file with only
a reference (no ModelNew, no .cu) is timed alone (eager and torch.compile). Without a GPU the
CLI says so and runs what can run on the CPU (.cu files are only built).
Exit status: 0 when every candidate is correct (or a reference was timed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, TextIO

from kernel_lsp.engine.tasks import TaskError, find_task
from kernel_lsp.model import Candidate, Evaluation, Task

_SUFFIXES = (".py", ".cu")


def _expand(paths: list[str]) -> list[str]:
    """Files named, plus the .py/.cu files under folders named (sorted, hidden folders skipped)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
                out += [os.path.join(root, f) for f in sorted(files) if f.endswith(_SUFFIXES)]
        else:
            out.append(p)
    return out


def _targets(paths: list[str], explicit: set[str]) -> list[tuple[str, Task | None, Candidate | None, str]]:
    """(path, task, candidate, error). Files in folders that are not Tasks are skipped silently;
    a file named on the command line that is not a Task is an error row."""
    rows: list[tuple[str, Task | None, Candidate | None, str]] = []
    seen: set[tuple[str, str]] = set()
    for path in paths:
        try:
            task, cand = find_task(path)
        except TaskError as exc:
            if path in explicit:
                rows.append((path, None, None, str(exc)))
            continue
        key = (task.reference_path, cand.id if cand else "reference")
        if key in seen:  # foo.cu and its harness foo.py are one target
            continue
        seen.add(key)
        rows.append((path, task, cand, ""))
    return rows


def _options(ns: argparse.Namespace, gpu: bool) -> dict[str, Any]:
    opts: dict[str, Any] = {"compile_mode": getattr(ns, "compile_mode", "default") or "default"}
    if not gpu:
        opts["device"] = "cpu"
    return opts


async def _executor(ns: argparse.Namespace, timeout: float) -> Any:
    """The Executor the settings and --executor / --ray-address ask for (ExecutorUnavailable: exit 2)."""
    from kernel_lsp.engine.executor import executor_settings, open_executor

    try:
        from kernel_lsp.config import load_settings

        settings = load_settings(os.getcwd())
    except Exception:  # settings are optional for the CLI; defaults apply
        settings = None
    return await open_executor(timeout=timeout, **executor_settings(settings, ns))


def _unavailable(command: str, exc: Exception) -> int:
    print(f"kernel-lsp {command}: {exc}", file=sys.stderr)
    return 2


async def _bench(ns: argparse.Namespace, err: TextIO) -> tuple[list[Evaluation], dict[str, Any], list[str]]:
    paths = _expand(list(ns.paths))
    rows = _targets(paths, set(ns.paths))
    evs: list[Evaluation] = []
    names = [os.path.basename(path) for path, *_ in rows]
    timeout = float(getattr(ns, "timeout", 300.0) or 300.0)
    async with await _executor(ns, timeout) as engine:
        info = await engine.device_info()
        gpu = bool(info.get("cuda"))
        if not gpu:
            print("kernel-lsp: no CUDA GPU visible: verifying and timing PyTorch tasks on the CPU; "
                  ".cu files are only built", file=err)
        opts = _options(ns, gpu)
        for path, task, cand, error in rows:
            if task is None:
                evs.append(Evaluation(task=os.path.basename(path), candidate="", verdict="error",
                                      correct=None, message=error))
                continue
            if cand is None:  # a reference alone: time eager and torch.compile
                cand = Candidate(source=task.reference_source, kind="python", origin="reference")
                checks: tuple[str, ...] = ("compile", "bench")
            elif cand.kind == "cuda" and not gpu:
                checks = ("compile",)
            else:
                checks = ("compile", "verify", "bench")
            evs.append(await engine.evaluate(task, cand, checks, timeout=timeout, options=opts))
    return evs, info, names


def _ok(ev: Evaluation) -> bool:
    return ev.verdict == "correct" or (ev.verdict == "not_run" and ev.candidate == "reference") or (
        ev.verdict == "not_run" and ev.compile is not None and ev.compile.ok)


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x:.4g}")


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def bench_main(ns: argparse.Namespace) -> int:
    from kernel_lsp.engine.executor import ExecutorUnavailable

    out, err = sys.stdout, sys.stderr
    try:
        evs, info, names = asyncio.run(_bench(ns, err))
    except KeyboardInterrupt:
        return 130
    except ExecutorUnavailable as exc:
        return _unavailable("bench", exc)
    if getattr(ns, "json", False):
        json.dump({"targets": [ev.summary() for ev in evs]}, out, indent=2, default=str)
        out.write("\n")
    else:
        _bench_table(evs, info, names, out)
    return 0 if evs and all(_ok(ev) for ev in evs) else 1


def _bench_table(evs: list[Evaluation], info: dict[str, Any], names: list[str], out: TextIO) -> None:
    from kernel_lsp.cli.console import console as make_console
    from rich.table import Table

    console = make_console(file=out)
    where = info.get("name") or "cpu"
    clocks = f", SM {info['sm_clock_mhz']:.0f} MHz" if isinstance(info.get("sm_clock_mhz"), (int, float)) else ""
    table = Table(title=f"kernel-lsp bench on {where}{clocks}", title_justify="left")
    for col in ("file", "verdict", "ms", "eager ms", "compile ms", "vs eager", "vs compile", "spread", "flags"):
        left = col in ("file", "verdict", "flags")
        table.add_column(col, justify="left" if left else "right", no_wrap=col in ("file", "verdict"))
    for name, ev in zip(names, evs):
        color = "green" if ev.verdict == "correct" else ("yellow" if ev.verdict == "not_run" else "red")
        flags = [f for f in ev.flags if f != "not_counted"]
        table.add_row(name, f"[{color}]{ev.verdict}[/{color}]", _ms(ev.time.median_ms if ev.time else None),
                      _ms(ev.eager.median_ms if ev.eager else None),
                      _ms(ev.compiled.median_ms if ev.compiled else None),
                      "-" if "not_counted" in ev.flags else _x(ev.speedup_eager),
                      "-" if "not_counted" in ev.flags else _x(ev.speedup_compile),
                      f"{ev.time.spread_pct:.1f}%" if ev.time else "-", ", ".join(flags))
    console.print(table)
    for name, ev in zip(names, evs):
        if ev.message:
            console.print(f"[bold]{name}[/bold]: {ev.message}", soft_wrap=True)
        ev_where = (ev.evidence or {}).get("where")
        if ev.verdict not in ("correct", "not_run") and ev_where is not None:
            e = ev.evidence or {}
            console.print(f"  {e.get('output', 'output')}[{', '.join(map(str, ev_where))}] on input set "
                          f"{e.get('input_set')}: got {e.get('got')}, expected {e.get('expected')}")
        for note in (ev.evidence or {}).get("notes", []):
            console.print(f"  note: {note}", soft_wrap=True)
        if ev.executor != "local":
            console.print(f"  ran on {ev.executor}: {ev.node or 'unknown node'}", soft_wrap=True, highlight=False)


async def _profile(ns: argparse.Namespace, err: TextIO) -> list[dict[str, Any]]:
    rows = _targets(_expand(list(ns.paths)), set(ns.paths))
    timeout = float(getattr(ns, "timeout", 300.0) or 300.0)
    results: list[dict[str, Any]] = []
    async with await _executor(ns, timeout) as engine:
        info = await engine.device_info()
        gpu = bool(info.get("cuda"))
        if not gpu:
            print("kernel-lsp: no CUDA GPU visible: profiling PyTorch ops on the CPU; "
                  "Nsight Compute needs a GPU", file=err)
        opts = _options(ns, gpu)
        for path, task, cand, error in rows:
            if task is None:
                results.append({"target": os.path.basename(path), "error": error})
                continue
            prof = await engine.profile(task, cand, timeout=timeout, options=opts)
            results.append({"target": task.name, "candidate": cand.id if cand else None, "profile": prof})
    return results


def profile_main(ns: argparse.Namespace) -> int:
    from kernel_lsp.engine.executor import ExecutorUnavailable

    out, err = sys.stdout, sys.stderr
    try:
        results = asyncio.run(_profile(ns, err))
    except KeyboardInterrupt:
        return 130
    except ExecutorUnavailable as exc:
        return _unavailable("profile", exc)
    if getattr(ns, "json", False):
        json.dump({"targets": results}, out, indent=2, default=str)
        out.write("\n")
    else:
        _profile_tables(results, out)
    return 0 if results and all("error" not in r and "verdict" not in r.get("profile", {}) for r in results) else 1


def _profile_tables(results: list[dict[str, Any]], out: TextIO) -> None:
    from kernel_lsp.cli.console import console as make_console
    from rich.table import Table

    console = make_console(file=out)
    for r in results:
        prof = r.get("profile") or {}
        if "error" in r or "error" in prof:
            console.print(f"[bold]{r['target']}[/bold]: [red]{r.get('error') or prof.get('error')}[/red]")
            continue
        if "verdict" in prof:  # nothing could be profiled (e.g. a .cu without a GPU)
            console.print(f"[bold]{r['target']}[/bold]: {prof['verdict']}: {prof.get('message', '')}", soft_wrap=True)
            continue
        for side in ("reference", "candidate"):
            part = prof.get(side)
            if not part:
                continue
            if part.get("kernels"):
                t = Table(title=f"{r['target']} {side}: Nsight Compute", title_justify="left")
                for col in ("kernel", "ms", "DRAM %", "SM %", "occupancy %", "regs", "limiter"):
                    t.add_column(col, justify="left" if col in ("kernel", "limiter") else "right")
                for k in part["kernels"]:
                    t.add_row(str(k.get("kernel", ""))[:60], _ms(k.get("duration_ms")), _ms(k.get("dram_pct")),
                              _ms(k.get("sm_pct")), _ms(k.get("achieved_occupancy_pct")),
                              _ms(k.get("registers")), str(k.get("limiter", "")))
                console.print(t)
            elif part.get("ops"):
                t = Table(title=f"{r['target']} {side}: hot ops ({part.get('time', '')} time)", title_justify="left")
                for col in ("op", "share", "us/call", "calls"):
                    t.add_column(col, justify="left" if col == "op" else "right")
                for op in part["ops"]:
                    t.add_row(str(op["name"])[:60], f"{op['share_pct']:.1f}%", f"{op['self_us']:.1f}", str(op["count"]))
                console.print(t)
            if part.get("note"):
                console.print(f"  note ({side}): {part['note']}", soft_wrap=True)
