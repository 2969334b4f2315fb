"""`kernel-lsp optimize` and `kernel-lsp report` (kernel_lsp/cli/__init__.py wires the parsers).

optimize: live progress on stderr (rich), the final table on stdout; `--json` prints one
JSON document on stdout and nothing else there. `--out`/`--apply` write only when the
guard found an improvement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from kernel_lsp.model import Candidate

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.search import Search, SearchEvent, SearchOptions, SearchResult


def _split_target(spec: str) -> tuple[str, str | None]:
    # PATH[:TARGET]; a Windows drive letter or a path with ':' that exists stays whole.
    if os.path.exists(spec) or ":" not in spec:
        return spec, None
    path, _, target = spec.rpartition(":")
    return path, target or None


def _settings(root: str) -> Any:
    try:
        from kernel_lsp.config import load_settings

        return load_settings(root)
    except Exception:  # settings are optional for the CLI; defaults apply
        return None


def _make_proposer(ns: argparse.Namespace, settings: Any) -> Any:
    from kernel_lsp.agent.tuner import TunerProposer

    model = getattr(ns, "model", None) or (settings.agent_model if settings else None)
    kind = getattr(ns, "proposer", None)
    if kind is None:
        kind = settings.effective_proposer() if settings else "auto"
        if model:
            kind = "llm"
        if kind == "auto":
            kind = "llm" if os.environ.get("KERNEL_LSP_MODEL") else "tuner"
    if kind == "tuner":
        return TunerProposer()
    from kernel_lsp.agent.llm import LLMConfig, LLMProposer

    base_url = getattr(ns, "base_url", None) or (settings.agent_base_url if settings else None)
    return LLMProposer(LLMConfig.from_env(model=model, base_url=base_url))


class _Live:
    """The live progress display (stderr)."""

    def __init__(self, enabled: bool, budget: int | None) -> None:
        self.enabled = enabled
        self.progress: Any = None
        self.task_id: Any = None
        self.budget = budget
        if enabled:
            from kernel_lsp.cli.console import console as make_console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.console = make_console(stderr=True)
            self.progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TextColumn("best {task.fields[best]}"),
                                     TimeElapsedColumn(), TextColumn("{task.fields[msg]}"),
                                     console=self.console, transient=False)

    def __enter__(self) -> "_Live":
        if self.progress is not None:
            self.progress.start()
            self.task_id = self.progress.add_task("optimizing", total=self.budget, best="-", msg="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, ev: SearchEvent) -> None:
        if self.progress is None:
            return
        best = f"{ev.best_speedup:.2f}x" if ev.best_speedup else "-"
        left = ev.budget_left.get("proposals")
        done = (self.budget - left) if (self.budget is not None and left is not None) else None
        msg = ev.message[:70]
        self.progress.update(self.task_id, completed=done, best=best, msg=msg)
        if ev.kind in ("new_best", "proposal_failed", "confirmed", "not_confirmed", "baseline"):
            style = {"new_best": "green", "proposal_failed": "yellow", "confirmed": "green"}.get(ev.kind, "")
            self.progress.console.print(f"[{style}]{ev.kind}[/]: {ev.message}" if style else f"{ev.kind}: {ev.message}",
                                        markup=bool(style), highlight=False)


def _table(result: SearchResult) -> None:
    from kernel_lsp.cli.console import console as make_console
    from rich.table import Table

    console = make_console()
    t = Table(title=f"{result.task}: {'improved %.2fx' % result.speedup if result.improved and result.speedup else 'improved' if result.improved else 'no improvement'}")
    for col in ("#", "candidate", "origin", "note", "time ms", "vs start"):
        t.add_column(col)
    for i, r in enumerate(result.ranking[:8], 1):
        t.add_row(str(i), r["candidate"][:10], r["origin"], (r["note"] or "")[:50],
                  f"{r['time_ms']:.4f}" if r["time_ms"] else "-",
                  f"{r['speedup']:.2f}x" if r["speedup"] else "-")
    console.print(t)
    console.print(f"{result.reason}. Evaluated {result.candidates_evaluated}; tokens {result.tokens}; "
                  f"cost ${result.cost:.4f}; search {result.search_id}", highlight=False)


async def _optimize(ns: argparse.Namespace, path: str, show: bool) -> tuple[SearchResult | None, Any, str]:
    from kernel_lsp.engine import find_task
    from kernel_lsp.engine.executor import executor_settings, open_executor
    from kernel_lsp.store import Store

    root = os.getcwd()
    settings = _settings(root)
    task, cand = find_task(path)
    target_path = task.cuda_path if (cand is not None and cand.kind == "cuda") else path
    if cand is None:
        # A bare reference: start from the reference itself as ModelNew.
        cand = Candidate(source=task.reference_source.rstrip("\n") + "\n\n\nclass ModelNew(Model):\n    pass\n",
                         kind="python", note="the reference as ModelNew")
    store = Store.for_workspace(root)
    proposer = _make_proposer(ns, settings)  # a missing model fails here, before any cluster is joined
    try:
        engine = await open_executor(store=None, python=getattr(settings, "python", None),
                                     device=getattr(settings, "device", None),
                                     timeout=float(getattr(ns, "timeout", None) or 300.0),
                                     **executor_settings(settings, ns))
    except BaseException:
        await proposer.aclose()
        raise
    budget = Budget(proposals=int(getattr(ns, "budget", None) or 8))
    opts = SearchOptions(budget=budget)
    if getattr(ns, "baselines", True) is False:  # --no-baselines: skip eager/torch.compile timing
        opts.start_engine_options = {"baselines": False}
    search = Search(engine, store, task, cand, proposer, opts)
    live = _Live(show, budget.proposals)
    try:
        with live:
            result = await search.run(live)
    except asyncio.CancelledError:
        result = search.result
    finally:
        await proposer.aclose()
        await engine.aclose()
    return result, search, target_path


def optimize_main(ns: argparse.Namespace) -> int:
    path, target = _split_target(ns.target)
    if not os.path.exists(path):
        print(f"kernel-lsp optimize: no such file: {path}", file=sys.stderr)
        return 2
    if target:
        # A file holds one Task (KernelBench format); TARGET names a Target in it, checked here
        # so a typo fails loudly instead of optimizing something else.
        from kernel_lsp.source import parse_document, read_text

        names = {t.name for t in parse_document(path, read_text(path)).targets}
        if target not in names:
            print(f"kernel-lsp optimize: {path} has no Target named {target!r} "
                  f"(it has: {', '.join(sorted(names)) or 'none'})", file=sys.stderr)
            return 2
    as_json = bool(getattr(ns, "json", False))
    show = not as_json and sys.stderr.isatty()
    from kernel_lsp.engine.executor import ExecutorUnavailable
    try:
        result, search, target_path = asyncio.run(_optimize(ns, path, show))
    except KeyboardInterrupt:
        print("kernel-lsp optimize: cancelled; what was evaluated is in the store", file=sys.stderr)
        return 130
    except ExecutorUnavailable as e:  # an unreachable cluster: could not run
        print(f"kernel-lsp optimize: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a missing harness, a broken store: one clear line
        print(f"kernel-lsp optimize: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if result is None:
        print("kernel-lsp optimize: cancelled", file=sys.stderr)
        return 130
    written = None
    if result.improved and result.best is not None:
        if getattr(ns, "out", None):
            Path(ns.out).write_text(result.best.source)
            written = ns.out
        elif getattr(ns, "apply", False):
            Path(target_path).write_text(result.best.source)
            written = target_path
    if as_json:
        doc = result.to_dict()
        doc["written"] = written
        doc["best_source"] = result.best.source if result.best else None
        # Where each evaluated candidate ran (executor "local" or "ray", and the Ray node).
        doc["evaluations"] = [
            {"candidate": n.id, "verdict": n.evaluation.verdict, "executor": n.evaluation.executor,
             "node": n.evaluation.node}
            for n in getattr(search, "nodes", {}).values() if n.evaluation is not None]
        print(json.dumps(doc, indent=2, default=str))
    else:
        _table(result)
        if written:
            print(f"wrote the best candidate to {written}")
        elif result.improved:
            print("improved: rerun with --apply or --out FILE to keep it")
    return 0 if result.state == "done" else 130 if result.state == "cancelled" else 1


def report_main(ns: argparse.Namespace) -> int:
    from kernel_lsp.store import Store, store_path

    from kernel_lsp.agent.report import render_report

    root = getattr(ns, "root", None) or "."
    if not store_path(root).exists():
        print(f"kernel-lsp report: no store at {store_path(root)}", file=sys.stderr)
        return 1
    store = Store(store_path(root))
    if getattr(ns, "search", None):
        try:
            sid = int(ns.search)
        except ValueError:
            print(f"kernel-lsp report: a search id is a number, got {ns.search!r}", file=sys.stderr)
            return 2
    else:
        rows = store.searches()
        if not rows:
            print("kernel-lsp report: no searches in the store", file=sys.stderr)
            return 1
        sid = rows[0]["id"]
    try:
        from kernel_lsp.agent.whole_model_report import is_whole_model, render_whole_model

        page = render_whole_model(store, sid) if is_whole_model(store.search(sid)) else render_report(store, sid)
    except KeyError:
        print(f"kernel-lsp report: no search {sid}", file=sys.stderr)
        return 1
    out = Path(ns.out) if getattr(ns, "out", None) else Path(root) / ".kernel-lsp" / "reports" / f"search-{sid}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    print(str(out))
    return 0
