"""`kernel-lsp optimize` and `kernel-lsp report` (kernel_lsp/cli/__init__.py wires the parsers).

optimize: live progress on stderr (rich), the final table on stdout; `--json` prints one
JSON document on stdout and nothing else there. `--out`/`--apply` write only when the
guard found an improvement. Exit status (kernel_lsp/cli/exits.py): 0 improved, 1 no
improvement, 2 could not run (bad input, no GPU for a .cu, no model, endpoint unreachable).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from kernel_lsp.model import Candidate, Evaluation

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.search import Search, SearchEvent, SearchOptions, SearchResult
from kernel_lsp.agent.seed import summary_line
from kernel_lsp.cli import numbers, prepare
from kernel_lsp.cli.exits import CANCELLED, CANNOT_RUN, OK, PROBLEM, CannotRun, could_not_run
from kernel_lsp.engine.caller.executor_api import ExecutorUnavailable


def _split_target(spec: str) -> tuple[str, str | None]:
    # PATH[:TARGET]; a Windows drive letter or a path with ':' that exists stays whole.
    if os.path.exists(spec) or ":" not in spec:
        return spec, None
    path, _, target = spec.rpartition(":")
    return path, target or None


def _settings(root: str) -> Any:
    from kernel_lsp.config import SettingsError, load_settings

    try:
        return load_settings(root)
    except SettingsError as exc:  # a wrong setting is bad input, said at once
        raise CannotRun(str(exc)) from None


NO_MODEL = ("--proposer llm needs a model: pass --model NAME (and --base-url URL for a local or "
            "other OpenAI-compatible endpoint), or set KERNEL_LSP_MODEL and OPENAI_BASE_URL (key in "
            "OPENAI_API_KEY), or agent_model and agent_base_url under [tool.kernel-lsp] in pyproject.toml; "
            "without a model, --proposer tuner needs none")


def llm_settings(ns: argparse.Namespace, settings: Any, env: dict[str, str] | None = None
                 ) -> tuple[str | None, str | None]:
    """The model and endpoint the LLM Proposer would use, from flags, settings, then the
    environment; raises CannotRun when no model is configured (never a made-up default)."""
    env = dict(os.environ) if env is None else env
    model = getattr(ns, "model", None) or (settings.agent_model if settings else None) or env.get("KERNEL_LSP_MODEL")
    base_url = (getattr(ns, "base_url", None) or (settings.agent_base_url if settings else None)
                or env.get("OPENAI_BASE_URL"))
    if not model:
        raise CannotRun(f"no model configured. {NO_MODEL}")
    if not base_url and not env.get("OPENAI_API_KEY"):
        raise CannotRun(f"model {model!r} has no endpoint: set OPENAI_BASE_URL (or --base-url) for a local "
                        "or other endpoint, or OPENAI_API_KEY for OpenAI's")
    return model, base_url


def check_endpoint(base_url: str | None, timeout: float = 5.0) -> None:
    """Fail at once, before any work, when the endpoint's host does not answer."""
    if not base_url:
        return
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CannotRun(f"endpoint {base_url!r} is not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise CannotRun(f"cannot reach the endpoint {base_url}: {exc.strerror or exc}") from None


def proposer_kind(ns: argparse.Namespace, settings: Any) -> str:
    kind = getattr(ns, "proposer", None)
    if kind is None:
        kind = settings.effective_proposer() if settings else "auto"
        if getattr(ns, "model", None):
            kind = "llm"
        if kind == "auto":
            kind = "llm" if os.environ.get("KERNEL_LSP_MODEL") else "tuner"
    return kind


def _make_proposer(ns: argparse.Namespace, settings: Any) -> Any:
    from kernel_lsp.agent.tuner import TunerProposer

    if proposer_kind(ns, settings) == "tuner":
        return TunerProposer()
    from kernel_lsp.agent.llm import LLMConfig, LLMProposer

    model, base_url = llm_settings(ns, settings)
    check_endpoint(base_url)
    return LLMProposer(LLMConfig.from_env(model=model, base_url=base_url))


def seed_provider(ns: argparse.Namespace, settings: Any, proposer: Any) -> Any:
    """--seed, else the agent.seed setting: the torch.compile seed's provider for an LLM Search
    (kernel_lsp/agent/seed.py), or None."""
    from kernel_lsp.agent.seed import provider_for

    setting = getattr(ns, "seed", None) or getattr(settings, "agent_seed", "none")
    return provider_for(setting, proposer)


def module_proposer(proposer: Any, start: Candidate) -> Any:
    """The tuner on a module Target becomes the no-LLM writer (kernel_lsp/nollm/proposer.py)."""
    from kernel_lsp.nollm.proposer import for_start

    return for_start(proposer, start)


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
        if ev.kind in ("new_best", "proposal_failed", "confirmed", "not_confirmed", "baseline", "seed"):
            style = {"new_best": "green", "proposal_failed": "yellow", "confirmed": "green"}.get(ev.kind, "")
            self.progress.console.print(f"[{style}]{ev.kind}[/]: {ev.message}" if style else f"{ev.kind}: {ev.message}",
                                        markup=bool(style), highlight=False)


def _attr(result: SearchResult, name: str, default: Any = None) -> Any:
    """A SearchResult field that newer engines carry; None until they do."""
    value = getattr(result, name, default)
    return default if callable(value) else value


def _timing(ev: Evaluation | None, name: str = "time") -> Any:
    return getattr(ev, name, None) if ev is not None else None


def _ratio(base: Any, new: Any) -> float | None:
    if base is None or new is None or not new.median_ms:
        return None
    return base.median_ms / new.median_ms


_UNREACHABLE = ("cannot reach", "authentication", "refused the request", "timed out", "no model")


def start_failure(result: SearchResult) -> str | None:
    """Why the Search could not run at all: its start could not be evaluated (no GPU for a
    .cu, execution off, a broken harness), or the Proposer's endpoint could not be used
    before any candidate was made."""
    if result.improved:
        return None
    outcome = _attr(result, "outcome")
    if outcome is not None and outcome != "cannot_run":
        return None
    if outcome == "cannot_run":
        return result.reason or "nothing could run"
    ev = result.start_evaluation
    if ev is not None and could_not_run(ev.verdict, ev.message):
        return f"the start could not run: {ev.message or ev.verdict}"
    proposals = [st for st in result.steps if st.get("kind") == "proposal"]
    children = [st for st in result.steps if st.get("kind") == "evaluation" and st.get("candidate") != result.start.id]
    broken = [st for st in proposals if st.get("failed") and (
        st.get("fatal") or any(w in str(st.get("reason")) for w in _UNREACHABLE))]
    if broken and not children and len(broken) == len(proposals):
        return f"the proposer's endpoint could not be used: {broken[-1].get('reason')}"
    return None


def search_facts(result: SearchResult, search: Any = None) -> dict[str, Any]:
    """What the user is told about a finished Search, one definition for text and JSON:
    the reason, the failed steps, and for the best candidate its speedup over the start
    (which measurement), over PyTorch eager and torch.compile (each with its spread), and
    whether it is a custom kernel or a PyTorch rewrite. Fields the engine computes win."""
    start_ev = result.start_evaluation
    # The baselines are timed once, with the start's first evaluation.
    root = getattr(search, "nodes", {}).get(result.start.id) if search is not None else None
    first = root.evaluation if root is not None and root.evaluation is not None else start_ev
    eager, compiled = _timing(first, "eager"), _timing(first, "compiled")
    best_ev = result.best_evaluation
    best_t = _timing(best_ev)
    failed = [st for st in result.steps if st.get("failed")]
    why_not = start_failure(result)
    if why_not and start_ev is not None and not any(st.get("candidate") == result.start.id for st in failed):
        failed.insert(0, {"round": 0, "kind": "evaluation", "failed": True, "candidate": result.start.id,
                          "verdict": start_ev.verdict, "reason": start_ev.message or start_ev.verdict})
    nodes = getattr(search, "nodes", {}) if search is not None else {}
    for i, st in enumerate(failed):
        node = nodes.get(st.get("candidate")) if st.get("kind") == "evaluation" else None
        node_ev = getattr(node, "evaluation", None)
        if node_ev is not None and st.get("verdict") == "correct" and node_ev.flags:
            kept = [f for f in node_ev.flags if f != "not_counted"]
            failed[i] = {**st, "reason": f"correct, not counted ({', '.join(kept)})", "flags": list(node_ev.flags)}
    flags = list(best_ev.flags) if best_ev is not None else []
    custom = _attr(result, "custom_kernel")
    if custom is None and result.best is not None:
        custom = bool(numbers.has_kernel(result.best.source, result.best.kind)) and "torch_fallback" not in flags
    sp_eager = _attr(result, "speedup_eager")
    sp_compile = _attr(result, "speedup_compile")
    if result.best is not None:
        sp_eager = sp_eager if sp_eager is not None else _ratio(eager, best_t)
        sp_compile = sp_compile if sp_compile is not None else _ratio(compiled, best_t)
    spread = _attr(result, "spread_pct", _attr(result, "spread"))
    if spread is None and result.best is not None:
        spread = numbers.ratio_spread(best_t, _timing(start_ev))
    reason = why_not or result.reason or ("improved" if result.improved else "no improvement")
    facts: dict[str, Any] = {
        "reason": reason,
        "failed_steps": failed,
        "speedup_eager": sp_eager,
        "speedup_compile": sp_compile,
        "speedup_eager_spread": numbers.ratio_spread(best_t, eager) if sp_eager is not None else None,
        "speedup_compile_spread": numbers.ratio_spread(best_t, compiled) if sp_compile is not None else None,
        "spread": spread,
        "spread_pct": spread,
        "measurement": _attr(result, "measurement") or (
            None if result.best is None else "confirmation" if result.confirmed else "first run"),
        "custom_kernel": custom if result.best is not None else None,
        "label": _attr(result, "label") or (numbers.label_for(flags, custom) if result.best is not None else None),
        "eager_ms": eager.median_ms if eager else None,
        "compile_ms": compiled.median_ms if compiled else None,
    }
    beats = _attr(result, "compile_faster")
    if beats is None:
        beats = sp_compile is not None and sp_compile < 1.0
    facts["compile_beats_best"] = bool(beats) if result.best is not None else False
    facts["compile_faster"] = facts["compile_beats_best"] if result.best is not None else None
    facts["shared_gpu"] = _attr(result, "shared_gpu")
    facts["proposer"] = getattr(getattr(search, "proposer", None), "name", None)
    label_for = getattr(getattr(search, "proposer", None), "label_for", None)  # the no-LLM writer's
    facts["generated"] = label_for(result.best.id) if label_for is not None and result.best is not None else None
    facts["noisy"] = numbers.noisy(spread) or numbers.noisy(facts["speedup_eager_spread"])
    return facts


def _kind(search: Any, candidate: str) -> str:
    node = getattr(search, "nodes", {}).get(candidate) if search is not None else None
    if node is None or node.evaluation is None:
        return ""
    custom = getattr(node.evaluation, "custom_kernel", None)
    if custom is None:
        custom = numbers.has_kernel(node.candidate.source, node.candidate.kind)
    return numbers.label_for(node.evaluation.flags, custom)


def _first_spread(search: Any, result: SearchResult, candidate: str) -> float | None:
    """The spread of a candidate's first-run speedup over the start (both first runs)."""
    nodes = getattr(search, "nodes", {}) if search is not None else {}
    node, root = nodes.get(candidate), nodes.get(result.start.id)
    if node is None or root is None:
        return None
    return numbers.ratio_spread(_timing(node.evaluation), _timing(root.evaluation))


def _row_speedup(r: dict[str, Any], result: SearchResult, search: Any) -> str:
    """A ranking row's speedup over the start, with the spread of that ratio (the noisier of
    the candidate's and the start's timings in the same measurement) and which one it is."""
    if not r.get("speedup"):
        return "-"
    if r["candidate"] == result.start.id:
        return "1.00x"
    measurement = r.get("measurement") or "first run"
    if measurement == "confirmation":
        spread = numbers.ratio_spread(r.get("spread_pct") and {"spread_pct": r["spread_pct"]},
                                      _timing(result.start_evaluation))
    else:
        spread = _first_spread(search, result, r["candidate"])
    return f"{numbers.speedup_text(r['speedup'], spread, short=True)} ({measurement})"


def _table(result: SearchResult, facts: dict[str, Any], search: Any = None) -> None:
    from kernel_lsp.cli.console import console as make_console
    from rich.table import Table

    console = make_console()
    if start_failure(result):
        head = "could not run"
    elif result.improved and result.speedup:
        head = f"improved, {numbers.speedup_text(result.speedup, facts['spread'], 'vs the start')}"
    else:
        head = "improved" if result.improved else "no improvement"
    t = Table(title=f"{result.task}: {head}")
    for col in ("#", "candidate", "kind", "origin", "note", "time ms", "vs start"):
        t.add_column(col)
    for i, r in enumerate(result.ranking[:8], 1):
        kind = "the start" if r["candidate"] == result.start.id else (r.get("label") or _kind(search, r["candidate"]))
        t.add_row(str(i), r["candidate"][:10], kind, r["origin"], (r["note"] or "")[:50],
                  f"{r['time_ms']:.4f}" if r["time_ms"] else "-", _row_speedup(r, result, search))
    if t.row_count:
        console.print(t)
    else:
        console.print(f"[bold]{result.task}[/bold]: {head}" + ("" if start_failure(result) else
                      ": no correct candidate to rank"), highlight=False)
    for line in summary_lines(result, facts):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"Evaluated {result.candidates_evaluated}; tokens {result.tokens}; "
                  f"cost ${result.cost:.4f}; search {result.search_id}", highlight=False)


