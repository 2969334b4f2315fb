"""`kernel-lsp bench PATH...` and `kernel-lsp profile PATH...` (wired in kernel_lsp/cli/__init__.py).

Caller side: no torch here; everything runs in a Worker through `Engine`. A file with only
a reference (no ModelNew, no .cu) is timed alone (eager and torch.compile). Without a GPU the
CLI says so and runs what can run on the CPU (.cu files are only built, and say why).
Exit status (kernel_lsp/cli/exits.py): 0 every candidate correct (or a reference timed); 1 a
wrong or disqualified candidate; 2 a file that is not a Task, unreadable, or that needs a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, TextIO

from kernel_lsp.cli import numbers, prepare
from kernel_lsp.cli.exits import CANCELLED, CANNOT_RUN, OK, PROBLEM, combine, could_not_run, gpu_hint
from kernel_lsp.engine.caller.tasks import TaskError, find_task
from kernel_lsp.model import Candidate, Evaluation, Task, disqualified_by
from kernel_lsp.verdicts import accuracy_phrase, far_from_hardware, shortcut_phrase, train_difference
from kernel_lsp.source import SourceError, read_text

try:
    from kernel_lsp.verdicts import NO_GPU
except ImportError:  # pragma: no cover
    NO_GPU = "a .cu candidate needs a GPU to run; none is visible"

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
        if path in explicit and not os.path.exists(path):
            rows.append((path, None, None, f"no such file or folder: {path}"))
            continue
        try:
            # Read as `check` does: undecodable bytes replaced, a binary file refused.
            task, cand = find_task(path, read_text(path))
        except (TaskError, SourceError, OSError) as exc:
            if path in explicit:
                rows.append((path, None, None, str(exc)))
            continue
        except UnicodeDecodeError as exc:  # a file the Task pulls in (its harness) is not UTF-8
            if path in explicit:
                rows.append((path, None, None, f"{os.path.basename(path)}: a file of this Task is not "
                             f"UTF-8 text ({exc.reason} at byte {exc.start})"))
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
    if getattr(ns, "remeasure_baselines", False):
        opts["remeasure_baselines"] = True
    if _accept_less_accurate():
        opts["accept_less_accurate"] = True
    return opts


def _accept_less_accurate() -> bool:
    """The accept_less_accurate setting ([tool.kernel-lsp] / environment): a `less_accurate`
    candidate counts (docs/correctness.md)."""
    try:
        from kernel_lsp.config import load_settings

        return bool(getattr(load_settings(os.getcwd()), "accept_less_accurate", False))
    except Exception:  # settings are optional for the CLI; defaults apply
        return False


def _early_prebuild(engine: Any, rows: list[tuple[str, Task | None, Candidate | None, str]],
                    options: dict[str, Any]) -> Any:
    """Build the first candidate that needs a build in the CPU pool while the GPU Worker starts
    (its torch import and CUDA init), when the GPU's arch is known without it (nvidia-smi): the
    evaluation then finds the pool warm and gets this build's result (``options``: the
    evaluation's, as a GPU run has them, so that Engine.prebuild hands it over with its steps).
    None where it cannot start early; a future that builds nothing where nvidia-smi names no arch."""
    from kernel_lsp.config import detect_arch
    from kernel_lsp.engine.caller.client import needs_build

    if getattr(engine, "kind", "local") != "local":  # a cluster's GPUs are not this machine's
        return None
    first = next(((t, c) for _, t, c, _ in rows if t is not None and c is not None and needs_build(c)), None)
    if first is None or not hasattr(engine, "prebuild"):
        return None

    async def build() -> None:
        arch = await asyncio.to_thread(detect_arch)  # nvidia-smi, off the loop: the Worker's start goes on
        if arch is not None:
            own = (getattr(engine, "options", None) or {}).get("arch")  # a configured arch is the evaluation's too
            await engine.prebuild(first[0], first[1], {**options, **({} if own else {"arch": arch})}, ahead=True)
    return asyncio.ensure_future(build())


# How many of the next files a run of several builds in the CPU pool while the GPU evaluates one.
BUILD_AHEAD = 2


class _BuildAhead:
    """While one file is evaluated on the GPU, the CPU pool builds the next ones that need a build
    (`Engine.prebuild`: their evaluation then finds the build cached, or joins it under way), so a
    run over many kernels overlaps each build with another's evaluation instead of following it.
    Advisory: a failed build here is built and reported by its own evaluation."""

    def __init__(self, engine: Any, rows: list[tuple[str, Task | None, Candidate | None, str]],
                 options: dict[str, Any]) -> None:
        from kernel_lsp.engine.caller.client import needs_build

        self.engine = engine
        self.options = options  # the evaluations' own: same options, same build (Engine.prebuild joins it)
        self.todo = [i for i, (_, t, c, _) in enumerate(rows) if t is not None and c is not None and needs_build(c)]
        self.rows = rows
        self.jobs: dict[int, asyncio.Future] = {}

    @classmethod
    def for_run(cls, engine: Any, rows: list[tuple[str, Task | None, Candidate | None, str]],
                gpu: bool, options: dict[str, Any]) -> "_BuildAhead | None":
        """One where it helps: a local GPU engine with a build pool, and a later file to build."""
        if not gpu or getattr(engine, "kind", "local") != "local" or not hasattr(engine, "prebuild"):
            return None
        ahead = cls(engine, rows, options)
        return ahead if len(ahead.todo) >= 2 else None

    def start(self, i: int) -> None:
        """Row i is about to be evaluated: builds start for the next BUILD_AHEAD rows that need one."""
        for j in [k for k in self.todo if k > i][:BUILD_AHEAD]:
            if j not in self.jobs:
                _, task, cand, _ = self.rows[j]
                self.jobs[j] = asyncio.ensure_future(self.engine.prebuild(task, cand, self.options, ahead=True))
                self.jobs[j].add_done_callback(lambda f: f.cancelled() or f.exception())  # advisory: never "never retrieved"

    async def close(self) -> None:
        for job in self.jobs.values():
            job.cancel()
        await asyncio.gather(*self.jobs.values(), return_exceptions=True)


def _ready_ahead(engine: Any, rows: list[tuple[str, Task | None, Candidate | None, str]], ns: argparse.Namespace,
                 info: dict[str, Any], timeout: float) -> None:
    """While the early build runs, the first Task's reference gets its torch.compile baseline
    compiled (Engine.get_ready_ahead), instead of after the build."""
    first = next(((t, c) for _, t, c, _ in rows if t is not None and c is not None), None)
    if first is not None and hasattr(engine, "get_ready_ahead") and (info.get("cuda") or first[1].kind != "cuda"):
        engine.get_ready_ahead(first[0], ("compile", "verify", "bench"), _options(ns, bool(info.get("cuda"))), timeout)


def _see(engine: Any, rows: list[tuple[str, Task | None, Candidate | None, str]]) -> None:
    """Name every Task before the Worker starts (device_info starts it): a sandboxed Worker then
    shows their folders from the start instead of being replaced by one that does."""
    see = getattr(engine, "see", None)  # a Ray cluster's Workers have their own sandboxes
    if see is not None:
        see([task for _, task, _, _ in rows if task is not None])


def _baseline_store(err: TextIO) -> Any:
    """The workspace store (.kernel-lsp/ in the current folder, as `optimize` uses) where eager
    and torch.compile times are kept between runs; None (measure every time) when it cannot open."""
    from kernel_lsp.store import Store

    try:
        return Store.for_workspace(os.getcwd())
    except Exception as exc:  # an unwritable folder, a newer schema: measure, keep nothing
        print(f"kernel-lsp bench: baselines are measured and not kept: {exc}", file=err)
        return None


async def _executor(ns: argparse.Namespace, timeout: float, baselines: Any = None, keep: bool = False) -> Any:
    """The Executor the settings and --executor / --ray-address ask for (ExecutorUnavailable:
    could not run, exit 2 in main). ``keep``: the GPU Worker stays for the next command for
    --keep-worker seconds (caller/keeper.py)."""
    from kernel_lsp.engine.caller.executor import executor_settings, open_executor

    try:
        from kernel_lsp.config import load_settings

        settings = load_settings(os.getcwd())
    except Exception:  # settings are optional for the CLI; defaults apply
        settings = None
    more: dict[str, Any] = {}
    if keep:
        from kernel_lsp.engine.caller.keeper import keep_setting

        more["keep_worker"] = keep_setting(getattr(ns, "keep_worker", None)) or None
    return await open_executor(timeout=timeout, baselines=baselines, **executor_settings(settings, ns), **more)


async def _bench(ns: argparse.Namespace, err: TextIO
                 ) -> tuple[list[Evaluation], dict[str, Any], list[str], list[bool | None]]:

    paths = _expand(list(ns.paths))
    rows = _targets(paths, set(ns.paths))
    evs: list[Evaluation] = []
    names = [os.path.basename(path) for path, *_ in rows]
    kernels: list[bool | None] = []
    timeout = float(getattr(ns, "timeout", 300.0) or 300.0)
    if all(task is None for _, task, _, _ in rows):  # nothing to run: no Worker to start
        evs = [Evaluation(task=os.path.basename(path), candidate="", verdict="not_run", correct=None, message=error)
               for path, _, _, error in rows]
        return evs, {}, names, [None] * len(evs)
    phases = getattr(ns, "_phases", None)
    if phases is not None:
        phases.begin("opening the store")
    store = _baseline_store(err)
    try:
        return await _bench_with(ns, err, rows, names, kernels, timeout, store)
    finally:
        if store is not None:
            store.close()
        if phases is not None:
            phases.end()


async def _bench_with(ns: argparse.Namespace, err: TextIO, rows: list[tuple[str, Task | None, Candidate | None, str]],
                      names: list[str], kernels: list[bool | None], timeout: float, store: Any
                      ) -> tuple[list[Evaluation], dict[str, Any], list[str], list[bool | None]]:
    evs: list[Evaluation] = []
    phases = getattr(ns, "_phases", None)
    if phases is not None:
        phases.begin("starting the Worker (spawn, torch import, CUDA init)")
    async with await _executor(ns, timeout, baselines=store, keep=True) as engine:
        _see(engine, rows)
        prep = prepare.start(engine, [cand for _, _, cand, _ in rows], err)  # precompiled headers, meanwhile
        early = _early_prebuild(engine, rows, _options(ns, True))  # only where nvidia-smi names a GPU
        stamper = _start_stamper(phases) if getattr(engine, "kind", "local") == "local" else None
        info = await (engine.device_info(progress=stamper) if stamper is not None else engine.device_info())
        _say_kept(ns, engine, err)
        if early is not None and (getattr(engine, "worker_keeping", None) or {}).get("reused") and not early.done():
            # The kept GPU Worker was up at once: it builds each candidate itself (a cached build
            # is found in its cache at once) rather than wait for the CPU pool's start, which is
            # what this run's time would be (3.8 s of 4.8 s measured on the H200).
            early.cancel()
            await asyncio.gather(early, return_exceptions=True)
            early = None
            if hasattr(engine, "auto_prebuild"):
                engine.auto_prebuild = False
        if early is not None:  # the evaluation's own prebuild then finds the pool warm, the build cached
            _ready_ahead(engine, rows, ns, info, timeout)  # meanwhile: the reference's torch.compile
            if phases is not None:
                phases.begin("waiting for the early build")
            await asyncio.gather(early, return_exceptions=True)
        gpu = bool(info.get("cuda"))
        if not gpu:
            print("kernel-lsp: no CUDA GPU visible: verifying and timing PyTorch tasks on the CPU; "
                  ".cu files are only built", file=err)
        opts = _options(ns, gpu)
        ahead = _BuildAhead.for_run(engine, rows, gpu, opts)
        try:
            for i, (path, task, cand, error) in enumerate(rows):
                if ahead is not None:
                    ahead.start(i)
                kernels.append(numbers.has_kernel(cand.source, cand.kind) if cand is not None else None)
                if task is None:
                    evs.append(Evaluation(task=os.path.basename(path), candidate="", verdict="not_run",
                                          correct=None, message=error))  # bad input: exit 2
                    continue
                if cand is None:  # a reference alone: time eager and torch.compile
                    cand = Candidate(source=task.reference_source, kind="python", origin="reference")
                    checks: tuple[str, ...] = ("compile", "bench")
                elif cand.kind == "cuda" and not gpu:
                    checks = ("compile",)
                else:
                    checks = ("compile", "verify", "bench")
                more: dict[str, Any] = {}
                if phases is not None:
                    from kernel_lsp.cli.timings import progress_stamper

                    more["progress"] = progress_stamper(phases, os.path.basename(path))
                early = _early_taker(ns, os.path.basename(path))
                if early is not None:
                    more["early"] = early
                ev = await engine.evaluate(task, cand, checks, timeout=timeout, options=opts, **more)
                if phases is not None:
                    from kernel_lsp.cli.timings import worker_phases

                    worker_phases(phases, ev)
                if checks == ("compile",) and ev.verdict in ("not_run", "correct") and "GPU" not in ev.message:
                    # Only built, as asked: say why nothing ran (and never count it as checked).
                    ev.verdict, ev.correct = "not_run", None
                    ev.message = f"{ev.message or 'built'}; {NO_GPU}"
                evs.append(ev)
        finally:
            if ahead is not None:
                await ahead.close()
        await prepare.finish(prep)
        if phases is not None:
            phases.begin("stopping the Workers")
    # The engine's own custom_kernel answer wins; until it gives one, what the source holds.
    customs = [getattr(ev, "custom_kernel", None) if getattr(ev, "custom_kernel", None) is not None else k
               for ev, k in zip(evs, kernels)]
    return evs, info, names, customs


PENDING = "torch.compile: pending (compiling)"


def early_line(name: str, ev: Evaluation) -> str:
    """The early result, one line: "relu.py: correct · 4.36x eager ±1.2% · 0.0168 ±0.4% ms,
    eager 0.07329 ±1.0% ms · torch.compile: pending (compiling)", the kind of result after the
    verdict when it is a PyTorch rewrite (docs/baselines.md)."""
    parts = [ev.verdict]
    if ev.verdict == "correct" and numbers.is_rewrite(ev.flags, getattr(ev, "custom_kernel", None)):
        parts.append(numbers.REWRITE_LABEL)  # the kind of result, as the table's "kind" says it
    bad = disqualified_by(ev.flags, accept_less_accurate=True)
    if bad:  # as in the table: a disqualified number is not shown as a gain
        parts.append(f"not counted ({', '.join(bad)})")
    else:
        parts.append(numbers.speedup_text(ev.speedup_eager, numbers.ratio_spread(ev.time, ev.eager), against="eager"))
    parts.append(f"{_ms_spread(ev.time)} ms, eager {_ms_spread(ev.eager)} ms")
    parts.append(PENDING)
    return f"{name}: " + " · ".join(parts)


def _early_taker(ns: argparse.Namespace, name: str) -> Any:
    """Engine.evaluate's `early` for one file: the text output prints the early line at once
    (the table follows when everything is measured); --timings marks when it came. None when
    neither wants it (--json alone): the Worker then does not time anything early."""
    out = getattr(ns, "_early_out", None)
    phases = getattr(ns, "_phases", None)
    if out is None and phases is None:
        return None

    def take(part: Evaluation) -> None:
        if phases is not None:
            phases.mark(f"{name}: early result (verdict, eager ratio; torch.compile pending)")
        if out is not None:
            print(early_line(name, part), file=out, flush=True)
    return take


def _start_stamper(phases: Any) -> Any:
    """--timings: the Worker's start phase says when it was a kept Worker, reused."""
    if phases is None:
        return None

    def stamp(step: str, *rest: Any) -> None:
        if step.startswith("reusing the kept worker"):
            phases.rename(step)
    return stamp


