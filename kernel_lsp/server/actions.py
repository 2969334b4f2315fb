"""Code actions (answered at once: no LLM call, nothing preferred) and the commands they run:
optimize, tune, fix a compile error, create a harness, cancel, report."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from lsprotocol import types

from kernel_lsp.model import Candidate, TargetKind
from kernel_lsp.server import evaluations, handback
from kernel_lsp.server.app import KernelLanguageServer, is_cuda
from kernel_lsp.server.engine_host import ExecutionDisabled
from kernel_lsp.server.progress import WorkProgress

log = logging.getLogger(__name__)

# A reference-only file gets a ModelNew that is the reference, for the agent to rewrite.
MODELNEW_SHIM = "\n\nclass ModelNew(Model):\n    \"\"\"Starts as the reference; the agent rewrites it.\"\"\"\n"


@dataclass
class SearchRun:
    """A Search started from the editor: what it started from, for the guard at apply time."""

    uri: str
    version: int | None
    text: str
    target: str | None
    best: Candidate | None = None   # the guard's winner, once the Search found one
    search_id: int | None = None


def register(server: KernelLanguageServer) -> None:
    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(
        code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.RefactorRewrite,
                           types.CodeActionKind.Source], resolve_provider=False))
    def code_action(ls: KernelLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        return actions_for(ls, params)

    @server.command("kernel-lsp.optimize")
    async def optimize(ls: KernelLanguageServer, args: dict[str, Any] | None = None) -> dict:
        return await run_search(ls, args or {}, proposer=(args or {}).get("proposer"))

    @server.command("kernel-lsp.tune")
    async def tune(ls: KernelLanguageServer, args: dict[str, Any] | None = None) -> dict:
        return await run_search(ls, args or {}, proposer="tuner")

    @server.command("kernel-lsp.fixCompileError")
    async def fix(ls: KernelLanguageServer, args: dict[str, Any] | None = None) -> dict:
        return await run_search(ls, args or {}, proposer="llm", repair_only=True)

    @server.command("kernel-lsp.createHarness")
    async def create_harness(ls: KernelLanguageServer, args: dict[str, Any] | None = None) -> dict:
        return await write_harness(ls, evaluations.uri_arg(args, "kernel-lsp.createHarness"))

    @server.command("kernel-lsp.cancel")
    def cancel(ls: KernelLanguageServer, args: dict[str, Any] | None = None) -> dict:
        job = (args or {}).get("job") if isinstance(args, dict) else None
        return {"cancelled": ls.jobs.cancel(job)}

    @server.command("kernel-lsp.showReport")
    async def show_report(ls: KernelLanguageServer, args: dict[str, Any] | None = None) -> dict:
        from kernel_lsp.agent.report import write_report

        search = (args or {}).get("search") if isinstance(args, dict) else None
        store = ls.host.store()
        if search is None:
            searches = store.searches()
            if not searches:
                raise ValueError("no Search in this workspace's store yet")
            search = searches[0]["id"]
        path = os.path.join(ls.host.root, ".kernel-lsp", "reports", f"search-{search}.html")
        write_report(store, int(search), path)
        uri = "file://" + path
        _show(ls, uri, external=True)
        return {"path": path, "uri": uri}


def actions_for(ls: KernelLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    uri = params.text_document.uri
    doc = ls.document(uri)
    out: list[types.CodeAction] = []
    llm = ls.settings.effective_proposer() == "llm"

    def action(title: str, kind: str, command: str, args: dict, llm_made: bool,
               diagnostics: list[types.Diagnostic] | None = None) -> types.CodeAction:
        return types.CodeAction(
            title=title, kind=kind, is_preferred=False, diagnostics=diagnostics,
            tags=[types.CodeActionTag.LlmGenerated] if llm_made else None,
            command=types.Command(title=title, command=command, arguments=[args]))

    for diag in params.context.diagnostics:
        if diag.source == "nvcc" and diag.severity == types.DiagnosticSeverity.Error:
            out.append(action("Fix this compile error with the agent", types.CodeActionKind.QuickFix,
                              "kernel-lsp.fixCompileError",
                              {"uri": uri, "diagnostic": {"line": diag.range.start.line, "message": diag.message}},
                              True, [diag]))
        if diag.source == "kernel-lsp" and diag.code == "hot-op":
            out.append(action("Optimize this module (hot op)", types.CodeActionKind.RefactorRewrite,
                              "kernel-lsp.optimize", {"uri": uri}, llm, [diag]))
    target = evaluations.anchor_target(ls, uri)
    if target is None:
        model = next((t for t in doc.targets if t.kind == TargetKind.TASK_MODEL), None)
        target = model if doc.task is not None and getattr(doc.task, "is_reference", False) else None
    if target is not None:
        args = {"uri": uri, "target": target.name}
        out.append(action("Optimize this kernel" + (" (LLM agent)" if llm else " (tuner)"),
                          types.CodeActionKind.RefactorRewrite, "kernel-lsp.optimize", args, llm))
        if is_cuda(uri) or doc.embedded:
            out.append(action("Tune launch parameters", types.CodeActionKind.RefactorRewrite,
                              "kernel-lsp.tune", args, False))
        out.append(action("Benchmark now", types.CodeActionKind.Source, "kernel-lsp.benchmark", args, False))
    elif doc.path.endswith(".cu") and not os.path.exists(harness_path(doc.path)):
        out.append(action("Create a harness", types.CodeActionKind.Source, "kernel-lsp.createHarness",
                          {"uri": uri}, False))
    return out


def harness_path(cu_path: str) -> str:
    return os.path.splitext(cu_path)[0] + ".py"


async def run_search(ls: KernelLanguageServer, args: dict[str, Any], proposer: str | None,
                     repair_only: bool = False) -> dict:
    uri = evaluations.uri_arg(args, "kernel-lsp.optimize")
    document = ls.workspace.get_text_document(uri)
    run = SearchRun(uri=uri, version=document.version, text=document.source, target=args.get("target"))
    kind = proposer or ls.settings.effective_proposer()
    title = f"{'Repair' if repair_only else 'Tune' if kind == 'tuner' else 'Optimize'} {os.path.basename(ls.path(uri))}"
    job = None

    def cancel() -> None:
        if job is not None:
            job.task.cancel()

    job = ls.jobs.start(("search", uri), title, search_job(ls, run, kind, repair_only, title, cancel), uri=uri)
    result = await ls.jobs.wait(job)
    return result if result is not None else {"improved": False, "cancelled": True}


async def search_job(ls: KernelLanguageServer, run: SearchRun, kind: str, repair_only: bool,
                     title: str, cancel) -> dict:
    from kernel_lsp.agent import Budget, Search, SearchOptions
    from kernel_lsp.engine.tasks import TaskError

    progress = WorkProgress(ls, title, on_cancel=cancel)
    await progress.begin("starting")
    search: Search | None = None
    try:
        task, candidate = ls.host.task_for(ls.path(run.uri), run.text)
        if candidate is None:
            candidate = Candidate(source=run.text + MODELNEW_SHIM, kind="python")
        proposer = make_proposer(ls, kind)
        budget = Budget(proposals=2 if repair_only else ls.settings.agent_budget)
        search = Search(ls.host.engine(), ls.host.store(), task, candidate, proposer,
                        SearchOptions(budget=budget, repair_only=repair_only))
        job = ls.jobs.get(("search", run.uri))

        def on_event(event) -> None:
            left = event.budget_left.get("proposals") if isinstance(event.budget_left, dict) else None
            message = f"round {event.round}: {event.message or event.kind}"
            if left is not None:
                message += f" · {left} proposal{'s' if left != 1 else ''} left"
            if job is not None:
                # The status carries the best speedup in its own field; editors show it there.
                job.message = message
                if event.best_speedup is not None:
                    job.best_speedup = event.best_speedup
                ls.send_status()
            best = f" · best {event.best_speedup:.2f}x (unconfirmed)" if event.best_speedup else ""
            total = budget.proposals or 1
            progress.report(message + best, int(100 * (total - (left if left is not None else total)) / total))

        result = await search.run(progress=on_event)
    except (TaskError, ExecutionDisabled, ValueError) as exc:
        progress.end(str(exc))
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=f"kernel-lsp: {exc}"))
        return {"improved": False, "error": str(exc)}
    except BaseException:
        progress.end("cancelled: what was found is kept in the store")
        raise
    finally:
        if search is not None and hasattr(search.proposer, "aclose"):
            await search.proposer.aclose()
    summary = result.to_dict()
    if result.improved and result.best is not None:
        ls.search_runs[result.search_id] = run
        progress.end(describe_gain(result))
        await handback.offer(ls, run, result)
    else:
        progress.end(f"no improvement ({result.reason})")
        ls.window_show_message(types.ShowMessageParams(
            type=types.MessageType.Info,
            message=f"kernel-lsp: no correct, faster version found ({result.reason}); your file is unchanged."))
    return summary


def describe_gain(result) -> str:
    """A repaired start has no speedup to show: it did not run before."""
    if result.speedup is None:
        return "repaired: the new version compiles and passes verification"
    return f"{result.speedup:.2f}x faster, verified"


def make_proposer(ls: KernelLanguageServer, kind: str):
    if kind == "tuner":
        from kernel_lsp.agent import TunerProposer

        return TunerProposer()
    from kernel_lsp.agent import LLMConfig, LLMProposer

    settings = ls.settings
    config = LLMConfig.from_env(model=settings.agent_model, base_url=settings.agent_base_url)
    return LLMProposer(config)


async def write_harness(ls: KernelLanguageServer, uri: str) -> dict:
    """A KernelBench-format skeleton beside a .cu, never over an existing file."""
    from kernel_lsp.server.harness_template import harness_for

    doc = ls.document(uri)
    path = harness_path(doc.path)
    if os.path.exists(path):
        raise ValueError(f"{os.path.basename(path)} already exists; kernel-lsp never overwrites it")
    text = harness_for(doc)
    target_uri = "file://" + path
    edit = types.WorkspaceEdit(document_changes=[
        types.CreateFile(uri=target_uri, options=types.CreateFileOptions(overwrite=False, ignore_if_exists=True)),
        types.TextDocumentEdit(
            text_document=types.OptionalVersionedTextDocumentIdentifier(uri=target_uri, version=None),
            edits=[types.TextEdit(range=types.Range(start=types.Position(line=0, character=0),
                                                    end=types.Position(line=0, character=0)), new_text=text)]),
    ])
    result = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(
        edit=edit, label="Create a KernelBench harness"))
    if not result.applied:  # a client that cannot create files: write it ourselves, it is new
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(text)
    _show(ls, target_uri)
    return {"path": path}


def _show(ls: KernelLanguageServer, uri: str, external: bool = False, take_focus: bool = True) -> None:
    window = ls.client_capabilities.window
    if window and window.show_document and window.show_document.support:
        ls.window_show_document(types.ShowDocumentParams(uri=uri, external=external or None,
                                                         take_focus=take_focus))
