"""Verify and time Targets with a harness: on save (per the `on_save` setting) and on the
"Benchmark" command. Results go to the store first; lenses, diagnostics and hovers are
read back from it, so they survive a restart."""

from __future__ import annotations

import logging
import os
from typing import Any

from lsprotocol import types

from kernel_lsp.model import Evaluation, Span, Target, TargetKind
from kernel_lsp.server.app import KernelLanguageServer
from kernel_lsp.server.engine_host import ExecutionDisabled
from kernel_lsp.server.progress import WorkProgress

log = logging.getLogger(__name__)

MIN_REGRESSION = 0.05  # a slowdown smaller than this (or than the noise) is not reported


def register(server: KernelLanguageServer) -> None:
    @server.command("kernel-lsp.benchmark")
    async def benchmark(ls: KernelLanguageServer, args: dict[str, Any] | None = None) -> dict | None:
        uri = uri_arg(args, "kernel-lsp.benchmark")
        job = schedule(ls, uri, ("compile", "verify", "bench"), visible=True)
        ev = await ls.jobs.wait(job)
        return ev.summary() if ev is not None else None

    @server.feature(types.TEXT_DOCUMENT_CODE_LENS)
    def code_lens(ls: KernelLanguageServer, params: types.CodeLensParams) -> list[types.CodeLens]:
        return lenses(ls, params.text_document.uri)


def uri_arg(args: Any, command: str) -> str:
    """The `uri` of a command's argument object; a clear error when it is missing."""
    if isinstance(args, dict) and isinstance(args.get("uri"), str):
        return args["uri"]
    raise ValueError(f"{command} needs an argument {{uri}}")


def on_save(ls: KernelLanguageServer, uri: str) -> None:
    checks = [c for c in ("verify", "bench") if c in ls.settings.on_save]
    if checks and ls.settings.execution_enabled and anchor_target(ls, uri) is not None:
        schedule(ls, uri, ("compile", *checks), visible=False)


def schedule(ls: KernelLanguageServer, uri: str, checks: tuple[str, ...], visible: bool):
    """Verify/time the document's Task; a newer request for the same file cancels the older."""
    text = ls.workspace.get_text_document(uri).source
    title = f"{'Benchmark' if 'bench' in checks else 'Verify'} {os.path.basename(ls.path(uri))}"
    job = None

    def cancel() -> None:
        if job is not None:
            job.task.cancel()

    job = ls.jobs.start(("evaluate", uri), title, run_checks(ls, uri, text, checks, title, cancel),
                        uri=uri, visible=visible)
    return job


async def run_checks(ls: KernelLanguageServer, uri: str, text: str, checks: tuple[str, ...],
                     title: str, cancel) -> Evaluation | None:
    from kernel_lsp.engine.tasks import TaskError

    progress = WorkProgress(ls, title, on_cancel=cancel)
    await progress.begin("starting the Worker")
    try:
        task, candidate = ls.host.task_for(ls.path(uri), text)
        if candidate is None:
            progress.end("this file has a reference Model but no ModelNew to measure")
            return None
        store = ls.host.store()
        previous = store.latest(task.name)
        engine = ls.host.engine()

        def phase(name: str, *rest: Any) -> None:
            progress.report(str(name))

        ev = await engine.evaluate(task, candidate, checks=checks, progress=phase)
    except (TaskError, ExecutionDisabled) as exc:
        progress.end(str(exc))
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning,
                                                       message=f"kernel-lsp: {exc}"))
        return None
    except BaseException:
        progress.end("cancelled")
        raise
    hot = None
    if ev.correct and "bench" in checks and task.cuda_path is None:
        try:
            hot = await engine.profile(task)
        except Exception as exc:  # a profile is a bonus: its failure must not hide the result
            log.warning("profile of %s failed: %s", task.name, exc)
    publish(ls, uri, ev, previous, hot)
    progress.end(lens_title(ev))
    return ev