def summary_lines(result: SearchResult, facts: dict[str, Any]) -> list[str]:
    """The plain sentences under the table: why it stopped, the best against both baselines,
    its kind, and a warning or a better option where there is one."""
    lines = [f"why: {facts['reason']}"]
    seed = summary_line(getattr(result, "seed", None))
    if seed:
        lines.append(seed)
    if result.best is not None:
        lines.append(f"best: {facts['label']}; its time from the {facts['measurement']} run: "
                     f"vs PyTorch eager {numbers.speedup_text(facts['speedup_eager'], facts['speedup_eager_spread'])}, "
                     f"vs torch.compile {numbers.speedup_text(facts['speedup_compile'], facts['speedup_compile_spread'])}")
        if facts["custom_kernel"] is False:
            lines.append("note: the speedup comes from PyTorch ops, not a custom kernel "
                         "(--kernels-only refuses such candidates)")
        if facts["compile_beats_best"] and facts["compile_ms"] is not None:
            best_ms = result.best_evaluation.time.median_ms if result.best_evaluation and result.best_evaluation.time else None
            lines.append(f"[yellow]torch.compile of the reference is faster than this candidate "
                         f"({facts['compile_ms']:.4g} ms vs {best_ms:.4g} ms): consider torch.compile(model) "
                         "instead[/yellow]" if best_ms else "[yellow]torch.compile of the reference is faster "
                         "than this candidate: consider torch.compile(model) instead[/yellow]")
        if facts.get("shared_gpu"):
            from kernel_lsp.verdicts import shared_phrase

            lines.append(f"[yellow]note: {shared_phrase(facts['shared_gpu'])}[/yellow]")
        if facts["noisy"]:
            spread = max(s for s in (facts["spread"], facts["speedup_eager_spread"]) if s is not None)
            lines.append(f"[yellow]warning: the timing spread is {spread:.1f}%: the speedups above are not "
                         "reliable; rerun when the machine is idle[/yellow]")
    for st in facts["failed_steps"][-3:]:
        if str(st.get("reason")) in facts["reason"]:
            continue
        lines.append(f"failed {st.get('kind')}: {str(st.get('reason'))[:160]}")
    return lines


