"""The hot-op action: optimize one submodule of a model through the whole-model flow
(agent/whole_model.py's `optimize_op`), in the background, and offer the integrated model.

The op is extracted as a Task into `.kernel-lsp/ops/` (the user's to bench and optimize),
searched, put back behind its guard and the whole model verified against eager and
torch.compile. Only an integrated model that is correct and faster end to end is offered:
as a new file `<model>_optimized.py` (it imports the model file, so it cannot replace it),
previewed first, created by a WorkspaceEdit on Apply.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from kernel_lsp.model import Candidate
from kernel_lsp.server.commands import OpArgs, parse_args
from kernel_lsp.server.engine_host import ExecutionDisabled
from kernel_lsp.server.evaluation import NOISY_SPREAD
from kernel_lsp.server.progress import WorkProgress

if TYPE_CHECKING:
    from kernel_lsp.agent.whole_model import OpResult, WholeModelResult
    from kernel_lsp.server.optimize import OptimizeFeature
    from kernel_lsp.server.state import DocumentState

log = logging.getLogger(__name__)

COMMAND = "kernel-lsp.optimizeOp"
MAX_ACTIONS = 4  # per request: the ops a line stands for, or Model's submodules at the hot-op note


def ops_for(text: str, line: int, at_hot_op: bool) -> list[str]:
    """The submodules an action at `line` targets: those the line stands for (`self.fc(...)`,
    a line of RowLinear's code, ...); at the hot-op note on `class Model`, Model's submodules
    (the profile names aten ops, not submodules: each gets its own action)."""
    from kernel_lsp.agent.op_lines import ops_at

    tree = _tree(text)
    found = [o for o in ops_at(text, line) if o]
    if not found and at_hot_op:
        model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
        if model is not None:
            for ln in range(model.lineno - 1, model.end_lineno or model.lineno):
                found += [o for o in ops_at(text, ln) if o and "." not in o and o not in found]
    # `self.weight = nn.Parameter(...)` names a tensor, not a module
    params = {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) and _is_param(n.value)
              for t in n.targets if isinstance(t, ast.Attribute)}
    return [o for o in found if o.rpartition(".")[2] not in params][:MAX_ACTIONS]


def _tree(text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def _is_param(value: ast.AST) -> bool:
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    return (f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "") in (
        "Parameter", "Buffer", "tensor", "zeros", "ones", "randn", "empty")


def code_actions(feature: "OptimizeFeature", state: "DocumentState",
                 params: types.CodeActionParams) -> list[types.CodeAction]:
    """One "Optimize op X alone" action per op the range stands for (reference Model files only)."""
    doc = feature.server.document(state)
    if not state.path.endswith(".py") or doc.task is None or not doc.task.is_reference:
        return []
    hot = [d for d in params.context.diagnostics if d.source == "kernel-lsp" and d.code == "hot-op"]
    llm = feature.server.settings.effective_proposer() == "llm"
    out = []
    for op in ops_for(state.text, params.range.start.line, bool(hot)):
        title = f"Optimize op {op} alone (extract it, search it, put it back behind a guard)"
        out.append(types.CodeAction(
            title=title, kind=types.CodeActionKind.RefactorRewrite, is_preferred=False, diagnostics=hot or None,
            tags=[types.CodeActionTag.LlmGenerated] if llm else None,
            command=types.Command(title=title, command=COMMAND, arguments=[{"uri": state.uri, "op": op}])))
    return out


async def optimize_op_command(feature: "OptimizeFeature", args: tuple[Any, ...], new_run: Callable[..., Any],
                              make_proposer: Callable[[Any, str], Any]) -> dict[str, Any]:
    """`new_run`: optimize.SearchRun, `make_proposer`: optimize.make_proposer (passed in: the
    Search feature imports this module)."""
    a = parse_args(COMMAND, OpArgs, args)
    ls = feature.server
    state = ls.state(a.uri)
    name = os.path.basename(state.path)
    try:
        with open(state.path, encoding="utf-8") as fh:
            saved = fh.read()
    except OSError:
        saved = None
    if saved != state.text:  # the flow profiles and imports the file on disk
        reason = f"{name} has unsaved changes: save it first (the op is extracted from the saved file)"
        ls.show(f"kernel-lsp: {reason}", types.MessageType.Warning)
        return {"improved": False, "reason": reason}
    run = new_run(uri=a.uri, version=state.version, text=state.text)
    title = f"Optimize op {a.op} of {name}"
    job = None

    def cancel() -> None:
        if job is not None:
            job.task.cancel()

    job = ls.jobs.start(("search", a.uri, a.op), title, _job(feature, state, run, a, title, cancel, make_proposer), uri=a.uri)
    result = await ls.jobs.wait(job)
    return result if result is not None else {"improved": False, "cancelled": True,
                                              "reason": "cancelled: what was found is kept in the store"}


async def _job(feature: "OptimizeFeature", state: "DocumentState", run: Any, a: OpArgs, title: str,
               cancel, make_proposer: Callable[[Any, str], Any]) -> dict[str, Any]:
    from kernel_lsp.agent.search import SearchOptions
    from kernel_lsp.agent.whole_model import (WholeModelError, WholeModelOptions, integrated_text, optimize_op,
                                              optimized_path)
    from kernel_lsp.engine.caller.tasks import TaskError
    from kernel_lsp.server import handback
    from kernel_lsp.verdicts import CannotRun

    ls = feature.server
    kind = a.proposer or ls.settings.effective_proposer()
    progress = WorkProgress(ls, title, on_cancel=cancel)
    await progress.begin("profiling the model")
    job = ls.jobs.get(("search", a.uri, a.op))

    def on_progress(message: str) -> None:
        if job is not None:
            job.message = message
            ls.send_status()
        progress.report(message)

    budget = max(1, ls.settings.agent_budget)
    opts = WholeModelOptions(budget=budget, min_proposals=budget,
                             search=SearchOptions(kernels_only=ls.settings.kernels_only,
                                                   accept_less_accurate=ls.settings.accept_less_accurate))
    try:
        result = await optimize_op(state.path, a.op, ls.host.engine(), ls.host.store(),
                                   lambda _op: make_proposer(ls, kind), opts, root=ls.host.root,
                                   progress=on_progress)
    except (WholeModelError, TaskError, ExecutionDisabled, ValueError, CannotRun) as exc:
        progress.end(str(exc))
        ls.show(f"kernel-lsp: {exc}", types.MessageType.Error)
        return {"improved": False, "reason": str(exc)}
    except asyncio.CancelledError:
        progress.end("cancelled: what was found is kept in the store")
        raise
    except Exception as exc:  # noqa: BLE001 - an endpoint, store or disk failure: one line, no traceback
        log.exception("the hot-op action on %s failed", a.op)
        reason = f"the run for {a.op} failed: {type(exc).__name__}: {exc}"
        progress.end(reason)
        ls.show(f"kernel-lsp: {reason}", types.MessageType.Error)
        return {"improved": False, "reason": reason}
    op = next((o for o in result.ops if o.name == a.op), None)
    summary: dict[str, Any] = {"improved": result.improved, "record": result.record,
                               "op": op.to_dict() if op else None, "end_to_end": result.end_to_end,
                               "task": op.task if op else None}
    if op is not None and op.task is None:  # not extractable: said at once, nothing ran
        summary["reason"] = f"{a.op} could not be extracted as a Task: {op.reason.removeprefix('not extracted: ')}"
    elif not result.improved:
        summary["reason"] = _why_not(result, op)
    else:
        out, why_not = optimized_path(state.path)
        if out is None:
            summary.update(improved=False, reason=f"a verified, faster model was found (record {result.record}) "
                                                  f"but not offered: {why_not}")
        else:
            run.best = Candidate(source=integrated_text(result, out), kind="python", origin="whole-model", note=f"{a.op} integrated")
            run.search_id = result.record
            run.target = out
            run.gain = describe(op, result)
            if result.record is not None:
                feature.runs[result.record] = run
            # `search`/`best` as the optimize command's answer has them: editors apply by these ids
            summary.update(gain=run.gain, target=out, search=result.record, best=run.best.id)
            summary["message"] = (f"kernel-lsp: {a.op} of {os.path.basename(state.path)} put back behind a guard, "
                                  f"verified end to end: {run.gain}. Apply creates "
                                  f"{os.path.basename(out)} (your model file is unchanged).")
            progress.end(run.gain)
            if await handback.ask(ls, run, summary["message"]):
                summary["apply"] = await feature._apply(run)
            return summary
    numbers = describe(op, result) if op is not None and (op.speedup or result.end_to_end) else ""
    if numbers:
        summary["gain"] = numbers
    progress.end(f"nothing offered: {summary['reason']}")
    ls.show(f"kernel-lsp: nothing offered for {a.op}: {summary['reason']}"
            + (f" ({numbers})" if numbers else "") + ". Your files are unchanged"
            + (f"; the op's Task is {os.path.relpath(op.task, ls.host.root)}" if op and op.task else "") + ".")
    return summary


def _why_not(result: "WholeModelResult", op: "OpResult | None") -> str:
    if op is None:
        return result.reason
    e = result.end_to_end or {}
    if op.search is not None and op.search.improved and e:
        if not e.get("correct"):
            return f"the model with it is not correct end to end ({e.get('verdict')}: {e.get('message') or ''})"
        return op.reason or result.reason
    return f"{op.name}'s Search found no verified, faster version: {op.reason or result.reason}"


def describe(op: "OpResult | None", result: "WholeModelResult") -> str:
    """The op's share, its speedups (vs eager and vs torch.compile of the op, with spread), its
    kind, and the model's end-to-end speedups."""
    parts = []
    if op is not None:
        s = f"{op.name}: {100 * op.share:.0f}% of forward"
        if op.speedup:
            s += f", {op.speedup:.2f}x alone"
            if op.spread_pct is not None:
                s += f" ±{op.spread_pct:.0f}%"
            s += f" vs eager, {op.speedup_compile:.2f}x vs torch.compile of the op" if op.speedup_compile \
                else " vs eager (torch.compile of the op not timed)"
        if op.label:
            s += f" ({op.label})"
        parts.append(s)
    e = result.end_to_end or {}
    if e.get("speedup_eager"):
        s = "model end to end" + (f" ({e['label']})" if e.get("label") else "") + f" {e['speedup_eager']:.2f}x eager"
        s += f", {e['speedup_compile']:.2f}x torch.compile" if e.get("speedup_compile") \
            else " (torch.compile not timed)"
        if e.get("spread_pct") is not None:
            s += f" ±{e['spread_pct']:.1f}%"
        if e.get("device"):
            s += f" on {e['device']}"
        if (e.get("spread_pct") or 0) > NOISY_SPREAD:
            s += " (noisy timing: the ratios are rough)"
        if e.get("speedup_compile") is not None and e["speedup_compile"] < 1.0:
            s += "; torch.compile of the whole model is faster still: consider it"
        parts.append(s)
    return " · ".join(parts)
