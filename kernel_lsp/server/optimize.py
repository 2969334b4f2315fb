"""Optimize, tune and repair: code actions (answered at once: no LLM call, nothing preferred),
the Searches they start with progress, and the hand-back (preview, then a versioned edit).

This feature owns every `SearchRun`: made when a Search starts, kept while its verified,
faster winner waits to be applied, dropped once applied. After an Apply the new text is
measured again, so the lens shows numbers of the text in the editor.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from kernel_lsp.model import Candidate, Evaluation, Task, TargetKind
from kernel_lsp.server import handback, nollm_action, op_action
from kernel_lsp.server.commands import CommandError, DocumentArgs, JobArgs, OptimizeArgs, SearchArgs, parse_args
from kernel_lsp.server.engine_host import ExecutionDisabled
from kernel_lsp.server.evaluation import NOISY_SPREAD, REWRITE, anchor_target, fmt_ms, is_rewrite, reference_candidate
from kernel_lsp.server.feature import LanguageFeature
from kernel_lsp.server.progress import WorkProgress
from kernel_lsp.server.state import DocumentState

if TYPE_CHECKING:
    from kernel_lsp.agent import SearchResult

log = logging.getLogger(__name__)


@dataclass
class SearchRun:
    """A Search started from the editor: the text it started from (for the guard at apply
    time) and, once found, its verified winner."""

    uri: str
    version: int | None
    text: str
    best: Candidate | None = None
    search_id: int | None = None
    gain: str = ""  # how the winner compares, in words (the Apply prompt)
    target: str | None = None  # a new file the winner goes to (the hot-op action's integrated model)


class OptimizeFeature(LanguageFeature):
    name = "optimize"

    def __init__(self, server) -> None:
        super().__init__(server)
        self.runs: dict[int, SearchRun] = {}  # Searches whose winner waits to be applied

    # -- code actions -----------------------------------------------------------------------

    def code_actions(self, state: DocumentState, params: types.CodeActionParams) -> list[types.CodeAction]:
        ls = self.server
        doc = ls.document(state)
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
                                  "kernel-lsp.fixCompileError", {"uri": state.uri}, True, [diag]))
            if diag.source == "kernel-lsp" and diag.code == "hot-op":
                op = diag.data.get("op") if isinstance(diag.data, dict) else None
                out.append(action(f"Optimize this module, starting with its hot op {op}" if op
                                  else "Optimize this module (hot op)", types.CodeActionKind.RefactorRewrite,
                                  "kernel-lsp.optimize", {"uri": state.uri, **({"op": op} if op else {})},
                                  llm, [diag]))
        out += op_action.code_actions(self, state, params)  # per op, through the whole-model flow
        out += nollm_action.code_actions(self, state, params)  # torch.compile's kernels as a file
        target = anchor_target(doc)
        if target is not None:
            what = "module" if target.kind in (TargetKind.TASK_MODEL, TargetKind.CANDIDATE_MODEL) else "kernel"
            out.append(action(f"Optimize this {what}" + (" (LLM agent)" if llm else " (tuner)"),
                              types.CodeActionKind.RefactorRewrite, "kernel-lsp.optimize", {"uri": state.uri}, llm))
            if state.is_cuda or doc.embedded:
                out.append(action("Tune launch parameters", types.CodeActionKind.RefactorRewrite,
                                  "kernel-lsp.tune", {"uri": state.uri}, False))
        elif state.path.endswith(".cu") and not os.path.exists(harness_path(state.path)):
            out.append(action("Create a harness", types.CodeActionKind.Source, "kernel-lsp.createHarness",
                              {"uri": state.uri}, False))
        return out

    # -- commands ---------------------------------------------------------------------------

    def commands(self) -> dict[str, Any]:
        return {
            "kernel-lsp.optimize": self.optimize,
            "kernel-lsp.tune": self.tune,
            "kernel-lsp.fixCompileError": self.fix,
            "kernel-lsp.createHarness": self.create_harness,
            "kernel-lsp.cancel": self.cancel,
            "kernel-lsp.showReport": self.show_report,
            "kernel-lsp.previewCandidate": self.preview,
            "kernel-lsp.applyCandidate": self.apply,
            op_action.COMMAND: self.optimize_op,
            nollm_action.COMMAND: self.write_kernels,
        }

    async def write_kernels(self, *args: Any) -> dict[str, Any]:
        return await nollm_action.write_kernels_command(self, args, SearchRun)

    async def optimize_op(self, *args: Any) -> dict[str, Any]:
        return await op_action.optimize_op_command(self, args, SearchRun, make_proposer)

    async def optimize(self, *args: Any) -> dict[str, Any]:
        a = parse_args("kernel-lsp.optimize", OptimizeArgs, args)
        return await self.run_search(a.uri, a.proposer, op=a.op)

    async def tune(self, *args: Any) -> dict[str, Any]:
        a = parse_args("kernel-lsp.tune", OptimizeArgs, args)
        return await self.run_search(a.uri, "tuner", op=a.op)

    async def fix(self, *args: Any) -> dict[str, Any]:
        a = parse_args("kernel-lsp.fixCompileError", DocumentArgs, args)
        return await self.run_search(a.uri, "llm", repair_only=True)

    async def create_harness(self, *args: Any) -> dict[str, Any]:
        uri = parse_args("kernel-lsp.createHarness", DocumentArgs, args).uri
        return await write_harness(self.server, self.server.state(uri))

    def cancel(self, *args: Any) -> dict[str, Any]:
        job = parse_args("kernel-lsp.cancel", JobArgs, args).job
        count = self.server.jobs.cancel(job)
        out: dict[str, Any] = {"cancelled": count}
        if count == 0:
            out["reason"] = f"no job {job} is running" if job else "nothing is running"
        return out

    async def show_report(self, *args: Any) -> dict[str, Any]:
        from kernel_lsp.agent.report import write_report

        search = parse_args("kernel-lsp.showReport", SearchArgs, args).search
        store = self.server.host.store()
        if search is None:
            searches = store.searches()
            if not searches:
                raise CommandError("no Search in this workspace's store yet: run Optimize first")
            search = searches[0]["id"]
        path = os.path.join(self.server.host.root, ".kernel-lsp", "reports", f"search-{search}.html")
        write_report(store, int(search), path)
        uri = "file://" + path
        show_document(self.server, uri, external=True)
        return {"path": path, "uri": uri}

    def _pending(self, command: str, args: tuple[Any, ...]) -> SearchRun:
        search = parse_args(command, SearchArgs, args).search
        if search is None and self.runs:
            search = max(self.runs)
        if search is None or search not in self.runs:
            raise CommandError("no verified, faster result is waiting to be applied; run Optimize first")
        return self.runs[search]

    def preview(self, *args: Any) -> dict[str, Any]:
        run = self._pending("kernel-lsp.previewCandidate", args)
        return {"uri": handback.preview(self.server, run, run.best), "search": run.search_id, "gain": run.gain}

    async def apply(self, *args: Any) -> dict[str, Any]:
        return await self._apply(self._pending("kernel-lsp.applyCandidate", args))

    async def _apply(self, run: SearchRun) -> dict[str, Any]:
        out = await handback.apply(self.server, run)
        if out["applied"] and run.best is not None:
            self.runs.pop(run.search_id or -1, None)
            if run.target is not None:
                return out  # a new file: the document's own text did not change
            state = self.server.state(run.uri)
            # Measure the applied text once it is in the buffer (the client's didChange may
            # come before or after its applyEdit answer).
            state.remeasure_text = run.best.source
            self.server.sync(state)
            if state.text == run.best.source:
                self.server.evaluation.did_change(state)
        return out

    # -- the Search -------------------------------------------------------------------------

    async def run_search(self, uri: str, proposer: str | None, repair_only: bool = False,
                         op: str | None = None) -> dict[str, Any]:
        ls = self.server
        state = ls.state(uri)
        run = SearchRun(uri=uri, version=state.version, text=state.text)
        kind = proposer or ls.settings.effective_proposer()
        title = (f"{'Repair' if repair_only else 'Tune' if kind == 'tuner' else 'Optimize'} "
                 f"{os.path.basename(state.path)}")
        job = None

        def cancel() -> None:
            if job is not None:
                job.task.cancel()

        job = ls.jobs.start(("search", uri), title,
                            self.search_job(state, run, kind, repair_only, op, title, cancel), uri=uri)
        result = await ls.jobs.wait(job)
        return result if result is not None else {"improved": False, "cancelled": True,
                                                  "reason": "cancelled: what was found is kept in the store"}

    async def search_job(self, state: DocumentState, run: SearchRun, kind: str, repair_only: bool,
                         op: str | None, title: str, cancel) -> dict[str, Any]:
        from kernel_lsp.agent import Budget, Search, SearchOptions
        from kernel_lsp.engine.caller.tasks import TaskError
        from kernel_lsp.verdicts import CannotRun

        ls = self.server
        progress = WorkProgress(ls, title, on_cancel=cancel)
        await progress.begin("starting")
        search: Search | None = None
        budget = Budget(proposals=2 if repair_only else ls.settings.agent_budget)
        try:
            engine: Any
            options = SearchOptions(budget=budget, repair_only=repair_only, kernels_only=ls.settings.kernels_only,
                                    accept_less_accurate=ls.settings.accept_less_accurate)
            if repair_only and state.is_cuda and not os.path.exists(harness_path(state.path)):
                # A compile error needs no harness: the compiler is the test.
                task, candidate, engine = self._compile_only(state, run.text)
                options = SearchOptions(budget=budget, repair_only=True, checks=("compile",),
                                        confirm=False, profile=False, engine_options=None)
            else:
                task, candidate = ls.host.task_for(state.path, run.text)
                if candidate is None:
                    note = f"Profile: most of forward's time is in {op}; start there." if op else ""
                    candidate = reference_candidate(run.text, note)
                engine = await ls.host.executor(progress.report)  # a Ray cluster: N candidates at once
            proposer = make_proposer(ls, kind)
            if not repair_only:
                from kernel_lsp.nollm.proposer import for_start

                proposer = for_start(proposer, candidate)  # a module and the tuner: the no-LLM writer
                if hasattr(proposer, "engine"):
                    proposer.engine = engine
                from kernel_lsp.agent.seed import provider_for

                options.seed = provider_for(ls.settings.agent_seed, proposer)  # the LLM's torch.compile seed
            search = Search(engine, ls.host.store(), task, candidate, proposer, options)
            job = ls.jobs.get(("search", run.uri))

            def on_event(event) -> None:
                left = event.budget_left.get("proposals") if isinstance(event.budget_left, dict) else None
                message = f"round {event.round}: {event.message or event.kind}"
                if left is not None:
                    message += f" · {left} proposal{'s' if left != 1 else ''} left"
                if job is not None:
                    job.message = message
                    if event.best_speedup is not None:
                        job.best_speedup = event.best_speedup
                    ls.send_status()
                best = f" · best {event.best_speedup:.2f}x (unconfirmed)" if event.best_speedup else ""
                total = budget.proposals or 1
                progress.report(message + best, int(100 * (total - (left if left is not None else total)) / total))

            result = await search.run(progress=on_event)
        except (TaskError, ExecutionDisabled, ValueError, CannotRun) as exc:  # no model, no GPU, ...
            progress.end(str(exc))
            ls.show(f"kernel-lsp: {exc}", types.MessageType.Error)
            return {"improved": False, "reason": str(exc)}
        except BaseException:
            progress.end("cancelled: what was found is kept in the store")
            raise
        finally:
            if search is not None and hasattr(search.proposer, "aclose"):
                await search.proposer.aclose()
        summary = result.to_dict()
        summary.update(baseline_speedups(result, ls.host.store()))
        name = os.path.basename(state.path)
        if result.improved and result.best is not None:
            run.best, run.search_id = result.best, result.search_id
            run.gain = describe_gain(result, ls.host.store())
            if result.search_id is not None:
                self.runs[result.search_id] = run
            progress.end(run.gain)
            summary["message"] = (f"kernel-lsp: a version of {name} that passed verification "
                                  f"(Search {result.search_id}): {run.gain}.")
            if await handback.ask(ls, run, summary["message"]):
                summary["apply"] = await self._apply(run)
        else:
            why = reason_words(result)
            summary["reason"] = why
            seed = (result.seed or {}).get("line")
            progress.end(f"no improvement: {why}" + (f" ({seed})" if seed else ""))
            ls.show(f"kernel-lsp: no correct, faster version of {name} found: {why}. Your file is unchanged."
                    + (f" {seed[0].upper()}{seed[1:]}." if seed else ""))
        return summary

    def _compile_only(self, state: DocumentState, text: str) -> tuple[Task, Candidate, Any]:
        root = self.server.host.root
        name = os.path.relpath(state.path, root)
        task = Task(name=name, reference_path="", reference_source="", cuda_path=state.path)
        return task, Candidate(source=text, kind="cuda"), CompileOnlyEngine(self.server, state.path)


class CompileOnlyEngine:
    """The engine of a repair-only Search on a .cu without a harness: nvcc is the test, and
    "correct" means "compiles" (no time: nothing ran). Results are recorded in the store."""

    def __init__(self, ls, path: str) -> None:
        self.ls = ls
        self.path = path
        self.store = ls.host.store()

    async def evaluate(self, task: Task, candidate: Candidate, checks: Any = (), **_: Any) -> Evaluation:
        from kernel_lsp.analysis import compile_cache_dir, compile_options
        from kernel_lsp.toolchain import compile_check

        result = await compile_check(candidate.source, path=self.path,
                                     options=compile_options(self.ls.settings, self.path),
                                     cache_dir=compile_cache_dir())
        errors = [d for d in result.diagnostics if d.severity == "error"]
        ev = Evaluation(task=task.name, candidate=candidate.id,
                        verdict="correct" if result.ok else "compile_error", correct=bool(result.ok),
                        message="compiles (compile check only: no harness, nothing ran)" if result.ok
                        else (errors[0].message if errors else "does not compile"), compile=result)
        self.store.record(task, candidate, ev)
        return ev

    async def device_info(self) -> dict[str, Any]:
        return {}

    async def profile(self, task: Task, candidate: Candidate | None = None) -> dict[str, Any]:
        return {}


def harness_path(cu_path: str) -> str:
    return os.path.splitext(cu_path)[0] + ".py"


def baseline_speedups(result: "SearchResult", store: Any = None) -> dict[str, Any]:
    """The winner against both baselines. The Search times the baselines once, on its first
    run of the start (not in the confirmation run): read them from the store if need be."""
    best, start = result.best_evaluation, result.start_evaluation
    out: dict[str, Any] = {"speedup_eager": None, "speedup_compile": None, "spread_pct": None,
                           "custom_kernel": None}
    if best is None or best.time is None:
        return out
    timed = [ev for ev in (best, start) if ev is not None]
    if store is not None and not any(ev.eager for ev in timed):
        try:
            timed += store.evaluations(result.task, candidate=result.start.id, limit=20)
        except Exception:  # noqa: BLE001 - no store: fewer numbers, never a failure
            log.debug("no baselines from the store", exc_info=True)
    eager = next((ev.eager for ev in timed if ev.eager is not None), None)
    compiled = next((ev.compiled for ev in timed if ev.compiled is not None), None)
    ms = best.time.median_ms
    if ms > 0:
        out["speedup_eager"] = eager.median_ms / ms if eager else None
        out["speedup_compile"] = compiled.median_ms / ms if compiled else None
    out["spread_pct"] = best.time.spread_pct
    out["custom_kernel"] = not is_rewrite(best)
    return out


def describe_gain(result: "SearchResult", store: Any = None) -> str:
    """"2.31x faster than your code, verified · 5.20x PyTorch eager · 0.61x torch.compile …"."""
    if result.speedup is None:
        return "repaired: the new version " + (
            "compiles" if result.best_evaluation is None or result.best_evaluation.time is None
            else "compiles and passes verification")
    parts = [f"{result.speedup:.2f}x faster than your code, verified"]
    b = baseline_speedups(result, store)
    if b["speedup_eager"] is not None:
        parts.append(f"{b['speedup_eager']:.2f}x PyTorch eager")
        if b["speedup_eager"] < 1.0:
            parts.append("the reference run eagerly is faster still")
    if b["speedup_compile"] is not None:
        parts.append(f"{b['speedup_compile']:.2f}x torch.compile")
        if b["speedup_compile"] < 1.0:
            parts.append("torch.compile of the reference is faster still: consider it")
    best = result.best_evaluation
    if best is not None and best.time is not None:
        parts.append(f"{fmt_ms(best.time.median_ms)} ±{best.time.spread_pct:.1f}%")
        if best.time.spread_pct > NOISY_SPREAD:
            parts.append("noisy timing: the confirmation passed the guard, the ratios are rough")
    if b["custom_kernel"] is False:
        parts.append(REWRITE)
    seed = result.seed or {}
    if seed.get("offered"):
        parts.append(f"the torch.compile seed ({seed.get('label')}): no proposal beat it")
    elif seed.get("vs_seed"):
        parts.append(f"{seed['vs_seed']:.2f}x the torch.compile seed")
    return " · ".join(parts)


def reason_words(result: "SearchResult") -> str:
    """Why a Search found nothing: the agent's helper when it has one, else its reason and
    its last failed step."""
    try:
        from kernel_lsp.agent import search as search_module

        helper = getattr(search_module, "reason_text", None) or getattr(search_module, "describe_reason", None)
        if helper is not None:
            text = helper(result)
            if text:
                return str(text)
    except Exception:  # noqa: BLE001 - a missing or failing helper must not hide the result
        log.debug("reason helper failed", exc_info=True)
    reason = result.reason or "no reason given"
    failed = [s for s in result.steps if s.get("failed")]
    if failed:
        last = failed[-1]
        detail = last.get("message") or last.get("reason") or last.get("detail")
        if detail and str(detail) not in reason:
            reason += f" (last failure: {detail})"
    return reason


def make_proposer(ls, kind: str):
    if kind == "tuner":
        from kernel_lsp.agent import TunerProposer

        return TunerProposer()
    from kernel_lsp.agent import LLMConfig, LLMProposer

    settings = ls.settings
    config = LLMConfig.from_env(model=settings.agent_model, base_url=settings.agent_base_url)
    return LLMProposer(config)


async def write_harness(ls, state: DocumentState) -> dict[str, Any]:
    """A KernelBench-format skeleton beside a .cu, never over an existing file."""
    from kernel_lsp.server.harness_template import harness_for

    doc = ls.document(state)
    path = harness_path(doc.path)
    if os.path.exists(path):
        raise CommandError(f"{os.path.basename(path)} already exists; kernel-lsp never overwrites it")
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
    show_document(ls, target_uri)
    return {"path": path}


def show_document(ls, uri: str, external: bool = False, take_focus: bool = True) -> None:
    window = ls.client_capabilities.window
    if window and window.show_document and window.show_document.support:
        ls.window_show_document(types.ShowDocumentParams(uri=uri, external=external or None,
                                                         take_focus=take_focus))