async def _optimize(ns: argparse.Namespace, path: str, show: bool) -> tuple[SearchResult | None, Any, str]:
    from kernel_lsp.engine import find_task
    from kernel_lsp.engine.caller.executor import executor_settings, open_executor
    from kernel_lsp.engine.caller.tasks import TaskError
    from kernel_lsp.source import SourceError, read_text
    from kernel_lsp.store import Store

    root = os.getcwd()
    settings = _settings(root)
    try:
        task, cand = find_task(path, read_text(path))
    except (TaskError, SourceError) as exc:
        raise CannotRun(str(exc)) from None
    except UnicodeDecodeError as exc:  # a file the Task pulls in (its harness) is not UTF-8
        raise CannotRun(f"a file of this Task is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    target_path = task.cuda_path if (cand is not None and cand.kind == "cuda") else path
    if cand is None:
        # A bare reference: start from the reference itself as ModelNew.
        cand = Candidate(source=task.reference_source.rstrip("\n") + "\n\n\nclass ModelNew(Model):\n    pass\n",
                         kind="python", note="the reference as ModelNew")
    proposer = _make_proposer(ns, settings)  # before anything starts: no model is an immediate error
    proposer = module_proposer(proposer, cand)
    store = Store.for_workspace(root)
    try:  # the local Engine, or a Ray cluster (ExecutorUnavailable: could not run)
        engine = await open_executor(store=None, python=getattr(settings, "python", None),
                                     device=getattr(settings, "device", None),
                                     timeout=float(getattr(ns, "timeout", None) or 300.0),
                                     **executor_settings(settings, ns))
    except BaseException:
        await proposer.aclose()
        raise
    if hasattr(proposer, "engine"):
        proposer.engine = engine  # the no-LLM writer records torch.compile's code through it
    see = getattr(engine, "see", None)  # the Task's folder, before device_info starts the Worker
    if see is not None:
        see([task])
    budget = Budget(proposals=int(getattr(ns, "budget", None) or 24))
    opts = SearchOptions(budget=budget)
    kernels_only = getattr(ns, "kernels_only", None)
    if kernels_only is None:
        kernels_only = bool(getattr(settings, "kernels_only", False))
    if hasattr(opts, "kernels_only"):
        opts.kernels_only = kernels_only  # type: ignore[attr-defined]
    elif kernels_only:
        print("kernel-lsp optimize: warning: this build's Search has no kernels-only rule; it refuses only "
              "candidates flagged torch_fallback", file=sys.stderr)
    if hasattr(opts, "accept_less_accurate"):
        opts.accept_less_accurate = bool(getattr(settings, "accept_less_accurate", False))
    if getattr(ns, "baselines", True) is False:  # --no-baselines: skip eager/torch.compile timing
        opts.start_engine_options = {"baselines": False}
    opts.seed = seed_provider(ns, settings, proposer)
    search = Search(engine, store, task, cand, proposer, opts)
    live = _Live(show, budget.proposals)
    prep = prepare.start(engine, [cand], sys.stderr)  # precompiled headers, while the Search starts
    try:
        with live:
            result = await search.run(live)
    except asyncio.CancelledError:
        result = search.result
    finally:
        await prepare.finish(prep)
        await proposer.aclose()
        await engine.aclose()
    return result, search, target_path


def exit_status(result: SearchResult, facts: dict[str, Any]) -> int:
    if result.state == "cancelled":
        return CANCELLED
    if result.improved:
        return OK
    return CANNOT_RUN if start_failure(result) else PROBLEM  # "failed" (an engine fault) is 1


def optimize_main(ns: argparse.Namespace) -> int:
    path, target = _split_target(ns.target)
    as_json = bool(getattr(ns, "json", False))

    def cannot(why: str) -> int:
        print(f"kernel-lsp optimize: {why}", file=sys.stderr)
        if as_json:
            print(json.dumps({"state": "not_run", "improved": False, "reason": why, "failed_steps": [],
                              "speedup": None, "speedup_eager": None, "speedup_compile": None,
                              "custom_kernel": None, "spread": None, "measurement": None, "written": None},
                             indent=2))
        return CANNOT_RUN

    if not os.path.exists(path):
        return cannot(f"no such file: {path}")
    if target:
        # A file holds one Task (KernelBench format); TARGET names a Target in it, checked here
        # so a typo fails loudly instead of optimizing something else.
        from kernel_lsp.source import SourceError, parse_document, read_text

        try:
            names = {t.name for t in parse_document(path, read_text(path)).targets}
        except SourceError as exc:
            return cannot(str(exc))
        if target not in names:
            return cannot(f"{path} has no Target named {target!r} (it has: {', '.join(sorted(names)) or 'none'})")
    show = not as_json and sys.stderr.isatty()
    try:
        result, search, target_path = asyncio.run(_optimize(ns, path, show))
    except KeyboardInterrupt:
        print("kernel-lsp optimize: cancelled; what was evaluated is in the store", file=sys.stderr)
        return CANCELLED
    except CannotRun as exc:
        return cannot(str(exc))
    except ExecutorUnavailable as exc:  # an unreachable cluster
        return cannot(str(exc))
    except Exception as e:  # a broken store, an engine that cannot start: one clear line
        if os.environ.get("KERNEL_LSP_DEBUG"):
            raise
        return cannot(f"{type(e).__name__}: {e}")
    if result is None:
        print("kernel-lsp optimize: cancelled", file=sys.stderr)
        return CANCELLED
    facts = search_facts(result, search)
    written = None
    if result.improved and result.best is not None:
        if getattr(ns, "out", None):
            Path(ns.out).write_text(result.best.source)
            written = ns.out
        elif getattr(ns, "apply", False):
            Path(target_path).write_text(result.best.source)
            written = target_path
    code = exit_status(result, facts)
    if as_json:
        doc = result.to_dict()
        for key, value in facts.items():
            if key in ("reason", "failed_steps") or doc.get(key) is None:
                doc[key] = value
        doc["written"] = written
        doc["best_source"] = result.best.source if result.best else None
        doc["status"] = code
        # Where each evaluated candidate ran (executor "local" or "ray", and the Ray node).
        doc["evaluations"] = [
            {"candidate": n.id, "verdict": n.evaluation.verdict, "executor": n.evaluation.executor,
             "node": n.evaluation.node}
            for n in getattr(search, "nodes", {}).values() if n.evaluation is not None]
        print(json.dumps(doc, indent=2, default=str))
    else:
        _table(result, facts, search)
        if facts.get("generated"):
            print(facts["generated"])
        if written:
            print(f"wrote the best candidate to {written}")
        elif result.improved:
            print("improved: rerun with --apply or --out FILE to keep it")
    if code == CANNOT_RUN:
        print(f"kernel-lsp optimize: could not run: {facts['reason']}", file=sys.stderr)
    return code


def report_main(ns: argparse.Namespace) -> int:
    from kernel_lsp.store import Store, store_path

    from kernel_lsp.agent.report import render_report

    root = getattr(ns, "root", None) or "."
    if not store_path(root).exists():
        print(f"kernel-lsp report: no store at {store_path(root)} (run `kernel-lsp optimize` here first, "
              "or pass --root)", file=sys.stderr)
        return CANNOT_RUN
    store = Store(store_path(root))
    if getattr(ns, "search", None):
        try:
            sid = int(ns.search)
        except ValueError:
            print(f"kernel-lsp report: a search id is a number, got {ns.search!r}", file=sys.stderr)
            return CANNOT_RUN
    else:
        rows = store.searches()
        if not rows:
            print("kernel-lsp report: no searches in the store (run `kernel-lsp optimize` first)", file=sys.stderr)
            return CANNOT_RUN
        sid = rows[0]["id"]
    try:
        from kernel_lsp.agent.whole_model_report import is_whole_model, render_whole_model

        page = render_whole_model(store, sid) if is_whole_model(store.search(sid)) else render_report(store, sid)
    except KeyError:
        print(f"kernel-lsp report: no search {sid}", file=sys.stderr)
        return CANNOT_RUN
    out = Path(ns.out) if getattr(ns, "out", None) else Path(root) / ".kernel-lsp" / "reports" / f"search-{sid}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    print(str(out))
    return 0