def publish(ls: KernelLanguageServer, uri: str, ev: Evaluation, previous: Evaluation | None,
            hot: dict | None = None) -> None:
    ls.evaluations[uri] = ev
    target = anchor_target(ls, uri)
    span = target.name_span if target else Span(0, 0, 0, 0)
    positions = ls.positions(uri)
    out: list[types.Diagnostic] = []

    def add(severity: types.DiagnosticSeverity, message: str, code: str, at: Span = span) -> None:
        out.append(types.Diagnostic(range=positions.range(at), severity=severity, message=message,
                                    source="kernel-lsp", code=code))

    if ev.verdict not in ("correct", "not_run"):
        add(types.DiagnosticSeverity.Error, f"{lens_title(ev)}. {ev.message}".strip(), ev.verdict)
    for flag in ev.flags:
        add(types.DiagnosticSeverity.Warning, f"flagged: {flag.replace('_', ' ')}: {ev.message}", flag)
    if ev.correct and ev.time is not None:
        if ev.eager is not None and (ev.speedup_eager or 0) < 1.0:
            add(types.DiagnosticSeverity.Warning,
                f"slower than PyTorch eager: {_fmt(ev.time.median_ms)} vs {_fmt(ev.eager.median_ms)}", "slower-than-eager")
        if ev.compiled is not None and (ev.speedup_compile or 0) < 1.0:
            add(types.DiagnosticSeverity.Warning,
                f"slower than torch.compile: {_fmt(ev.time.median_ms)} vs {_fmt(ev.compiled.median_ms)}",
                "slower-than-compile")
        regression = regression_message(previous, ev)
        if regression:
            add(types.DiagnosticSeverity.Warning, regression, "regression")
    for op in hot_ops(hot, ls.settings.slow_share):
        model = _find(ls, uri, TargetKind.TASK_MODEL)
        add(types.DiagnosticSeverity.Information,
            f"hot op {op['name']}: {op['share_pct']:.0f}% of Model.forward's time "
            f"({op.get('count', 1)} calls); the Optimize action can target it", "hot-op",
            model.name_span if model else span)
    ls.set_diagnostics(uri, "evaluation", out)
    refresh_lenses(ls)


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
        return (f"slower than the last run of this Target: {_fmt(ev.time.median_ms)} now, "
                f"{_fmt(previous.time.median_ms)} before")
    return None


def lens_title(ev: Evaluation) -> str:
    """"correct · 1.84x eager · 0.97x torch.compile · 41.2 us" or "wrong: output 0 differs…"."""
    if ev.verdict == "correct":
        parts = ["correct"]
        if ev.speedup_eager is not None:
            parts.append(f"{ev.speedup_eager:.2f}x eager")
        if ev.speedup_compile is not None:
            parts.append(f"{ev.speedup_compile:.2f}x torch.compile")
        if ev.time is not None:
            parts.append(_fmt(ev.time.median_ms))
        return " · ".join(parts)
    evidence = ev.evidence or {}
    if ev.verdict == "mismatch" and "max_abs_err" in evidence:
        where = evidence.get("where")
        return (f"wrong: {evidence.get('output', 'output')} differs by {evidence['max_abs_err']:.1e}"
                + (f" at {list(where)}" if where else "")
                + (f" (input set {evidence['input_set']})" if "input_set" in evidence else ""))
    words = {"unwritten_output": "wrong: output elements left unwritten",
             "mutated_input": "wrong: changes its inputs", "stale_result": "wrong: reuses stale results",
             "bad_output": "wrong output type or shape", "nan": "wrong: NaN in the output",
             "timeout": "timed out", "crashed": "crashed", "oom": "out of memory",
             "compile_error": "does not compile", "error": "raised an error", "not_run": "not run"}
    return words.get(ev.verdict, ev.verdict)


def _fmt(ms: float) -> str:
    return f"{ms * 1000:.1f} us" if ms < 1 else f"{ms:.2f} ms"


def _find(ls: KernelLanguageServer, uri: str, kind: TargetKind) -> Target | None:
    return next((t for t in ls.document(uri).targets if t.kind == kind), None)