def _say_kept(ns: argparse.Namespace, engine: Any, err: TextIO) -> None:
    """Whether the GPU Worker is kept (for `worker` in --json), and once on stderr that it stays."""
    keeping = getattr(engine, "worker_keeping", None)
    ns._worker = dict(keeping) if isinstance(keeping, dict) else None
    if keeping and keeping.get("kept"):
        idle = keeping.get("idle_s") or 0
        reused = f"reused the kept GPU Worker (pid {keeping.get('pid')}); " if keeping.get("reused") else ""
        print(f"kernel-lsp: {reused}the GPU Worker stays for {idle:g} s for the next run "
              "(--keep-worker 0 to stop it)", file=err)


def _reference_only(ev: Evaluation) -> bool:
    return ev.verdict == "not_run" and ev.message == "the reference alone" and ev.eager is not None


def status(ev: Evaluation) -> int:
    """This target's exit status: 0 correct (or a reference timed), 1 a problem, 2 could not run.
    A `less_accurate` candidate is a problem unless the accept_less_accurate setting counts it."""
    if ev.verdict == "correct":
        return PROBLEM if disqualified_by(ev.flags, _accept_less_accurate()) else OK
    if _reference_only(ev):
        return OK
    return CANNOT_RUN if could_not_run(ev.verdict, ev.message) else PROBLEM


