"""Verify and time a document's Task: on save (per the `on_save` setting), on "Benchmark",
and again after an Apply. Results go to the store; the lens, hover, diagnostics and status
all read the document's one `Measurement` and say which text version it measured. An
edit makes it stale ("edited since measured") until the next measurement.

A file holding a reference `Model` alone is measured too: its own (eager) time and
torch.compile's, so the most common PyTorch file has numbers and Optimize.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from kernel_lsp.model import Candidate, Evaluation, Span, Target, TargetKind
from kernel_lsp.server.build_ahead import BuildAhead
from kernel_lsp.server.commands import DocumentArgs, parse_args
from kernel_lsp.server.engine_host import ExecutionDisabled
from kernel_lsp.server.feature import LanguageFeature
from kernel_lsp.server.progress import WorkProgress
from kernel_lsp.server.state import DocumentState, Measurement, SavePublish
from kernel_lsp.verdicts import (
    accuracy_phrase,
    far_from_hardware,
    shortcut_phrase,
    speed_of_light,
    times_phrase,
    train_difference,
)

if TYPE_CHECKING:
    from kernel_lsp.server.jobs import Job
    from kernel_lsp.source import Document

log = logging.getLogger(__name__)

MIN_REGRESSION = 0.05  # a slowdown smaller than this (or than the noise) is not reported
NOISY_SPREAD = 10.0    # percent: above it a speedup is a warning, not a fact
# A reference-only file is measured (and optimized) as a ModelNew that is the reference.
MODELNEW_SHIM = "\n\nclass ModelNew(Model):\n    \"\"\"Starts as the reference; the agent rewrites it.\"\"\"\n"
REWRITE = "PyTorch rewrite (no custom kernel)"
PENDING = "torch.compile pending"  # an early result: torch.compile's baseline still compiling


def reference_candidate(text: str, note: str = "") -> Candidate:
    shim = MODELNEW_SHIM if not note else MODELNEW_SHIM.replace(
        "the agent rewrites it.", f"the agent rewrites it. {note}")
    return Candidate(source=text + shim, kind="python")


HOT_OPS_KEPT = 64  # references whose profile (hot ops) is kept in the server, newest last


class EvaluationFeature(LanguageFeature):
    name = "evaluation"

    def __init__(self, server: Any) -> None:
        super().__init__(server)
        # The reference's profile depends on the reference, not on the candidate: profiled once
        # per reference text and GPU, after the numbers are shown, never in a save's path.
        self._profiles: dict[tuple[str, str], dict[str, Any]] = {}
        self.ahead = BuildAhead(server)  # a measured file's edits are built before the save

    # -- events -----------------------------------------------------------------------------

    def did_open(self, state: DocumentState) -> None:
        had = state.measurement
        self._load(state)
        self.ahead.binding(state)  # a new load_inline file: its main.cpp before its first save
        m = state.measurement
        if m is not None and m is not had and m.fresh_for(state.text):
            self.publish(state)  # the stored measurement of this very text: its diagnostics (hints too)

    def did_change(self, state: DocumentState) -> None:
        if state.remeasure_text is not None and state.remeasure_text == state.text:
            state.remeasure_text = None  # the applied candidate is in the buffer: measure it
            self.schedule(state, ("compile", "verify", "bench"), visible=True, why="Re-measure")
            return
        self.ahead.changed(state)
        self.ahead.binding(state)
        m = state.measurement
        if m is None:
            return
        stale = not m.fresh_for(state.text)
        if stale != m.shown_stale:  # only on a transition: no work per keystroke
            self.publish(state)

    def did_save(self, state: DocumentState) -> None:
        settings = self.server.settings
        checks = tuple(c for c in ("verify", "bench") if c in settings.on_save)
        if not checks or not settings.execution_enabled:
            return
        if self.anchor(state) is None:
            return
        m = state.measurement
        if m is not None and m.fresh_for(state.text) and self.server.jobs.get(("evaluate", state.uri)) is None:
            return  # saved without an edit: the numbers shown are this text's
        # The save's compile (scheduled just before, features run in order) and this
        # measurement publish once, together (state.settle).
        compiling = self.server.jobs.get(("compile", state.uri))
        if compiling is not None and not compiling.task.done():
            state.save_publish = SavePublish(version=state.version, waiting={"compile", "evaluation"})
        self.schedule(state, ("compile", *checks), visible=False)

    def did_close(self, state: DocumentState) -> None:
        self.ahead.closed(state.uri)
        job = self.server.jobs.get(("evaluate", state.uri))
        if job is not None:
            job.task.cancel()

    def dependency_changed(self, state: DocumentState, path: str) -> None:
        if state.measurement is not None:
            state.measurement.text = None  # the harness or a header changed: that text no longer says
            self.publish(state)
        self.did_save(state)

    def commands(self) -> dict[str, Any]:
        return {"kernel-lsp.benchmark": self.benchmark, "kernel-lsp.remeasureBaselines": self.remeasure_baselines}

    async def remeasure_baselines(self, *args: Any) -> dict[str, Any]:
        """Benchmark, timing eager and torch.compile again even where kept ones match."""
        uri = parse_args("kernel-lsp.remeasureBaselines", DocumentArgs, args).uri
        state = self.server.state(uri)
        job = self.schedule(state, ("compile", "verify", "bench"), visible=True, why="Re-measure baselines for",
                            options={"remeasure_baselines": True})
        ev = await self.server.jobs.wait(job)
        if ev is None:
            return {"verdict": "not_run", "reason": job.reason or "cancelled"}
        out = ev.summary()
        out["version"] = state.measurement.version if state.measurement else None
        if ev.verdict == "not_run":
            out["reason"] = ev.message or "nothing could run"
        elif not (ev.baselines or {}).get("measured_at"):
            # Verify failed before any timing: nothing was re-measured, and the answer says why.
            out["reason"] = f"the baselines were not re-measured: {ev.message or ev.verdict}"
        return out

    async def benchmark(self, *args: Any) -> dict[str, Any]:
        uri = parse_args("kernel-lsp.benchmark", DocumentArgs, args).uri
        state = self.server.state(uri)
        job = self.schedule(state, ("compile", "verify", "bench"), visible=True)
        ev = await self.server.jobs.wait(job)
        if ev is None:
            reason = job.reason or "cancelled"
            return {"verdict": "not_run", "reason": reason}
        out = ev.summary()
        out["version"] = state.measurement.version if state.measurement else None
        if ev.verdict == "not_run":
            out["reason"] = ev.message or "nothing could run"
        return out

    # -- measuring --------------------------------------------------------------------------

    def schedule(self, state: DocumentState, checks: tuple[str, ...], visible: bool,
                 why: str | None = None, options: dict[str, Any] | None = None) -> "Job":
        """Verify/time the current text; a newer request for the same file cancels the older."""
        title = f"{why or ('Benchmark' if 'bench' in checks else 'Verify')} {os.path.basename(state.path)}"
        job: Job | None = None

        def cancel() -> None:
            if job is not None:
                job.task.cancel()

        job = self.server.jobs.start(("evaluate", state.uri), title,
                                     self.run(state, state.text, state.version, checks, title, cancel, visible,
                                              options),
                                     uri=state.uri, visible=visible)
        self.server.refresh_lenses()  # "measuring…"
        return job

    async def run(self, state: DocumentState, text: str, version: int | None, checks: tuple[str, ...],
                  title: str, cancel, visible: bool, options: dict[str, Any] | None = None) -> Evaluation | None:
        from kernel_lsp.engine.caller.tasks import TaskError

        ls = self.server
        progress = WorkProgress(ls, title, on_cancel=cancel)
        await progress.begin("starting the Worker")
        job = ls.jobs.get(("evaluate", state.uri))
        steps = SaveSteps()
        try:
            task, candidate = ls.host.task_for(state.path, text)
            reference_only = candidate is None
            if candidate is None:
                candidate = reference_candidate(text)
            previous = state.measurement.evaluation if state.measurement else None
            engine = await ls.host.executor(progress.report)  # the Ray cluster or this machine
            more = {"options": options} if options else {}  # (only the re-measure passes any)
            steps.mark("ready to evaluate")

            def report(name: Any, *rest: Any) -> Any:
                steps.mark(str(name))
                return progress.report(str(name))

            def early(part: Evaluation) -> None:
                steps.mark("evaluating (torch.compile pending)")
                self._show_early(state, job, Measurement(evaluation=part, version=version, text=text,
                                                         reference_only=reference_only,
                                                         sandboxed=getattr(part, "sandboxed", None)), progress)
            if "bench" in checks:
                more["early"] = early
            try:
                ev = await engine.evaluate(task, candidate, checks=checks, progress=report, **more)
            finally:  # the early result lives only as long as its evaluation
                self._drop_early(state, job)
            steps.mark("evaluated")
        except (TaskError, ExecutionDisabled) as exc:
            self._settle_unmeasured(state, version)
            progress.end(str(exc))
            if job is not None:
                job.reason = str(exc)
            if visible:
                ls.show(f"kernel-lsp: {exc}", types.MessageType.Warning)
            return None
        except BaseException:
            self._settle_unmeasured(state, version)
            progress.end("cancelled")
            ls.refresh_lenses()  # no longer "measuring…"
            raise
        hot: list[dict[str, Any]] = []
        profile_key: tuple[str, str] | None = None
        if ev.correct and "bench" in checks and task.cuda_path is None:
            from kernel_lsp.engine.protocol import reference_fingerprint

            # The reference's code (not comments, not a ModelNew sharing its file) and the GPU.
            profile_key = (reference_fingerprint(task.reference_source),
                           str((ev.device or {}).get("name") if isinstance(ev.device, dict) else ev.device))
            kept = self._profiles.get(profile_key)
            if kept is not None:
                hot = hot_ops(kept, ls.settings.slow_share)
                profile_key = None
        state.measurement = Measurement(evaluation=ev, version=version, text=text,
                                        reference_only=reference_only, hot_ops=hot,
                                        sandboxed=getattr(ev, "sandboxed", None))
        self.publish(state, previous, saved=True)
        title_now = lens_title(state.measurement)
        progress.end(title_now)
        steps.mark("shown")
        log.info("measured %s (version %s): %s%s", os.path.basename(state.path), version, steps.words(),
                 inside_words(ev))
        if profile_key is not None:  # the hot ops follow, in a job of their own
            m = state.measurement
            ls.jobs.start(("profile", state.uri), f"Profile {os.path.basename(state.path)}",
                          self._profile_reference(state, m, engine, task, profile_key), uri=state.uri,
                          visible=False)
        if visible and ev.verdict == "not_run":  # "Benchmark now" that did nothing says why
            ls.show(f"kernel-lsp: {os.path.basename(state.path)} was not run: "
                    f"{ev.message or 'nothing could run'}", types.MessageType.Warning)
        ls.send_status()
        return ev

    def _show_early(self, state: DocumentState, job: "Job | None", m: Measurement, progress: WorkProgress) -> None:
        """The early result of the job under way: in the lens and hover beside "measuring…", until
        the complete one replaces it. Dropped when a newer job took this one's place."""
        if job is None or self.server.jobs.get(("evaluate", state.uri)) is not job:
            return
        state.early, state.early_job = m, job
        progress.report(f"{numbers(m)}; torch.compile compiling")
        self.server.refresh_lenses()

    def _drop_early(self, state: DocumentState, job: "Job | None") -> None:
        if state.early_job is job and state.early is not None:
            state.early = state.early_job = None

    def early_shown(self, state: DocumentState) -> Measurement | None:
        """The early result to show now: its job still runs and the text is the one it measured
        (never a number of an older version)."""
        m = state.early
        running = self.server.jobs.get(("evaluate", state.uri))
        if m is None or running is None or running is not state.early_job or running.task.done():
            return None
        return m if m.fresh_for(state.text) else None

    async def _profile_reference(self, state: DocumentState, m: Measurement, engine: Any, task: Any,
                                 key: tuple[str, str]) -> None:
        """The reference's hot ops, once per reference and GPU, shown when they come (on the
        measurement they were asked for, if it is still the one shown)."""
        try:
            profile = await engine.profile(task)
        except Exception as exc:  # a profile is a bonus: its failure must not hide the result
            log.warning("profile of %s failed: %s", task.name, exc)
            return
        if not isinstance(profile, dict) or "error" in profile or "verdict" in profile:
            log.info("no profile of %s: %s", task.name, (profile or {}).get("error") if isinstance(profile, dict)
                     else profile)
            return
        self._profiles[key] = profile
        while len(self._profiles) > HOT_OPS_KEPT:
            self._profiles.pop(next(iter(self._profiles)))
        hot = hot_ops(profile, self.server.settings.slow_share)
        if hot and state.measurement is m:
            m.hot_ops = hot
            measuring = self.server.jobs.get(("evaluate", state.uri))
            if measuring is None or measuring.task.done():
                self.publish(state)
            # else a newer save is being measured: it publishes once, carrying these hot ops if
            # it does not replace this measurement (an older version's set would only flash).

    def _settle_unmeasured(self, state: DocumentState, version: int | None) -> None:
        """No measurement for this save: the compile that waited for it publishes now (unless
        a newer measurement took this one's place: that one settles the save)."""
        job = self.server.jobs.get(("evaluate", state.uri))
        if job is not None and job.task is not asyncio.current_task():
            return
        if state.settle("evaluation", version) == "publish":
            self.server.publish(state, {}, version=version)

    def _load(self, state: DocumentState) -> None:
        """The last stored Evaluation of the document's Task, fresh only if it measured this text."""
        if state.measurement is not None or state.store_read or self.anchor(state) is None:
            return
        state.store_read = True
        try:
            task, candidate = self.server.host.task_for(state.path, state.text)
            ev = self.server.host.store().latest(task.name)
        except Exception:  # no task, no store yet: nothing measured
            return
        if ev is None:
            return
        reference_only = candidate is None
        current = candidate or reference_candidate(state.text)
        same = ev.candidate == current.id
        state.measurement = Measurement(evaluation=ev, version=state.version if same else None,
                                        text=state.text if same else None, reference_only=reference_only,
                                        sandboxed=getattr(ev, "sandboxed", None), shown_stale=not same)

    # -- what is shown ----------------------------------------------------------------------

    def anchor(self, state: DocumentState) -> Target | None:
        """Where a document's Task shows: ModelNew, else a reference Model, else the .cu's
        entry export or first kernel (when its harness exists)."""
        doc = self.server.document(state)
        if state._anchor is not None and state._anchor[0] is doc:
            return state._anchor[1]
        target = anchor_target(doc)
        state._anchor = (doc, target)
        return target

    def publish(self, state: DocumentState, previous: Evaluation | None = None, saved: bool = False) -> None:
        """The measurement's diagnostics; `saved`: a measurement of a save, published once
        together with that save's compile (whichever finishes last publishes both)."""
        ls = self.server
        m = state.measurement
        out: list[types.Diagnostic] = []
        if m is not None:
            target = self.anchor(state)
            span = target.name_span if target else Span(0, 0, 0, 0)
            positions = ls.positions(state)
            stale = not m.fresh_for(state.text)
            m.shown_stale = stale
            prefix = f"edited since measured ({version_words(m)}): " if stale else ""
            ev = m.evaluation

            def add(severity: types.DiagnosticSeverity, message: str, code: str, at: Span = span,
                    data: Any = None) -> None:
                out.append(types.Diagnostic(
                    range=positions.range(at), message=prefix + message, source="kernel-lsp", code=code,
                    severity=types.DiagnosticSeverity.Information if stale else severity, data=data))

            if ev.verdict not in ("correct", "not_run"):
                add(types.DiagnosticSeverity.Error, f"{verdict_words(ev)}. {ev.message}".strip(), ev.verdict)
            if not m.reference_only:
                for flag in ev.flags:
                    if flag in ("torch_fallback", "not_counted"):
                        continue  # a PyTorch rewrite is a result, labelled in the lens and hover
                    if flag in INFO_FLAGS:  # facts about a counted result, not problems
                        add(types.DiagnosticSeverity.Information, f"{INFO_FLAGS[flag]}: {ev.message}", flag)
                        continue
                    add(types.DiagnosticSeverity.Warning, f"flagged: {flag.replace('_', ' ')}: {ev.message}", flag)
                far = far_from_hardware(ev) if ev.time is not None else None
                if far:
                    add(types.DiagnosticSeverity.Hint, far, "far-from-hardware")
                if ev.correct and ev.time is not None:
                    if ev.eager is not None and (ev.speedup_eager or 0) < 1.0:
                        add(types.DiagnosticSeverity.Warning,
                            f"slower than PyTorch eager: {fmt_ms(ev.time.median_ms)} vs {fmt_ms(ev.eager.median_ms)}",
                            "slower-than-eager")
                    if ev.compiled is not None and (ev.speedup_compile or 0) < 1.0:
                        add(types.DiagnosticSeverity.Warning,
                            f"slower than torch.compile: {fmt_ms(ev.time.median_ms)} vs "
                            f"{fmt_ms(ev.compiled.median_ms)}", "slower-than-compile")
                    regression = regression_message(previous, ev)
                    if regression:
                        add(types.DiagnosticSeverity.Warning, regression, "regression")
            model = _first(ls.document(state), TargetKind.TASK_MODEL)
            for op in m.hot_ops:
                add(types.DiagnosticSeverity.Information,
                    f"hot op {op['name']}: {op['share_pct']:.0f}% of Model.forward's time "
                    f"({op.get('count', 1)} calls); the Optimize action can target it", "hot-op",
                    model.name_span if model else span, data={"op": op["name"]})
        version = m.version if m else state.version
        if saved and state.settle("evaluation", version) == "wait":
            state.diagnostics["evaluation"] = out  # the save's compile, still running, publishes both
        else:
            ls.publish(state, {"evaluation": out}, version=version)
        ls.refresh_lenses()
        ls.send_status()

    def code_lenses(self, state: DocumentState) -> list[types.CodeLens]:
        ls = self.server
        doc = ls.document(state)
        positions = ls.positions(state)
        target = self.anchor(state)
        if target is None:
            if state.path.endswith(".cu"):
                kernel = _first(doc, TargetKind.CUDA_KERNEL)
                if kernel is not None:
                    return [types.CodeLens(range=positions.range(kernel.name_span), command=types.Command(
                        title="no harness: Create a harness", command="kernel-lsp.createHarness",
                        arguments=[{"uri": state.uri}]))]
            return []
        self._load(state)
        rng = positions.range(target.name_span)
        args = [{"uri": state.uri}]
        running = ls.jobs.get(("evaluate", state.uri))
        tooltip = None
        early = None
        if running is not None:
            title = "measuring…"
            early = self.early_shown(state)
        elif state.measurement is not None:
            title = lens_title(state.measurement, state.text)
            tooltip = lens_tooltip(state.measurement)
        else:
            title = "not measured yet"
        lenses = [(title, "kernel-lsp.benchmark", tooltip), ("Benchmark", "kernel-lsp.benchmark", None),
                  ("Optimize", "kernel-lsp.optimize", None)]
        if early is not None:  # what is known already, beside "measuring…" (docs/baselines.md)
            lenses.insert(1, (early_title(early), "kernel-lsp.benchmark", lens_tooltip(early)))
        if running is None and state.measurement is not None and baselines_kept(state.measurement.evaluation):
            # Only where kept baselines were used: re-measuring fresh ones would do nothing new.
            lenses.append(("Re-measure baselines", "kernel-lsp.remeasureBaselines",
                           "time PyTorch eager and torch.compile again (kept per reference, inputs, GPU, "
                           "torch version and compile mode)"))
        return [types.CodeLens(range=rng, command=types.Command(title=t, command=c, arguments=args, tooltip=tip))
                for t, c, tip in lenses]

    def code_actions(self, state: DocumentState, params: types.CodeActionParams) -> list[types.CodeAction]:
        if self.anchor(state) is None:
            return []
        title = "Benchmark now"
        return [types.CodeAction(title=title, kind=types.CodeActionKind.Source, is_preferred=False,
                                 command=types.Command(title=title, command="kernel-lsp.benchmark",
                                                       arguments=[{"uri": state.uri}]))]

    def hover(self, state: DocumentState, target: Target) -> list[str]:
        anchor = self.anchor(state)
        if anchor is None or anchor.name != target.name:
            return []
        self._load(state)
        lines = []
        early = self.early_shown(state)
        if early is not None:
            lines.extend(early_markdown(early, state.text))
        m = state.measurement
        if m is not None:
            lines.extend(measurement_markdown(m, state.text))
        history = self.history(state)
        if history:
            lines.append(history)
        return lines

    def history(self, state: DocumentState, limit: int = 5) -> str:
        try:
            task, _ = self.server.host.task_for(state.path, state.text)
            runs = self.server.host.store().evaluations(task.name, limit=limit)
        except Exception:
            return ""
        if not runs:
            return ""
        rows = ["| run | verdict | time | spread | eager | torch.compile |", "| --- | --- | --- | --- | --- | --- |"]
        for n, ev in enumerate(runs):
            rows.append(f"| {n + 1} | {ev.verdict} | {fmt_ms(ev.time.median_ms) if ev.time else '-'} | "
                        f"{f'±{ev.time.spread_pct:.1f}%' if ev.time else '-'} | "
                        f"{fmt_ms(ev.eager.median_ms) if ev.eager else '-'} | "
                        f"{fmt_ms(ev.compiled.median_ms) if ev.compiled else '-'} |")
        return "**History** (newest first)\n\n" + "\n".join(rows)


