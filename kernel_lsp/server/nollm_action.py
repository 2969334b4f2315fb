"""The code action "Write this module's kernels (no LLM)": torch.compile's kernels for the module
at its Task's shapes, as a standalone ModelNew file beside the source (kernel_lsp/nollm).

Answered at once (codeAction); the work is a command run as a job with progress and cancel:
the Worker records Inductor's code on the GPU, the writer makes the file, the engine verifies
and times it like any candidate; only a correct file is offered, as a new file beside the
source (never the user's own file), with its verdict and both baselines in the prompt. On a
machine without a GPU, or where the module cannot be converted, it says why in one sentence.
"""

from __future__ import annotations

import os
from typing import Any

from lsprotocol import types

from kernel_lsp.model import Candidate, TargetKind
from kernel_lsp.server.commands import CommandError, DocumentArgs, parse_args
from kernel_lsp.server.evaluation import anchor_target, fmt_ms
from kernel_lsp.server.progress import WorkProgress

COMMAND = "kernel-lsp.writeKernels"
TITLE = "Write this module's kernels (no LLM)"


def code_actions(feature: Any, state: Any, params: types.CodeActionParams) -> list[types.CodeAction]:
    if state.is_cuda:
        return []
    target = anchor_target(feature.server.document(state))
    if target is None or target.kind != TargetKind.TASK_MODEL:
        return []
    return [types.CodeAction(title=TITLE, kind=types.CodeActionKind.RefactorRewrite, is_preferred=False,
                             command=types.Command(title=TITLE, command=COMMAND, arguments=[{"uri": state.uri}]))]


def beside(path: str) -> str:
    """A new file next to `path` that does not exist yet (never one of the user's files)."""
    stem, _ = os.path.splitext(path)
    candidate, n = f"{stem}_triton.py", 2
    while os.path.exists(candidate):
        candidate, n = f"{stem}_triton_{n}.py", n + 1
    return candidate


async def write_kernels_command(feature: Any, args: tuple[Any, ...], run_type: Any) -> dict[str, Any]:
    ls = feature.server
    uri = parse_args(COMMAND, DocumentArgs, args).uri
    state = ls.state(uri)
    if state.is_cuda:
        raise CommandError("this action writes kernels for a PyTorch module (a .py with class Model); "
                           "a .cu already holds its kernels")
    title = f"Write kernels for {os.path.basename(state.path)}"
    job = None

    def cancel() -> None:
        if job is not None:
            job.task.cancel()

    job = ls.jobs.start(("nollm", uri), title, _job(feature, state, run_type, title, cancel), uri=uri)
    result = await ls.jobs.wait(job)
    return result if result is not None else {"written": False, "cancelled": True, "reason": "cancelled"}


async def _job(feature: Any, state: Any, run_type: Any, title: str, cancel: Any) -> dict[str, Any]:
    from kernel_lsp.engine.caller.tasks import TaskError
    from kernel_lsp.nollm.proposer import NO_GPU, MODE_LABELS, generate, label
    from kernel_lsp.server.engine_host import ExecutionDisabled
    from kernel_lsp.server import handback

    ls = feature.server
    text = state.text
    progress = WorkProgress(ls, title, on_cancel=cancel)
    await progress.begin("starting the GPU Worker")

    def said(why: str) -> dict[str, Any]:
        progress.end(why)
        ls.show(f"kernel-lsp: {why}", types.MessageType.Warning)
        return {"written": False, "reason": why}

    try:
        task, _ = ls.host.task_for(state.path, text)
        engine = await ls.host.executor(progress.report)
        info = dict(await engine.device_info() or {})
        if info.get("cuda") is False:
            return said(NO_GPU)
        progress.report("torch.compile is writing the kernels (default and max-autotune)", 10)
        gens, why = await generate(engine, task.reference_source)
        if not gens:
            reasons = "; ".join(w for w in why.values())
            return said(f"no standalone file could be written from torch.compile's code: {reasons}")
        mode, gen = next(iter(gens.items()))
        cand = Candidate(source=gen.source, kind="python", origin="tuner", note=label(gen, mode))
        progress.report("verifying and timing the generated file", 60)
        ev = await engine.evaluate(task, cand)
    except (TaskError, ExecutionDisabled, ValueError) as exc:
        return said(str(exc))
    except BaseException:
        progress.end("cancelled")
        raise
    if ev.verdict != "correct":
        return said(f"the generated file was not correct here ({ev.verdict}: {ev.message or 'no detail'}); "
                    "nothing was written")
    parts = [f"correct; {fmt_ms(ev.time.median_ms)}" if ev.time else "correct"]
    if ev.speedup_eager is not None:
        parts.append(f"{ev.speedup_eager:.2f}x PyTorch eager")
    if ev.speedup_compile is not None:
        parts.append(f"{ev.speedup_compile:.2f}x torch.compile")
    gain = " · ".join(parts)
    run = run_type(uri=state.uri, version=state.version, text=text, best=cand, gain=gain,
                   target=beside(state.path))
    message = (f"kernel-lsp: {label(gen, mode)} ({MODE_LABELS.get(mode, mode)}), {gain}. "
               f"Create {os.path.basename(run.target)} beside {os.path.basename(state.path)}?")
    progress.end(gain)
    out: dict[str, Any] = {"written": False, "target": run.target, "label": cand.note, "gain": gain,
                           "verdict": ev.verdict, "why_not": why}
    # Kept for kernel-lsp.applyCandidate (an editor that shows the diff itself): under a negative
    # key, so a Search's own result (positive ids) is still the default one.
    run.search_id = min([0, *feature.runs]) - 1
    feature.runs[run.search_id] = run
    if await handback.ask(ls, run, message):
        applied = await handback.apply(ls, run)
        out.update(applied)
        out["written"] = bool(applied.get("applied"))
    return out
