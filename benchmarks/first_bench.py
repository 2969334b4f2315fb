"""The first number of a new Task, as a user gets it from `kernel-lsp bench` (issue 33).

    python benchmarks/first_bench.py [TASK.py ...] [--parallel 6] [--modes fresh,warm]
                                     [--corpus N] [--out-dir benchmarks/results] [--smoke]

Each TASK is a KernelBench-format file: a candidate (``foo_new.py`` beside ``foo.py``, or a file
holding ``Model`` and ``ModelNew``). Default: six of the project's Tasks at three sizes (DEFAULT_TASKS:
2 and 16 MiB PyTorch rewrites, three 64 MiB load_inline kernels, and KernelBench level 1's largest,
its current Softmax, 6 GiB); ``--corpus N`` adds the first N pairs of the git-ignored corpus
(``benchmarks/corpus/inline_build``, made by ``gather_inline_corpus.py``). ``--modes fresh`` and
``--modes warm`` may run separately: the second run keeps the first's scenarios in the results when
the Tasks are the same.

Each bench is the user's command, ``python -m kernel_lsp.cli bench <copy> --json --timings``, run in a
folder of its own (a new workspace: no kept baselines, a new Task), first one at a time ("alone"),
then all at once, ``--parallel`` processes at a time ("parallel"). Two machine states:

- ``fresh``: an empty build cache (``KERNEL_LSP_CACHE``), an empty torch.compile cache
  (``TORCHINDUCTOR_CACHE_DIR``), no kept Worker (``KERNEL_LSP_KEEP_WORKER=0``), as on a new machine;
- ``warm``: a build cache, inductor cache and kept Worker that one warm-up bench of another Task
  (``benchmarks/tasks/elu_new.py``) made first, as on a machine in use; before the parallel part,
  ``--parallel`` warm-up benches at once, so as many Workers are kept as such a user has.

For every bench: wall seconds, the phases ``--timings`` reports, when the verdict and eager
ratio came (the CLI's "early result" mark in ``timings.marks``; without one, the complete result,
as when baselines were kept; ``--verdict-pattern`` on stderr only where the JSON is unreadable),
and the exit status. Then the issue's targets, pass/fail:

- alone, warm: verdict and eager ratio within 8 s; complete within 15 s below 1 GiB of inputs,
  30 s for the largest;
- parallel: the whole set within 1.3x the sum of the alone GPU time (the benches' "evaluating"
  spans, inside the GPU turn) plus one build (the longest alone build span); no bench past 3x its
  alone wall.

A number that could not be read is "n/a", and its target "unknown", never a pass. ``--smoke``: a
tiny CPU Task, no GPU (CUDA hidden), two processes: checks that this script runs (the CPU suite
does, tests/benchmarks/test_first_bench.py). Results: ``first_bench.md`` and ``first_bench.json``
under ``--out-dir`` (``first_bench_smoke.*`` for ``--smoke``), with the command line, rewritten after
every bench: until all are done both say ``partial`` ("N of M benches done"), so a run killed at a
time cap keeps every bench it finished; a SIGTERM (``timeout``) writes them and exits 143. stderr
has one line per bench as it ends (wall, verdict, x eager, x compile, exit status).
``--corpus-only`` writes ``first_bench_corpus.*`` (what benchmarks/speed_of_light_table.py reads).

``--resume``: a run cut short goes on where it stopped. The alone benches that an earlier run of
the same mode finished with a verdict, on the same Tasks and the same GPU, are kept (marked
``resumed``) and not run again. The warm-up bench still runs first, so the machine is warm for the
rest. The parallel part always runs whole: its makespan is one run's. So a device call of a few
minutes at a time can measure the whole corpus alone.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as _dt
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Six Tasks, one per process at six at once: sizes of inputs beside each (what a bench moves).
DEFAULT_TASKS = [
    ("small", "benchmarks/accuracy_suite/layernorm_twopass.py"),  # 2 MiB, a PyTorch rewrite
    ("small", "benchmarks/accuracy_suite/kahan_sum.py"),          # 16 MiB, a PyTorch rewrite
    ("medium", "benchmarks/tasks/relu_new.py"),                   # 64 MiB, a load_inline kernel
    ("medium", "benchmarks/tasks/gelu_tanh_new.py"),              # 64 MiB, a load_inline kernel
    ("medium", "examples/row_softmax_inline.py"),                 # 64 MiB, a load_inline kernel
    ("largest", "benchmarks/accuracy_suite/softmax_largest.py"),  # 6 GiB: KernelBench level 1's current Softmax
]
WARMUP_TASK = "benchmarks/tasks/elu_new.py"
CORPUS = ROOT / "benchmarks" / "corpus" / "inline_build"
# The numbers (issue 33, "Done means"); each beside what it accepts.
VERDICT_S = 8.0          # alone, warm: verdict + eager ratio shown within 8 s
COMPLETE_S = 15.0        # alone, warm: the whole bench within 15 s when the inputs are below 1 GiB
COMPLETE_LARGEST_S = 30.0  # ... and within 30 s at 1 GiB of inputs or more
LARGE_BYTES = 1 << 30
PARALLEL_FACTOR = 1.3    # six at once: makespan <= 1.3 x sum(alone GPU spans) + the longest alone build
PER_BENCH_FACTOR = 3.0   # six at once: no bench's wall past 3x its alone wall
SMOKE_TASK = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0


class ModelNew(nn.Module):
    def forward(self, x):
        return x + x


def get_inputs():
    return [torch.randn(64, 64)]


def get_init_inputs():
    return []
'''
# What stderr says when the verdict is known: the first line matching this (its arrival time).
VERDICT_PATTERN = r"\b(correct|incorrect|verdict)\b"
RUNNING: set[subprocess.Popen] = set()  # the benches' processes now running (stop_benches ends them)


# -- the Tasks ------------------------------------------------------------------------------------

def pair_of(path: Path) -> list[Path]:
    """The files a bench of ``path`` needs in its folder: the file, and the reference beside it."""
    files = [path]
    for suffix in ("_new", "_candidate"):
        if path.stem.endswith(suffix):
            ref = path.with_name(path.stem[: -len(suffix)] + ".py")
            if ref.is_file():
                files.append(ref)
    cu = path.with_suffix(".cu")
    if cu.is_file():
        files.append(cu)
    return files


def corpus_tasks(n: int) -> list[tuple[str, list[tuple[Path, str]]]]:
    """The first n corpus pairs, as ``<name>_new.py`` + ``<name>.py`` (the CLI's pairing)."""
    out = []
    for d in sorted(CORPUS.iterdir())[:n] if CORPUS.is_dir() else []:
        if (d / "model_new.py").is_file() and (d / "reference.py").is_file():
            name = re.sub(r"\W", "_", d.name)
            out.append((f"corpus:{d.name}", [(d / "model_new.py", f"{name}_new.py"), (d / "reference.py", f"{name}.py")]))
    return out


def reference_of(files: list[tuple[Path, str]]) -> Path:
    """The file whose get_inputs makes the Task's inputs: the reference beside a candidate."""
    refs = [src for src, name in files if name.endswith(".py") and not name.endswith(("_new.py", "_candidate.py"))]
    return refs[0] if refs else files[0][0]


def stage(files: list[tuple[Path, str]], folder: Path, prefix: str) -> Path:
    """Copy a Task's files into the scenario's workspace under names of their own (``prefix``:
    ``t0_relu_new.py`` still pairs with ``t0_relu.py``); the path to bench."""
    folder.mkdir(parents=True, exist_ok=True)
    for src, name in files:
        shutil.copyfile(src, folder / (prefix + name))
    return folder / (prefix + files[0][1])


INPUT_BYTES = r'''
import importlib.util, json, sys, torch
import torch.utils.cpp_extension as ext
# Shapes only: a file that builds its kernel at import (load_inline at module level) is not
# built here (that build took about 85 s of each device run before the first bench began).
ext.load_inline = ext.load = lambda *a, **k: None
out = {}
for path in sys.argv[1:]:
    try:
        spec = importlib.util.spec_from_file_location("m", path)
        m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
        with torch.device("meta"):  # shapes only: nothing allocated (CUDA is hidden)
            xs = m.get_inputs()
        out[path] = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
    except Exception as exc:
        out[path] = None
print(json.dumps(out))
'''


def input_bytes(paths: list[Path], python: str, env: dict[str, str]) -> dict[str, int | None]:
    """Bytes of each Task's inputs (from get_inputs' shapes, in a subprocess); None if unknown."""
    try:
        proc = subprocess.run([python, "-c", INPUT_BYTES, *map(str, paths)], capture_output=True, text=True,
                              timeout=300, env={**env, "CUDA_VISIBLE_DEVICES": ""})
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


# -- one bench ------------------------------------------------------------------------------------

def run_bench(path: Path, env: dict[str, str], python: str, timeout: float, pattern: str) -> dict[str, Any]:
    """One `kernel-lsp bench --json --timings` in the Task's folder: wall, phases, verdict time."""
    cmd = [python, "-m", "kernel_lsp.cli", "bench", path.name, "--json", "--timings"]
    t0 = time.monotonic()
    started = time.time()
    verdict_s = None
    verdict_line = ""
    err_lines: list[str] = []
    try:
        proc = subprocess.Popen(cmd, cwd=path.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    except OSError as exc:
        return {"task": path.name, "error": str(exc), "wall_s": None}
    assert proc.stderr is not None and proc.stdout is not None
    RUNNING.add(proc)  # a SIGTERM stops it (stop_benches) rather than leave it running unwatched
    out_chunks: list[str] = []
    reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    for line in proc.stderr:  # timestamps of what the user reads as it comes
        err_lines.append(line.rstrip("\n"))
        if verdict_s is None and re.search(pattern, line, re.I):
            verdict_s = time.monotonic() - t0
            verdict_line = line.strip()
    try:
        rc = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    RUNNING.discard(proc)
    reader.join(10)
    wall = time.monotonic() - t0
    doc: dict[str, Any] = {}
    try:
        doc = json.loads("".join(out_chunks) or "{}")
    except ValueError:
        pass
    target = (doc.get("targets") or [{}])[0]
    phases = (doc.get("timings") or {}).get("phases") or []
    # When the verdict and the eager ratio reached the user: the early result's mark (the CLI's
    # own clock, from its start), else the complete result (kept baselines: nothing was pending).
    early = [m for m in (doc.get("timings") or {}).get("marks") or [] if "early result" in str(m.get("mark"))]
    if early:
        verdict_s, verdict_line = float(early[0]["at_s"]), str(early[0]["mark"])
    elif target.get("verdict"):  # not a stderr guess: the JSON is the complete result
        verdict_s, verdict_line = wall, f"complete result: {target.get('verdict')}"
    return {
        "task": path.name, "rc": rc, "wall_s": round(wall, 3), "started": started,
        "verdict_s": round(verdict_s, 3) if verdict_s is not None else None, "verdict_line": verdict_line,
        "verdict": target.get("verdict"), "speedup_eager": target.get("speedup_eager"),
        "speedup_compile": target.get("speedup_compile"), "worker": doc.get("worker"),
        # The corpus's fractions of the hardware floor (benchmarks/speed_of_light_table.py reads them).
        "speed_of_light": target.get("speed_of_light"), "custom_kernel": target.get("custom_kernel"),
        "flags": target.get("flags"), "time_ms": target.get("time_ms"),
        "device": (doc.get("device") or {}).get("name") if isinstance(doc.get("device"), dict) else None,
        "phases": phases, "gpu_s": span_sum(phases, ": evaluating"),
        "build_s": span_sum(phases, ": compiling") + span_sum(phases, "waiting for the early build", exact=True),
        "prepare_said": [ln for ln in err_lines if "build cache" in ln],
        "stderr_tail": err_lines[-15:],
    }


def span_sum(phases: list[dict[str, Any]], name: str, exact: bool = False) -> float:
    """Seconds of the caller's spans (not the Worker's inside ones) named ``name`` (or ending so)."""
    return round(sum(float(p["seconds"]) for p in phases if not p.get("inside")
                     and (p["phase"] == name if exact else p["phase"].endswith(name))), 3)


def run_many(paths: list[Path], env: dict[str, str], python: str, timeout: float, pattern: str,
             parallel: int, done: Any = lambda i, row: None) -> tuple[list[dict[str, Any]], float]:
    """(results in the order of ``paths``, makespan): ``parallel`` benches at a time. ``done(i, row)``
    as each ends, on this thread: a run killed at its time cap keeps every bench finished before."""
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = [{} for _ in paths]
    with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as pool:
        running = {pool.submit(run_bench, p, env, python, timeout, pattern): i for i, p in enumerate(paths)}
        for fut in concurrent.futures.as_completed(running):
            rows[running[fut]] = fut.result()
            done(running[fut], rows[running[fut]])
    return rows, round(time.monotonic() - t0, 3)


def stop_benches() -> None:
    """Kill the benches still running (a SIGTERM: the results so far are written, the rest is lost)."""
    for proc in list(RUNNING):
        try:
            proc.kill()
        except OSError:
            pass


def progress_line(row: dict[str, Any]) -> str:
    """One bench as it ends, on stderr: a run cut short still shows what each bench gave."""
    return (f"  {row.get('label')}: {fmt(row.get('wall_s'))} s, {row.get('verdict')}, "
            f"x eager {fmt(row.get('speedup_eager'))}, x compile {fmt(row.get('speedup_compile'))}, rc {row.get('rc')}")


# -- the scenarios ----------------------------------------------------------------------------------

def scenario_env(base: dict[str, str], folder: Path, mode: str) -> dict[str, str]:
    env = dict(base)
    env["KERNEL_LSP_CACHE"] = str(folder / "cache")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    env["TRITON_CACHE_DIR"] = str(folder / "triton")
    env["KERNEL_LSP_KEEPER_DIR"] = str(folder / "keeper")
    env["KERNEL_LSP_KEEP_WORKER"] = "0" if mode == "fresh" else "60"  # warm: ends 60 s after the last bench
    env.pop("KERNEL_LSP_PCH_CACHE", None)
    return env


def resumable(prior: dict[str, Any], tasks: list[str], device: str,
              modes: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """{mode: {label: row}}: the alone benches of an earlier run (``prior``, its results file) that
    ended with a verdict, when it ran these Tasks on this GPU; {} otherwise."""
    if prior.get("tasks") != tasks or prior.get("device") != device:
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for scn in prior.get("scenarios") or []:
        if scn.get("mode") not in modes:
            continue
        rows = {r["label"]: {**r, "resumed": True} for r in (scn.get("alone") or {}).get("rows") or []
                if r.get("label") in tasks and r.get("verdict") and r.get("rc") in (0, 1)}
        if rows:
            out[scn["mode"]] = rows
    return out


def run_scenario(mode: str, tasks: list[tuple[str, list[tuple[Path, str]]]], args: argparse.Namespace,
                 base_env: dict[str, str], work: Path, log: Any,
                 checkpoint: Any = lambda part: None, kept: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """`checkpoint(out)` after each bench (``out`` marked ``partial`` until the scenario is done):
    a run cut short (a device call's time limit) keeps what it measured. `kept`: alone rows by label
    from an earlier run (--resume), not run again."""
    out: dict[str, Any] = {"mode": mode, "partial": True}
    kept = kept or {}
    for how, parallel in (("alone", 1), ("parallel", args.parallel)):
        if how not in args.how:
            continue
        folder = work / f"{mode}_{how}"
        env = scenario_env(base_env, folder, mode)
        keep = kept if how == "alone" else {}
        todo = [i for i, (label, _) in enumerate(tasks) if label not in keep]
        if not todo:
            log(f"{mode}/{how}: all {len(tasks)} benches kept from the earlier run (--resume)")
            out[how] = {"rows": [keep[label] for label, _ in tasks], "makespan_s": None, "parallel": parallel,
                        "resumed": len(keep)}
            checkpoint(out)
            continue
        if mode == "warm":
            # As on a machine in use the same way: before the parallel part, `parallel` warm-up
            # benches at once, which leave as many kept Workers (keeper.kept_workers) as a user
            # who runs that many at once has; before the alone part, one.
            warm_files = [(p, p.name) for p in pair_of(args.warmup)]
            log(f"{mode}/{how}: warm-up bench of {args.warmup.name}" + (f", {parallel} at once" if parallel > 1 else ""))
            warm_paths = [stage(warm_files, folder / "workspace", f"warmup{k}_" if k else "warmup_")
                          for k in range(parallel)]
            warm_rows, _ = run_many(warm_paths, env, args.python, args.timeout, args.verdict_pattern, parallel)
            out[f"{how}_warmup"] = warm_rows[0] if parallel == 1 else {"rows": warm_rows}
            for row in warm_rows:
                log(progress_line({**row, "label": f"warm-up {args.warmup.name}"}))
        # One workspace, as a user's project: a new Task there finds the kept Worker (warm);
        # each Task's baselines are its own (kept per reference), so each is measured anew.
        paths = [stage(tasks[i][1], folder / "workspace", f"t{i}_") for i in todo]
        log(f"{mode}/{how}: {len(paths)} benches, {parallel} at a time"
            + (f" ({len(keep)} kept from the earlier run)" if keep else ""))
        ended: dict[int, dict[str, Any]] = {i: keep[label] for i, (label, _) in enumerate(tasks) if label in keep}
        extra = {"resumed": len(keep)} if keep else {}

        def done(j: int, row: dict[str, Any]) -> None:  # called within run_many: this part's how
            i = todo[j]
            row["label"] = tasks[i][0]
            log(progress_line(row))
            ended[i] = row  # the part so far, in the Tasks' order; its makespan comes at its end
            out[how] = {"rows": [ended[k] for k in sorted(ended)], "makespan_s": None, "parallel": parallel, **extra}
            checkpoint(out)

        _, makespan = run_many(paths, env, args.python, args.timeout, args.verdict_pattern, parallel, done)
        # done() has put every row in `ended`. With kept rows, the alone makespan would not be one run's: none then.
        out[how] = {"rows": [ended[k] for k in sorted(ended)], "makespan_s": None if keep else makespan,
                    "parallel": parallel, **extra}
    del out["partial"]
    return out


# -- the targets ------------------------------------------------------------------------------------

def verdict_of(ok: bool | None) -> str:
    return "unknown" if ok is None else ("pass" if ok else "FAIL")


def targets(scn: dict[str, Any], sizes: dict[str, int | None]) -> list[dict[str, Any]]:
    if "alone" not in scn or "parallel" not in scn:
        return []  # one part run (--how): the targets compare the two
    alone = scn["alone"]["rows"]
    par = scn["parallel"]
    out = []
    for row in alone:
        v = row.get("verdict_s")
        out.append({"target": f"alone: {row['label']} verdict+eager <= {VERDICT_S:g} s", "value": v,
                    "result": verdict_of(None if v is None else v <= VERDICT_S)})
        size = sizes.get(row["label"])
        limit = COMPLETE_S if size is not None and size < LARGE_BYTES else COMPLETE_LARGEST_S
        w = row.get("wall_s") if row.get("rc") in (0, 1) else None
        out.append({"target": f"alone: {row['label']} complete <= {limit:g} s", "value": w,
                    "result": verdict_of(None if w is None or size is None else w <= limit)})
    gpu = [r.get("gpu_s") for r in alone]
    build = max((r.get("build_s") or 0.0 for r in alone), default=0.0)
    known = all(isinstance(g, (int, float)) and g > 0 for g in gpu)
    bound = round(PARALLEL_FACTOR * sum(gpu) + build, 3) if known else None  # type: ignore[arg-type]
    out.append({"target": f"parallel x{par['parallel']}: makespan <= {PARALLEL_FACTOR}x sum(alone GPU) + one build"
                          + (f" = {bound} s" if bound is not None else ""),
                "value": par["makespan_s"], "result": verdict_of(None if bound is None else par["makespan_s"] <= bound)})
    for a, p in zip(alone, par["rows"]):
        ok = None if not a.get("wall_s") or not p.get("wall_s") else p["wall_s"] <= PER_BENCH_FACTOR * a["wall_s"]
        out.append({"target": f"parallel: {a['label']} wall <= {PER_BENCH_FACTOR:g}x alone ({a.get('wall_s')} s)",
                    "value": p.get("wall_s"), "result": verdict_of(ok)})
    return out


def fmt(x: Any) -> str:
    return "n/a" if x is None else (f"{x:.1f}" if isinstance(x, float) else str(x))


def top_phases(row: dict[str, Any], n: int = 4, inside: bool = False) -> str:
    spans = sorted((p for p in row.get("phases") or [] if bool(p.get("inside")) == inside
                    and p["phase"] != "worker total"),
                   key=lambda p: -float(p["seconds"]))
    return "; ".join(f"{p['phase']} {float(p['seconds']):.1f}" for p in spans[:n]) or "n/a"


def markdown(doc: dict[str, Any]) -> str:
    lines = [f"# kernel-lsp bench: the first number of a new Task ({doc['when']})", "",
             f"Command: `{doc['command']}`  ", f"Device: {doc['device']}", ""]
    if doc.get("partial"):  # written after each bench: a run cut short leaves this
        lines += [f"**partial: {doc.get('progress')}** (the run was cut short or is still running; "
                  "a scenario's targets are scored when it ends)", ""]
    for scn in doc["scenarios"]:
        cut = ", partial" if scn.get("partial") else ""
        for how in ("alone", "parallel"):
            if how not in scn:
                continue
            part = scn[how]
            kept = f"; {part['resumed']} kept from an earlier run (--resume)" if part.get("resumed") else ""
            lines += [f"## {scn['mode']}, {how}{cut} ({part['parallel']} at a time; makespan {fmt(part['makespan_s'])} s{kept})", "",
                      "| Task | inputs MiB | wall s | verdict at s | GPU span s | build span s | verdict | x eager | x compile | rc | kept Worker reused | largest phases (s) | largest inside the Worker's evaluate (s) |",
                      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
            for r in part["rows"]:
                size = doc["input_bytes"].get(r["label"])
                label = f"{r['label']} (kept)" if r.get("resumed") else r["label"]
                lines.append(f"| {label} | {fmt(None if size is None else round(size / 2**20, 1))} | {fmt(r.get('wall_s'))} "
                             f"| {fmt(r.get('verdict_s'))} | {fmt(r.get('gpu_s'))} | {fmt(r.get('build_s'))} | {r.get('verdict')} "
                             f"| {fmt(r.get('speedup_eager'))} | {fmt(r.get('speedup_compile'))} | {r.get('rc')} "
                             f"| {fmt((r.get('worker') or {}).get('reused'))} | {top_phases(r)} | {top_phases(r, 5, True)} |")
            said = sorted({ln for r in part["rows"] for ln in r.get("prepare_said") or []})
            if said:
                lines += ["", "Build cache lines on stderr: " + " / ".join(f"`{s}`" for s in said[:6])]
            lines.append("")
        if scn.get("partial"):
            continue  # no targets yet: they compare whole parts
        lines += [f"### targets ({scn['mode']})", "", "| target | value | result |", "| --- | --- | --- |"]
        lines += [f"| {t['target']} | {fmt(t['value'])} | {t['result']} |" for t in scn.get("targets", [])]
        lines.append("")
    lines.append("The issue's alone targets are for a warm machine; fresh is shown for the record.")
    return "\n".join(lines) + "\n"


# -- the results files ------------------------------------------------------------------------------

def load_prior(path: Path) -> dict[str, Any]:
    """The results file as an earlier run left it, read once before this run writes over it (the
    writes after each bench would otherwise join its command again and again)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def results_doc(doc: dict[str, Any], scenarios: list[dict[str, Any]], prior: dict[str, Any], modes: list[str],
                planned: int) -> dict[str, Any]:
    """What the results files hold: this run's scenarios (the last one maybe still running), the
    device they ran on, an earlier run's scenarios of the other mode on the same Tasks beside them,
    and ``partial`` (with ``progress``, "N of M benches done") until all ``planned`` benches are done."""
    res = {**doc, "scenarios": scenarios}
    if res["device"] is None:  # what the benches ran on, as the Worker named it
        named = [r.get("device") for s in scenarios for how in ("alone", "parallel") if how in s
                 for r in s[how]["rows"]]
        res["device"] = next((d for d in named if d), None) or _gpu_name()
    if prior.get("tasks") == res["tasks"] and prior.get("device") == res["device"]:
        res["scenarios"] = [s for s in prior.get("scenarios", []) if s.get("mode") not in modes] + scenarios
        res["command"] = "; ".join(dict.fromkeys([prior.get("command", ""), res["command"]]))
    done = sum(len(s[how]["rows"]) for s in scenarios for how in ("alone", "parallel") if how in s)
    res["partial"] = done < planned or any(s.get("partial") for s in scenarios)
    if res["partial"]:
        res["progress"] = f"{done} of {planned} benches done"
    return res


def write_results(out: Path, stem: str, res: dict[str, Any]) -> str:
    """``<stem>.json`` and ``<stem>.md`` under ``out``, each replaced whole (a kill mid-write leaves
    the last complete file); the Markdown."""
    text = markdown(res)
    for path, data in ((out / f"{stem}.json", json.dumps(res, indent=2, default=str) + "\n"),
                       (out / f"{stem}.md", text)):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(data)
        os.replace(tmp, path)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tasks", nargs="*", help="KernelBench-format files (default: small, medium, largest)")
    ap.add_argument("--parallel", type=int, default=6)
    ap.add_argument("--modes", default="fresh,warm", help="fresh, warm or both (default)")
    ap.add_argument("--corpus", type=int, default=0, metavar="N", help="add the first N corpus pairs")
    ap.add_argument("--corpus-only", action="store_true", help="the corpus pairs without the default Tasks")
    ap.add_argument("--how", default="alone,parallel",
                    help="alone, parallel or both (default); one alone suits the corpus's speed of light")
    ap.add_argument("--timeout", type=float, default=480.0, help="seconds per bench before it is killed")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--verdict-pattern", default=VERDICT_PATTERN)
    ap.add_argument("--warmup", default=str(ROOT / WARMUP_TASK), help="the warm-up Task of the warm mode")
    ap.add_argument("--smoke", action="store_true", help="a tiny CPU Task, CUDA hidden, 2 at once")
    ap.add_argument("--resume", action="store_true",
                    help="keep the alone benches an earlier cut run finished (same mode, Tasks and GPU)")
    args = ap.parse_args(argv)
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    work = Path(tempfile.mkdtemp(prefix="first_bench_"))
    if args.smoke:
        base_env["CUDA_VISIBLE_DEVICES"] = ""
        (work / "smoke").mkdir()
        (work / "smoke" / "twice.py").write_text(SMOKE_TASK)
        tasks = [("smoke", [(work / "smoke" / "twice.py", "twice.py")])]
        args.warmup = work / "smoke" / "twice.py"
        args.parallel = min(args.parallel, 2)
        tasks = tasks * args.parallel  # as many benches as processes at once
        tasks = [(f"{label}{i}", files) for i, (label, files) in enumerate(tasks)]
    else:
        args.warmup = Path(args.warmup)
        chosen = [("", t) for t in args.tasks] if args.tasks else ([] if args.corpus_only else DEFAULT_TASKS)
        tasks = []
        for size, t in chosen:
            p = (ROOT / t) if not os.path.isabs(t) else Path(t)
            tasks.append((f"{size}:{p.name}" if size else p.name, [(f, f.name) for f in pair_of(p)]))
        tasks += corpus_tasks(args.corpus)
    modes = [m.strip() for m in args.modes.split(",") if m.strip() in ("fresh", "warm")]
    args.how = [h.strip() for h in args.how.split(",") if h.strip() in ("alone", "parallel")]
    if not modes or not args.how or not tasks:
        print("first_bench: nothing to run (--modes fresh|warm, --how alone|parallel, and Tasks or --corpus N "
              "with benchmarks/corpus/inline_build gathered)", file=sys.stderr)
        return 2

    def log(msg: str) -> None:
        print(f"[first_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    sized = input_bytes([reference_of(files) for _, files in tasks], args.python, base_env)
    sizes = {label: sized.get(str(reference_of(files))) for label, files in tasks}
    device = "CPU (smoke: CUDA hidden)" if args.smoke else None
    doc: dict[str, Any] = {"when": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                           "command": " ".join(["python", "benchmarks/first_bench.py", *(argv if argv is not None else sys.argv[1:])]),
                           "device": device, "input_bytes": sizes, "scenarios": [],
                           "tasks": [label for label, _ in tasks]}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "first_bench_smoke" if args.smoke else "first_bench_corpus" if args.corpus_only else "first_bench"
    prior = load_prior(out / f"{stem}.json")
    kept = resumable(prior, doc["tasks"], device or _gpu_name(), modes) if args.resume else {}
    for mode, rows in kept.items():
        log(f"--resume: {len(rows)} {mode}/alone benches kept from the earlier run: "
            + ", ".join(sorted(rows)))
    if args.resume and not kept:
        log("--resume: nothing to keep (no earlier alone bench with a verdict on these Tasks and this GPU)")
    planned = len(modes) * len(args.how) * len(tasks)
    running: dict[str, Any] = {}  # the scenario under way, as a SIGTERM finds it

    def save(now: dict[str, Any] | None = None) -> str:
        fresh = [now] if now is not None and all(now is not s for s in doc["scenarios"]) else []
        return write_results(out, stem, results_doc(doc, doc["scenarios"] + fresh, prior, modes, planned))

    def checkpoint(part: dict[str, Any]) -> None:  # after each bench: a kill at any moment keeps the rest
        running["scn"] = part
        save(part)

    def on_sigterm(signum: int, frame: Any) -> None:
        # `timeout`'s signal, then the machine is gone: write what is done, end the benches and leave at
        # once (an exception would wait for the pool's threads, i.e. for the benches now running).
        log("SIGTERM: the benches done so far are written; stopping")
        stop_benches()
        save(running.get("scn"))
        shutil.rmtree(work, ignore_errors=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)

    before = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        for mode in modes:
            scn = run_scenario(mode, tasks, args, base_env, work, log, checkpoint, kept.get(mode, {}))
            scn["targets"] = targets(scn, sizes)
            doc["scenarios"].append(scn)
            save()
    finally:
        signal.signal(signal.SIGTERM, before)
        shutil.rmtree(work, ignore_errors=True)
    text = save()
    print(text)
    # A bench that said no verdict (could not start, crashed, timed out) makes the run fail.
    bad = [r for s in doc["scenarios"] if s["mode"] in modes for how in ("alone", "parallel") if how in s
           for r in s[how]["rows"]
           if r.get("rc") not in (0, 1) or not r.get("verdict")]
    for r in bad:
        log(f"{r.get('label')}: no verdict (rc {r.get('rc')}): " + " | ".join(r.get("stderr_tail") or [])[-600:])
    return 1 if bad else 0


@functools.lru_cache(maxsize=1)  # asked at each write until a bench names its device
def _gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "unknown GPU"


if __name__ == "__main__":
    sys.exit(main())