class SaveSteps:
    """When each step of a measurement was reached, from the job's start (the server's log says
    where a save's seconds go: "measured x.py (version 3): compiling 1.52 s, evaluating 2.10 s, ...")."""

    def __init__(self) -> None:
        self.t0 = self._last = time.monotonic()
        self.rows: list[tuple[str, float]] = []
        self._open = "starting"

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.rows.append((self._open, now - self._last))
        self._last, self._open = now, name

    def words(self) -> str:
        parts = [f"{name} {secs:.2f} s" for name, secs in self.rows if secs >= 0.005]
        return ", ".join(parts) + f"; {self._last - self.t0:.2f} s in all"


def inside_words(ev: Evaluation) -> str:
    """" (build: device 1.02, link 0.18; worker: verify 0.14, timing 0.26)": the build's and the
    Worker's own steps, for the log line that says where a save's seconds went."""
    evidence = ev.evidence or {}
    parts = []
    for label, key in (("build", "build_steps"), ("worker", "phases")):
        got = evidence.get(key)
        if isinstance(got, dict):
            steps = [f"{k.removesuffix('_s')} {v:.2f}" for k, v in got.items()
                     if isinstance(v, (int, float)) and v >= 0.005]
            if steps:
                parts.append(f"{label}: " + ", ".join(steps))
    return f" ({'; '.join(parts)})" if parts else ""