def anchor_target(ls: KernelLanguageServer, uri: str) -> Target | None:
    """Where a document's Task shows: ModelNew, else the .cu's entry export or first kernel."""
    doc = ls.document(uri)
    if doc.path.endswith(".py"):
        return _find(ls, uri, TargetKind.CANDIDATE_MODEL)
    if not doc.path.endswith(".cu") or not os.path.exists(os.path.splitext(doc.path)[0] + ".py"):
        return None
    exports = [t for t in doc.targets if t.kind == TargetKind.HOST_EXPORT]
    kernels = [t for t in doc.targets if t.kind == TargetKind.CUDA_KERNEL]
    return (exports or kernels or [None])[0]


def latest(ls: KernelLanguageServer, uri: str) -> Evaluation | None:
    """The last Evaluation of the document's Task: memory first, then the store."""
    if uri in ls.evaluations:
        return ls.evaluations[uri]
    try:
        task, _ = ls.host.task_for(ls.path(uri), ls.workspace.get_text_document(uri).source)
        ev = ls.host.store().latest(task.name)
    except Exception:  # no task, no store yet: no lens text
        return None
    if ev is not None:
        ls.evaluations[uri] = ev
    return ev


def lenses(ls: KernelLanguageServer, uri: str) -> list[types.CodeLens]:
    target = anchor_target(ls, uri)
    doc = ls.document(uri)
    positions = ls.positions(uri)
    out: list[types.CodeLens] = []
    if target is None:
        if doc.path.endswith(".cu"):
            kernel = next((t for t in doc.targets if t.kind == TargetKind.CUDA_KERNEL), None)
            if kernel is not None:
                out.append(types.CodeLens(range=positions.range(kernel.name_span), command=types.Command(
                    title="no harness: Create a harness", command="kernel-lsp.createHarness",
                    arguments=[{"uri": uri}])))
        return out
    rng = positions.range(target.name_span)
    ev = latest(ls, uri)
    running = ls.jobs.get(("evaluate", uri))
    title = ("measuring…" if running else lens_title(ev) if ev else "not measured yet")
    args = [{"uri": uri, "target": target.name}]
    out.append(types.CodeLens(range=rng, command=types.Command(title=title, command="kernel-lsp.benchmark",
                                                               arguments=args)))
    out.append(types.CodeLens(range=rng, command=types.Command(title="Benchmark", command="kernel-lsp.benchmark",
                                                               arguments=args)))
    out.append(types.CodeLens(range=rng, command=types.Command(title="Optimize", command="kernel-lsp.optimize",
                                                               arguments=args)))
    return out


def refresh_lenses(ls: KernelLanguageServer) -> None:
    workspace = ls.client_capabilities.workspace
    lens = workspace.code_lens if workspace else None
    if lens and lens.refresh_support:  # Neovim has no handler for it (DESIGN.md trap)
        ls.workspace_code_lens_refresh(None)


def history_markdown(ls: KernelLanguageServer, uri: str, limit: int = 5) -> str:
    """The last evaluation and this Target's recent runs, for the hover."""
    try:
        task, _ = ls.host.task_for(ls.path(uri), ls.workspace.get_text_document(uri).source)
        runs = ls.host.store().evaluations(task.name, limit=limit)
    except Exception:
        return ""
    if not runs:
        return ""
    lines = [f"**Last evaluation**: {lens_title(runs[0])}"]
    if runs[0].message:
        lines.append(runs[0].message)
    if runs[0].device:
        lines.append(f"on {runs[0].device.get('name', 'unknown device')}")
    rows = ["| run | verdict | time | eager | torch.compile |", "| --- | --- | --- | --- | --- |"]
    for n, ev in enumerate(runs):
        rows.append(f"| {n + 1} | {ev.verdict} | {_fmt(ev.time.median_ms) if ev.time else '-'} | "
                    f"{_fmt(ev.eager.median_ms) if ev.eager else '-'} | "
                    f"{_fmt(ev.compiled.median_ms) if ev.compiled else '-'} |")
    lines.append("**History** (newest first)\n\n" + "\n".join(rows))
    return "\n\n".join(lines)