def _summary(ev: Evaluation, info: dict[str, Any], custom: bool | None) -> dict[str, Any]:
    """Evaluation.summary() plus both baselines' spreads, the kind of result and why nothing ran;
    fields the engine adds (sandboxed, shared GPU, ...) pass through untouched."""
    doc = ev.summary()

    def fill(key: str, value: Any) -> None:  # the engine's value wins when it has one
        if doc.get(key) is None:
            doc[key] = value

    fill("eager_spread_pct", numbers.spread_of(ev.eager))
    fill("compile_spread_pct", numbers.spread_of(ev.compiled))
    fill("speedup_eager_spread_pct", numbers.ratio_spread(ev.time, ev.eager) if ev.eager else None)
    fill("speedup_compile_spread_pct", numbers.ratio_spread(ev.time, ev.compiled) if ev.compiled else None)
    doc["noisy"] = bool(doc.get("noisy")) or numbers.noisy(numbers.ratio_spread(ev.time, ev.eager, ev.compiled))
    if ev.verdict == "correct":
        fill("custom_kernel", not numbers.is_rewrite(ev.flags, custom))
        fill("label", numbers.label_for(ev.flags, custom))
    else:
        doc.setdefault("custom_kernel", None)
        doc.setdefault("label", None)
    code = status(ev)
    doc["status"] = code
    sol = (ev.evidence or {}).get("speed_of_light")
    doc["speed_of_light"] = sol if isinstance(sol, dict) else None
    fill("reason", ev.message if code == CANNOT_RUN else None)
    if doc.get("device") is None and ev.verdict != "error":
        doc["device"] = {"name": info.get("name")} if info.get("name") else None
    return doc