# -- words (one wording for lens, hover, status and progress) ------------------------------------

def version_words(m: Measurement) -> str:
    return f"measured on version {m.version}" if m.version is not None else "measured on an earlier text"


def is_rewrite(ev: Evaluation) -> bool:
    """A speedup that comes from PyTorch ops, not from a custom kernel."""
    custom = getattr(ev, "custom_kernel", None)
    return custom is False or "torch_fallback" in ev.flags


def shared_gpu(ev: Evaluation) -> bool | None:
    shared = getattr(ev, "shared_gpu", None)
    if shared is None and isinstance(ev.device, dict):
        shared = ev.device.get("shared")
    return shared


def numbers(m: Measurement) -> str:
    """"correct · 1.84x eager · 0.97x torch.compile · 41.2 us ±1.2%" (one line, no staleness)."""
    ev = m.evaluation
    if m.reference_only and ev.verdict == "correct":
        parts = []
        eager = ev.eager or ev.time
        if eager is not None:
            parts.append(f"eager {fmt_ms(eager.median_ms)} ±{eager.spread_pct:.1f}%")
        if ev.compiled is not None and eager is not None:
            gain = eager.median_ms / ev.compiled.median_ms if ev.compiled.median_ms > 0 else None
            parts.append(f"torch.compile {fmt_ms(ev.compiled.median_ms)}"
                         + (f" ({gain:.2f}x eager)" if gain else ""))
        elif pending(ev):
            parts.append(PENDING)
        return " · ".join(parts) or "correct"
    if ev.verdict != "correct":
        return verdict_words(ev)
    parts = ["correct"]
    if ev.speedup_eager is not None:
        parts.append(f"{ev.speedup_eager:.2f}x eager")
    if ev.speedup_compile is not None:
        parts.append(f"{ev.speedup_compile:.2f}x torch.compile")
    elif pending(ev):
        parts.append(PENDING)
    if ev.time is not None:
        parts.append(f"{fmt_ms(ev.time.median_ms)} ±{ev.time.spread_pct:.1f}%")
        if ev.time.spread_pct > NOISY_SPREAD:  # a warning, not a number shown as fact
            parts.append("noisy: not a reliable comparison")
    if is_rewrite(ev):
        parts.append(REWRITE)
    ratio = (getattr(ev, "accuracy", None) or {}).get("ratio")
    if "less_accurate" in ev.flags and isinstance(ratio, (int, float)):
        parts.append(f"less accurate: {times_phrase(ratio)} PyTorch's error, not counted")
    if "eval_only" in ev.flags:
        parts.append("correct in eval mode only: not counted")
    if "algebraic_shortcut" in ev.flags:
        parts.append("algebraic shortcut")
    return " · ".join(parts)


def pending(ev: Evaluation) -> bool:
    """A partial Evaluation: torch.compile's baseline is still compiling."""
    return bool(getattr(ev, "compiled_pending", False)) and ev.compiled is None


def early_title(m: Measurement) -> str:
    """The early result's lens, beside "measuring…": "so far: correct · 4.36x eager ·
    torch.compile pending · 16.8 us ±0.4%"."""
    return f"so far: {numbers(m)}"


def early_markdown(m: Measurement, text: str) -> list[str]:
    """The hover's part for the early result: as the complete one, headed as what it is."""
    lines = measurement_markdown(m, text)
    lines[0] = (f"**So far** ({version_words(m)}; torch.compile pending: its baseline is still compiling, "
                f"the complete result replaces this): {numbers(m)}")
    return lines


def lens_title(m: Measurement, text: str | None = None) -> str:
    """The lens: the numbers, or "edited since measured (…): was …" when the text changed."""
    if text is not None and not m.fresh_for(text):
        return f"edited since measured ({version_words(m)}; save to measure again) · was: {numbers(m)}"
    return numbers(m)


# Flags that describe a correct, counted result: Information diagnostics, not warnings.
INFO_FLAGS = {"algebraic_shortcut": "an algebraic shortcut (does less arithmetic than the reference)",
              "weak_reference": "the reference is numerically weak (judged against float64)"}