def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x:.4g}")


def _ms_spread(t: Any) -> str:
    return "-" if t is None else f"{t.median_ms:.4g} ±{t.spread_pct:.1f}%"


def baselines_sentence(ev: Evaluation) -> str:
    """How this run had its baselines: kept (and since when) or measured now, and why."""
    import time as _time

    b = getattr(ev, "baselines", None)
    if not isinstance(b, dict):
        return ""
    when = b.get("measured_at")
    stamp = _time.strftime("%Y-%m-%d %H:%M", _time.localtime(when)) if isinstance(when, (int, float)) else "?"
    if b.get("cached"):
        return (f"baselines kept from {stamp} (same reference, inputs, GPU, torch and compile mode; "
                "--remeasure-baselines times them again)")
    how = "interleaved with the candidate" if b.get("interleaved") else "measured now"
    tail = ""
    if b.get("why") and b["why"] != "none kept yet":
        tail = f"; {b['why']}"
    if not b.get("keep"):
        tail += "" if "not kept" in tail else "; not kept"
    return f"baselines measured now, {how}{tail}"


def bench_main(ns: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    if getattr(ns, "timings", False):
        from kernel_lsp.cli.timings import Phases

        ns._phases = Phases(live=err)  # each phase as it opens, then the table at the end
    if not getattr(ns, "json", False):
        ns._early_out = out  # the early line, before the table (_early_taker)
    try:
        evs, info, names, customs = asyncio.run(_bench(ns, err))
    except KeyboardInterrupt:
        return CANCELLED
    phases = getattr(ns, "_phases", None)
    if phases is not None:
        phases.end()
        phases.print(err)
    code = combine(status(ev) for ev in evs) if evs else CANNOT_RUN
    not_run = [ev.message for ev in evs if status(ev) == CANNOT_RUN and ev.candidate]
    hint = gpu_hint(" ".join(not_run), None) if not_run else None
    if getattr(ns, "json", False):
        doc = {"targets": [_summary(ev, info, c) for ev, c in zip(evs, customs)], "device": info, "status": code,
               "hint": hint}
        doc["worker"] = getattr(ns, "_worker", None) or {"kept": False, "reused": False, "idle_s": None}
        if phases is not None:
            doc["timings"] = phases.to_dict()
        json.dump(doc, out, indent=2, default=str)
        out.write("\n")
    else:
        _bench_table(evs, info, names, customs, out)
        if hint:
            print(f"hint: {hint}", file=out)
    if not evs:
        print("kernel-lsp bench: no Task found in " + ", ".join(ns.paths), file=err)
    return code


def _bench_table(evs: list[Evaluation], info: dict[str, Any], names: list[str], customs: list[bool | None],
                 out: TextIO) -> None:
    from kernel_lsp.cli.console import console as make_console
    from rich.table import Table

    console = make_console(file=out)
    where = info.get("name") or "cpu"
    clocks = f", SM {info['sm_clock_mhz']:.0f} MHz" if isinstance(info.get("sm_clock_mhz"), (int, float)) else ""
    shared = " (shared with other processes)" if info.get("shared") or info.get("shared_gpu") else ""
    table = Table(title=f"kernel-lsp bench on {where}{clocks}{shared}", title_justify="left")
    for col in ("file", "verdict", "kind", "ms", "spread", "eager ms (spread)", "compile ms (spread)", "vs eager",
                "vs compile", "flags"):
        left = col in ("file", "verdict", "kind", "flags")
        table.add_column(col, justify="left" if left else "right", no_wrap=col in ("file", "verdict"))
    for name, ev, custom in zip(names, evs, customs):
        code = status(ev)
        color = "green" if code == OK else ("yellow" if code == CANNOT_RUN else "red")
        shown = "not run" if code == CANNOT_RUN else ev.verdict
        flags = [f for f in ev.flags if f != "not_counted"]
        # A disqualified number is not shown as a gain; a less accurate one is, beside its accuracy.
        hide = bool(disqualified_by(ev.flags, accept_less_accurate=True))
        kind = ("reference" if _reference_only(ev) else
                numbers.label_for(ev.flags, custom) if ev.verdict == "correct" else "-")
        table.add_row(name, f"[{color}]{shown}[/{color}]", kind, _ms(ev.time.median_ms if ev.time else None),
                      f"{ev.time.spread_pct:.1f}%" if ev.time else "-",
                      _ms_spread(ev.eager), _ms_spread(ev.compiled),
                      "-" if hide else numbers.speedup_text(ev.speedup_eager, numbers.ratio_spread(ev.time, ev.eager),
                                                            short=True),
                      "-" if hide else numbers.speedup_text(ev.speedup_compile, numbers.ratio_spread(ev.time, ev.compiled),
                                                            short=True),
                      ", ".join(flags))
    console.print(table)
    for name, ev in zip(names, evs):
        if ev.message and not _reference_only(ev):
            why = "not run: " if status(ev) == CANNOT_RUN else ""
            console.print(f"[bold]{name}[/bold]: {why}{ev.message}", soft_wrap=True)
        said = baselines_sentence(ev)
        if said:
            console.print(f"{name}: {said}", soft_wrap=True)
        warn = numbers.spread_warning(name, numbers.ratio_spread(ev.time, ev.eager, ev.compiled))
        if warn:
            console.print(f"[yellow]{warn}[/yellow]", soft_wrap=True)
        shared = getattr(ev, "shared_gpu", None)
        if shared:
            from kernel_lsp.verdicts import shared_phrase

            console.print(f"[yellow]{name}: {shared_phrase(shared)}[/yellow]", soft_wrap=True)
        sc = ev.speedup_compile
        if ev.verdict == "correct" and not _reference_only(ev) and sc is not None and sc < 1 and not numbers.problem_flags(ev.flags):
            console.print(f"[yellow]{name}: torch.compile of the reference is faster ({_ms(ev.compiled.median_ms)} ms "
                          f"vs {_ms(ev.time.median_ms)} ms, {sc:.2f}x): consider torch.compile instead[/yellow]",
                          soft_wrap=True)
        sol = (ev.evidence or {}).get("speed_of_light")
        if isinstance(sol, dict) and sol.get("label"):
            console.print(f"  speed of light: {sol['label']}", soft_wrap=True)
        far = far_from_hardware(ev) if not _reference_only(ev) else None
        if far:
            console.print(f"  [yellow]hint: {far}[/yellow]", soft_wrap=True)
        cut = shortcut_phrase(ev)
        if cut:
            console.print(f"  algebraic shortcut: {cut}", soft_wrap=True)
        train = train_difference(getattr(ev, "accuracy", None)) if "eval_only" in ev.flags else None
        if train:
            console.print(f"  training mode: {train}", soft_wrap=True)
        acc = accuracy_phrase(getattr(ev, "accuracy", None))
        if acc and not _reference_only(ev):
            counted = ("; its speed is not counted (accept_less_accurate = true counts it)"
                       if "less_accurate" in ev.flags and status(ev) != OK else "")
            console.print(f"  accuracy: {acc}{counted}", soft_wrap=True)
        ev_where = (ev.evidence or {}).get("where")
        if ev.verdict not in ("correct", "not_run") and ev_where is not None:
            e = ev.evidence or {}
            console.print(f"  {e.get('output', 'output')}[{', '.join(map(str, ev_where))}] on input set "
                          f"{e.get('input_set')}: got {e.get('got')}, expected {e.get('expected')}")
        for note in (ev.evidence or {}).get("notes", []):
            console.print(f"  note: {note}", soft_wrap=True)


async def _profile(ns: argparse.Namespace, err: TextIO) -> list[dict[str, Any]]:
    rows = _targets(_expand(list(ns.paths)), set(ns.paths))
    timeout = float(getattr(ns, "timeout", 300.0) or 300.0)
    results: list[dict[str, Any]] = []
    if all(task is None for _, task, _, _ in rows):  # nothing to run: no Worker to start
        return [{"target": os.path.basename(path), "error": error} for path, _, _, error in rows]
    async with await _executor(ns, timeout) as engine:
        _see(engine, rows)
        prep = prepare.start(engine, [cand for _, _, cand, _ in rows], err)  # precompiled headers, meanwhile
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
        await prepare.finish(prep)
    return results


def _profile_status(r: dict[str, Any]) -> int:
    """Profiling finds no problem by itself: 0 when it profiled, 2 when it could not."""
    prof = r.get("profile") or {}
    if "error" in r or "error" in prof or "verdict" in prof:
        return CANNOT_RUN
    return OK


def profile_main(ns: argparse.Namespace) -> int:
    out, err = sys.stdout, sys.stderr
    try:
        results = asyncio.run(_profile(ns, err))
    except KeyboardInterrupt:
        return CANCELLED
    for r in results:
        prof = r.get("profile") or {}
        r["status"] = _profile_status(r)
        if r["status"] == CANNOT_RUN:
            r.setdefault("reason", r.get("error") or prof.get("error") or prof.get("message") or prof.get("verdict"))
    code = combine(r["status"] for r in results) if results else CANNOT_RUN
    if getattr(ns, "json", False):
        json.dump({"targets": results, "status": code}, out, indent=2, default=str)
        out.write("\n")
    else:
        _profile_tables(results, out)
    if not results:
        print("kernel-lsp profile: no Task found in " + ", ".join(ns.paths), file=err)
    return code


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
            console.print(f"[bold]{r['target']}[/bold]: [yellow]not profiled[/yellow]: "
                          f"{prof.get('message') or prof['verdict']}", soft_wrap=True)
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