def light_words(ev: Evaluation) -> str | None:
    """"Speed of light: 12 % of the H200's memory floor (34 us to move its bytes once)"."""
    sol = speed_of_light(ev)
    return f"Speed of light: {sol['label']}" if sol and sol.get("label") else None


def measurement_markdown(m: Measurement, text: str) -> list[str]:
    ev = m.evaluation
    head = f"**Last evaluation** ({version_words(m)}"
    head += ", edited since)" if not m.fresh_for(text) else ")"
    lines = [f"{head}: {numbers(m)}"]
    if ev.message:
        lines.append(ev.message)
    rows = []
    for label, t in (("this code" if not m.reference_only else "Model (eager)", ev.time if not m.reference_only else None),
                     ("PyTorch eager", ev.eager), ("torch.compile", ev.compiled)):
        if t is not None:
            rows.append(f"| {label} | {fmt_ms(t.median_ms)} | ±{t.spread_pct:.1f}% | {t.runs} |")
    if pending(ev):
        rows.append("| torch.compile | pending (compiling) | | |")
    if rows:
        lines.append("| | median | spread | runs |\n| --- | --- | --- | --- |\n" + "\n".join(rows))
    said = baselines_words(ev)
    if said:
        lines.append(said[0].upper() + said[1:])
    if not m.reference_only and ev.correct:
        kind = REWRITE if is_rewrite(ev) else "custom kernel"
        lines.append(f"Kind of result: {kind}")
    accuracy = accuracy_phrase(getattr(ev, "accuracy", None))
    if accuracy and not m.reference_only:
        lines.append(f"Accuracy: {accuracy}")
    light = light_words(ev)
    if light:
        lines.append(light)
    cut = shortcut_phrase(ev)
    if cut and not m.reference_only:
        lines.append(f"Algebraic shortcut: {cut}")
    train = train_difference(getattr(ev, "accuracy", None)) if "eval_only" in ev.flags else None
    if train:
        lines.append(f"Training mode: {train} (correct in eval mode only: not counted)")
    where = [ran_on(ev)]
    if isinstance(ev.device, dict) and ev.device.get("name"):
        where.append(f"on {ev.device['name']}")
    shared = shared_gpu(ev)
    if shared is not None:
        where.append("GPU shared with other processes during the run" if shared else "GPU not shared")
    sandboxed = m.sandboxed if m.sandboxed is not None else getattr(ev, "sandboxed", None)
    if sandboxed is not None:
        where.append("ran sandboxed" if sandboxed else "ran without a sandbox")
    if where:
        lines.append(" · ".join(where))
    return lines


def ran_on(ev: Evaluation) -> str:
    """Where an Evaluation ran: "ran on the Ray cluster, node 10.0.0.5 (node 1a2b…, GPU 0)" or
    "ran on this machine" (the GPU's name follows in the hover and tooltip)."""
    if getattr(ev, "executor", "local") == "ray":
        return f"ran on the Ray cluster, node {ev.node}" if ev.node else "ran on the Ray cluster"
    return "ran on this machine"


def where_words(m: Measurement) -> str:
    """Where the numbers were measured, on what GPU, which version."""
    ev = m.evaluation
    parts = [ran_on(ev)]
    if isinstance(ev.device, dict) and ev.device.get("name"):
        parts.append(f"on {ev.device['name']}")
    parts.append(version_words(m))
    return " · ".join(parts)


def lens_tooltip(m: Measurement) -> str:
    """The numbers lens' tooltip: where (where_words), then this code and both baselines with
    their spreads, and how the baselines were had (kept or measured now)."""
    ev = m.evaluation
    parts = [where_words(m)]
    for label, t in (("this code", None if m.reference_only else ev.time), ("eager", ev.eager),
                     ("torch.compile", ev.compiled)):
        if t is not None:
            parts.append(f"{label} {fmt_ms(t.median_ms)} ±{t.spread_pct:.1f}%")
    said = baselines_words(ev)
    if said:
        parts.append(said)
    sol = speed_of_light(ev)
    if sol and sol.get("label"):
        parts.append(f"speed of light: {sol['label']}")
    return " · ".join(parts)


def baselines_kept(ev: Evaluation) -> bool:
    b = getattr(ev, "baselines", None)
    return isinstance(b, dict) and bool(b.get("cached"))


def baselines_words(ev: Evaluation) -> str:
    """"baselines kept from 2026-12-03 18:27 (Re-measure baselines to time them again)" or
    "baselines measured now, interleaved with this code" (and why they were not kept)."""
    b = getattr(ev, "baselines", None)
    if not isinstance(b, dict):
        return ""
    when = b.get("measured_at")
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(when)) if isinstance(when, (int, float)) else "?"
    if b.get("cached"):
        return f"baselines kept from {stamp} (Re-measure baselines to time them again)"
    words = "baselines measured now" + (", interleaved with this code" if b.get("interleaved") else "")
    why = str(b.get("why") or "")
    if why.startswith("not kept") or why.startswith("measured again"):
        words += f" ({why})"
    return words


def status_entry(state: DocumentState) -> dict[str, Any] | None:
    m = state.measurement
    if m is None:
        return None
    ev = m.evaluation
    stale = not m.fresh_for(state.text)
    return {"uri": state.uri, "version": m.version, "stale": stale, "summary": lens_title(m, state.text),
            "verdict": ev.verdict, "speedupEager": None if m.reference_only else ev.speedup_eager,
            "speedupCompile": None if m.reference_only else ev.speedup_compile,
            "spreadPct": ev.time.spread_pct if ev.time else None, "rewrite": is_rewrite(ev),
            "referenceOnly": m.reference_only, "where": where_words(m), "builtAhead": state.built_ahead}


def verdict_words(ev: Evaluation) -> str:
    evidence = ev.evidence or {}
    if ev.verdict == "mismatch" and isinstance(evidence.get("ratio"), (int, float)):
        where = evidence.get("where")
        return (f"wrong: {evidence.get('output', 'output')} is {times_phrase(evidence['ratio'])} PyTorch's error "
                "against float64" + (f" at {list(where)}" if where else "")
                + (f" (input set {evidence['input_set']})" if "input_set" in evidence else ""))
    if ev.verdict == "mismatch" and "max_abs_err" in evidence:
        where = evidence.get("where")
        return (f"wrong: {evidence.get('output', 'output')} differs by {evidence['max_abs_err']:.1e}"
                + (f" at {list(where)}" if where else "")
                + (f" (input set {evidence['input_set']})" if "input_set" in evidence else ""))
    words = {"unwritten_output": "wrong: output elements left unwritten",
             "mutated_input": "wrong: changes its inputs", "stale_result": "wrong: reuses stale results",
             "bad_output": "wrong output type or shape", "nan": "wrong: NaN in the output",
             "timeout": "timed out", "crashed": "crashed", "oom": "out of memory",
             "compile_error": "does not compile", "error": "raised an error"}
    if ev.verdict == "not_run":
        return f"not run: {ev.message}" if ev.message else "not run"
    return words.get(ev.verdict, ev.verdict)


def hot_ops(profile: dict | None, share: float) -> list[dict]:
    if not profile:
        return []
    table = profile.get("reference")  # the engine's profile: {"reference": hot ops, "candidate": ...}
    ops = table.get("ops", []) if isinstance(table, dict) else []
    return [op for op in ops if op.get("share_pct", 0) >= share * 100][:3]


def regression_message(previous: Evaluation | None, ev: Evaluation) -> str | None:
    if previous is None or not previous.correct or previous.time is None or ev.time is None:
        return None
    if previous.candidate == ev.candidate:
        return None  # the same text again: a difference is noise, not a regression
    noise = max(MIN_REGRESSION, 2 * (previous.time.spread_pct + ev.time.spread_pct) / 100)
    if ev.time.median_ms > previous.time.median_ms * (1 + noise):
        return (f"slower than the last run of this Target: {fmt_ms(ev.time.median_ms)} now, "
                f"{fmt_ms(previous.time.median_ms)} before")
    return None


def fmt_ms(ms: float) -> str:
    return f"{ms * 1000:.1f} us" if ms < 1 else f"{ms:.2f} ms"


def _first(doc: "Document", kind: TargetKind) -> Target | None:
    return next((t for t in doc.targets if t.kind == kind), None)


def anchor_target(doc: "Document") -> Target | None:
    if doc.path.endswith(".py"):
        new = _first(doc, TargetKind.CANDIDATE_MODEL)
        if new is not None:
            return new
        if doc.task is not None and doc.task.is_reference:
            return _first(doc, TargetKind.TASK_MODEL)
        return None
    if not doc.path.endswith(".cu") or not os.path.exists(os.path.splitext(doc.path)[0] + ".py"):
        return None
    exports = [t for t in doc.targets if t.kind == TargetKind.HOST_EXPORT]
    kernels = [t for t in doc.targets if t.kind == TargetKind.CUDA_KERNEL]
    return (exports or kernels or [None])[0]

