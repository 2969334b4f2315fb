"""The Search: one optimize run over a Task from a starting Candidate. It orchestrates; the
tree policy (selection, backed-up values, near-duplicates) is tree.py, a lineage's turns are
conversation.py, the model's tools are tools.py, and what it ends with (the result, the ranking,
why nothing won) is outcome.py.

Best-first over a tree of Candidates, UCB on the values each subtree backed up. Failing
children, and correct ones a repairable flag disqualifies, are repaired first (bounded turns
per lineage, CuTeGen's "repair before optimize"), in the same conversation that made them;
siblings get different directions; profiler facts enter the prompt once a node is correct and
deep enough. Everything goes to the store as it happens, so a cancelled Search leaves every
evaluated Candidate and the best so far behind.

The guard: the result is the fastest Candidate verified correct, without flags,
and faster than the starting source by more than the measured noise, re-timed
against the start in a final confirmation run; otherwise improved=False.

A PyTorch rewrite (Evaluation.custom_kernel False) counts when correct and faster,
labelled as such; `kernels_only` keeps the strict rule. Every result says why
(`reason`), what kind of result it is (`label`), against both baselines, with its spread
and which measurement its speedup comes from (`measurement`: "confirmation" or
"first run"; the ranking uses the same number per candidate).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kernel_lsp import verdicts
from kernel_lsp.model import (DISQUALIFYING_FLAGS, KERNELS_ONLY_FLAGS, Candidate, Evaluation, Task,
                              disqualified_by)

from .budget import Budget
# SearchResult and noise_threshold: imported from here by the CLI, the server and the tests.
from .outcome import SearchResult, no_winner, noise_threshold, rank_key, rank_rows, vs_baseline  # noqa: F401
from .prompts import DIRECTIONS
from .seed import Seed
from .proposer import Proposal, ProposalRequest, Proposer
from .tools import Toolbox, tool_specs
from .tree import Node, backup, near_key, pick_repair, ucb_pick, visit
from .tree import path_to_root as tree_path

log = logging.getLogger(__name__)

# Verdicts a Proposer may be asked to repair (a hang or a dead Worker may be worth a try too).
# Flags that keep a correct candidate from counting (the engine's DISQUALIFYING_FLAGS plus its
# summary flag "not_counted"); benign flags (compile_baseline_failed, ...) do not.
BAD_FLAGS = DISQUALIFYING_FLAGS | {"not_counted"}

REPAIRABLE = ("compile_error", "mismatch", "unwritten_output", "mutated_input", "stale_result",
              "bad_output", "nan", "error", "crashed", "timeout", "oom")
# Flags of a correct, timed candidate that one fix may lift (a fast kernel one fix away is not
# dropped); the cheats (timer_patch, result_cache, ...) are never "repaired".
REPAIRABLE_FLAGS = frozenset({"less_accurate", "precision_lowering", "torch_fallback", "eval_only"})


@dataclass
class SearchOptions:
    budget: Budget = field(default_factory=Budget)
    children: int = 2                    # children asked for per expansion
    max_children: int = 6                # per node, before it counts as fully expanded
    max_in_flight: int = 2               # evaluations awaited at once (the engine queues GPU work)
    repair_rounds: int = 3               # repair turns per failing lineage (each a proposal)
    profile_after_depth: int = 1         # profile facts in the prompt from this depth on, once correct
    profile: bool = True
    profile_timeout: float = 60.0
    exploration: float = 0.3             # UCB constant
    min_gain: float = 0.02               # the guard: speedup > 1 + max(min_gain, noise * spread)
    noise_factor: float = 2.0
    confirm: bool = True                 # re-time the winner against the start at the end
    confirm_top: int = 2                 # how many candidates may be tried in confirmation
    accept_repair: bool = True           # a failing start: a correct candidate is the improvement
    bad_flags: frozenset[str] = BAD_FLAGS  # Evaluation flags that disqualify a candidate
    checks: tuple[str, ...] = ("compile", "verify", "bench")
    eval_timeout: float | None = None    # per evaluation; None: the engine's default
    # Engine options for every evaluation but the first one of the start: the eager and
    # torch.compile baselines are timed once, for the start (a torch.compile of a Python
    # loop took 214 s on this CI's CPU), not again for every child.
    engine_options: dict[str, Any] | None = field(default_factory=lambda: {"baselines": False})
    start_engine_options: dict[str, Any] | None = None
    max_errors: int = 3                  # consecutive transport failures before stopping
    repair_only: bool = False            # fix the start (fixCompileError): no optimize rounds
    kernels_only: bool = False           # a PyTorch rewrite never counts (KernelBench-style scoring)
    accept_less_accurate: bool = False   # a `less_accurate` candidate counts (still ranked after accurate ones)
    directions: bool = True              # siblings are asked for different directions (prompts.DIRECTIONS)
    near_duplicates: bool = True         # a source equal to one tried up to comments/whitespace is skipped
    tools: bool = True                   # lend the model tools when its Proposer can call them
    # agent/seed.py: for a module Target, a provider of the torch.compile seed, evaluated before
    # the first expansion; a correct seed is a child of the start the tree expands, and what
    # the Search offers must beat it too. None: no seed (the `agent.seed` setting is "none").
    seed: Any = None


@dataclass
class SearchEvent:
    """One step, for the editor's progress and the CLI's live display."""

    kind: str          # started baseline proposing proposal_failed evaluating evaluated new_best
                       # duplicate confirming confirmed finished cancelled failed tool
    round: int
    candidate: str | None = None
    verdict: str | None = None
    speedup: float | None = None         # vs the starting source
    best_speedup: float | None = None
    budget_left: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    parent: str | None = None
    note: str = ""
    label: str | None = None             # "custom kernel" | "PyTorch rewrite (no custom kernel)"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


Progress = Callable[[SearchEvent], Any]


class Search:
    def __init__(self, engine: Any, store: Any, task: Task, start: Candidate, proposer: Proposer,
                 options: SearchOptions | None = None) -> None:
        self.engine = engine
        self.store = store
        self.task = task
        self.start = start
        self.proposer = proposer
        self.options = options or SearchOptions()
        self.budget = self.options.budget
        self.nodes: dict[str, Node] = {}
        self.steps: list[dict[str, Any]] = []
        self.search_id: int | None = None
        self.round = 0
        self.best: Node | None = None          # fastest verified-faster node so far
        self.result: SearchResult | None = None  # set when run() ends, cancelled included
        self._progress: Progress | None = None
        self._device: dict[str, Any] = {}
        self._history: list[tuple[str, str]] = []  # (node it is about, one line): what was tried
        self._evaluated = 0
        self._errors = 0
        self._fatal: str | None = None       # a Proposer failure that ends the Search
        self._cannot_run = False             # nothing could be measured: outcome "cannot_run"
        self._confirm_note: str | None = None  # why confirmation found no winner
        self._tasks: set[asyncio.Task[Any]] = set()
        self._seen: dict[str, str] = {}      # near_key -> candidate id: near-duplicates caught
        self.seed: Seed | None = None        # what became of the torch.compile seed (options.seed)
        self._vs_seed: float | None = None   # the winner's speedup over the seed, when judged against it
        self._tool_specs: list[dict[str, Any]] | None = None  # tools.tool_specs(task): it reads the user's file

    # -- events and store ------------------------------------------------------

    def _emit(self, kind: str, **kw: Any) -> None:
        ev = SearchEvent(kind=kind, round=self.round,
                         best_speedup=self.best.speedup if self.best else None,
                         budget_left=self.budget.left(), **kw)
        if self._progress is None:
            return
        try:
            self._progress(ev)
        except Exception:  # a broken progress display must not end the Search
            log.exception("progress callback failed")

    def _step(self, kind: str, reason: str, *, failed: bool, **kw: Any) -> None:
        self.steps.append({"round": self.round, "kind": kind, "failed": failed, "reason": reason,
                           "time": round(self.budget.elapsed(), 3), **kw})

    def _doc(self, result: dict[str, Any] | None = None) -> dict[str, Any]:
        # The store's `budget` column: limits, usage, failed steps, and the guard's result.
        doc: dict[str, Any] = {"limits": self.budget.limits(), "usage": self.budget.usage(),
                               "proposer": self.proposer.name, "model": self.proposer.model,
                               "steps": self.steps[-200:]}
        if result is not None:
            doc["result"] = result
        return doc

    def _store(self, fn: str, *args: Any, **kw: Any) -> Any:
        if self.store is None:
            return None
        return getattr(self.store, fn)(*args, **kw)

    # -- evaluation ------------------------------------------------------------

    async def _evaluate(self, cand: Candidate, options: dict[str, Any] | None | str = "children",
                        checks: tuple[str, ...] | None = None) -> Evaluation:
        opts = self.options.engine_options if options == "children" else options
        kw: dict[str, Any] = {"options": opts} if opts else {}
        try:
            ev = await self.engine.evaluate(self.task, cand, checks=checks or self.options.checks,
                                            timeout=self.options.eval_timeout, **kw)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the engine should not raise for candidate faults; keep going
            log.exception("engine.evaluate failed")
            ev = Evaluation(task=self.task.name, candidate=cand.id, verdict="error", correct=None,
                            message=f"engine error: {type(e).__name__}: {e}")
        if getattr(self.engine, "store", None) is not self.store or self.store is None:
            self._store("add_evaluation", self.task.name, ev, cand)  # else the engine recorded it
        return ev

    def _prebuild(self, cand: Candidate) -> None:
        fn = getattr(self.engine, "prebuild", None)
        if fn is None:
            return

        async def go() -> None:
            try:
                await fn(self.task, cand)
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed prebuild shows again in evaluate
                log.debug("prebuild failed", exc_info=True)

        t = asyncio.ensure_future(go())
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _built_only(self) -> bool:
        """A compile-only Search (repairing a compile error: the compiler is the test)."""
        return not ({"verify", "bench"} & set(self.options.checks))
    def _width(self) -> int:
        """Evaluations the Executor runs at once (``engine.concurrency``; 1 for an engine without it)."""
        try:
            return max(1, int(getattr(self.engine, "concurrency", 1) or 1))
        except (TypeError, ValueError):
            return 1

    def _qualifies(self, ev: Evaluation | None) -> bool:
        if self._built_only():
            return self._runs(ev) and not (set(ev.flags) & self.options.bad_flags)  # type: ignore[union-attr]
        if ev is None or ev.verdict != "correct" or ev.correct is not True or ev.time is None:
            return False
        bad = self.options.bad_flags
        if self.options.kernels_only:
            if ev.custom_kernel is False:
                return False
            bad = bad | KERNELS_ONLY_FLAGS
        return not disqualified_by(ev.flags, self.options.accept_less_accurate, bad)

    def _runs(self, ev: Evaluation | None) -> bool:
        """Correct and timed; flags aside (a flagged start is still what the file holds). In a
        compile-only Search: built."""
        if self._built_only():
            return ev is not None and ev.compile is not None and ev.compile.ok and ev.verdict != "compile_error"
        return ev is not None and ev.verdict == "correct" and ev.correct is True and ev.time is not None

    def _start_ok(self) -> bool:
        return self._runs(self.nodes[self.start.id].evaluation)

    def _speedup(self, ev: Evaluation) -> float | None:
        root = self.nodes[self.start.id].evaluation
        if root is None or root.time is None or ev.time is None or ev.time.median_ms <= 0:
            return None
        return root.time.median_ms / ev.time.median_ms

    def _beats_start(self, node: Node) -> bool:
        root = self.nodes[self.start.id]
        if not self._qualifies(node.evaluation) or node.id == root.id:
            return False
        if not self._start_ok():
            return self.options.accept_repair
        assert node.evaluation is not None and root.evaluation is not None
        limit = noise_threshold(root.evaluation, node.evaluation, self.options.min_gain,
                                self.options.noise_factor)
        return node.speedup is not None and node.speedup > limit

    def _better(self, a: Node, b: Node | None) -> bool:
        """Accurate before less accurate (when the setting counts those at all), then faster."""
        if b is None:
            return True
        return rank_key(a) < rank_key(b)

    # -- the loop --------------------------------------------------------------

    async def run(self, progress: Progress | None = None) -> SearchResult:
        self._progress = progress
        self.budget.started = time.monotonic()
        self._store("add_task", self.task)
        self.search_id = self._store("start_search", self.task.name, self.start, self.proposer.name,
                                     self._doc())
        root = Node(self.start, depth=0, parent=None, repairs_left=self.options.repair_rounds)
        self.nodes[root.id] = root
        self._emit("started", candidate=root.id, message=f"optimizing {self.task.name} "
                   f"with {self.proposer.name}" + (f" ({self.proposer.model})" if self.proposer.model else ""))
        try:
            reason = await self._loop(root)
            await self._cancel_children()  # prebuilds still running are moot now
            result = await self._finish("done", reason)
            self._emit("finished", candidate=result.best.id if result.best else None,
                       speedup=result.speedup, message=reason)
            return result
        except asyncio.CancelledError:
            await self._cancel_children()
            self.result = self._final("cancelled", "cancelled", confirmed=False)
            self._emit("cancelled", message="cancelled; everything evaluated is in the store")
            raise
        except Exception as e:
            await self._cancel_children()
            log.exception("search failed")
            self.result = self._final("failed", f"{type(e).__name__}: {e}", confirmed=False)
            self._emit("failed", message=self.result.reason)
            return self.result

    async def _cancel_children(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=0.5)

    async def _loop(self, root: Node) -> str:
        # A Proposer that cannot work (endpoint down) says so before any timing is spent.
        check = getattr(self.proposer, "check", None)
        if check is not None:
            try:
                await check()
            except verdicts.CannotRun as e:
                self._cannot_run = True
                self._step("proposer", e.reason, failed=True)
                return e.reason
        see = getattr(self.engine, "see", None)  # before device_info starts a Worker: its sandbox shows the Task
        if see is not None:
            see([self.task])
        try:
            self._device = dict(await self.engine.device_info() or {})
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.info("device_info failed: %s", e)
        if self._device.get("cuda") is False and self.start.kind == "cuda" and not self._built_only():
            self._cannot_run = True  # the engine says no GPU is visible: nothing to time, say so now
            self._step("device", verdicts.NO_GPU, failed=True)
            return verdicts.NO_GPU
        precheck = getattr(self.proposer, "precheck", None)
        if precheck is not None:
            problem = precheck(self.start, self._device)
            if problem:
                self._cannot_run = True
                self._step("proposer", problem, failed=True)
                return problem
        self._emit("evaluating", candidate=root.id, message="timing the starting source")
        root.evaluation = await self._evaluate(self.start, self.options.start_engine_options)
        self._evaluated += 1
        self.budget.used_evaluations += 1
        self._seen[near_key(self.start.source, self.start.kind)] = root.id
        root.speedup = self._speedup(root.evaluation) if self._runs(root.evaluation) else None
        self._store("update_node", self.search_id, root.id, root.evaluation.verdict)
        self._emit("baseline", candidate=root.id, verdict=root.evaluation.verdict,
                   speedup=root.speedup, message=root.evaluation.message or "")
        if root.evaluation.verdict == "correct" and root.evaluation.time is None and "bench" in self.options.checks:
            return "the starting source could not be timed"
        if (root.evaluation.verdict == "not_run" and not self._built_only()) or (
                root.evaluation.verdict == "error" and root.evaluation.correct is None):
            # No GPU for a GPU Task, execution off, a broken harness: no child could run either.
            self._cannot_run = True
            return root.evaluation.message or "the starting source could not run"
        if self.options.seed is not None and not self.options.repair_only and not self._built_only():
            await self._plant_seed(root)

        while True:
            why = self.budget.exhausted()
            if why:
                return why
            if self.options.repair_only and any(self._runs(n.evaluation) for n in self.nodes.values()):
                return "repaired" if not self._start_ok() else "the start already works"
            picked = self._select()
            if picked is None:
                return "the proposer had nothing more to try"
            node, mode = picked
            self.round += 1
            gained = await self._expand(node, mode)
            if mode == "optimize" or gained:
                self.budget.stale_rounds = 0 if gained else self.budget.stale_rounds + 1
            self._store("update_search", self.search_id, budget=self._doc())
            if self._errors >= self.options.max_errors:
                return f"stopped after {self._errors} proposer failures in a row: {self.steps[-1]['reason']}"
            if self._fatal:
                if self._evaluated <= 1:  # nothing but the start was ever evaluated
                    self._cannot_run = True
                    return self._fatal
                return f"proposer cannot go on: {self._fatal}"

    async def _plant_seed(self, root: Node) -> None:
        """The torch.compile seed (agent/seed.py): generated, evaluated like any candidate, and
        when correct a child of the start the tree can expand. Whatever happens, one line says it."""
        from kernel_lsp.nollm.proposer import is_module_start

        if not is_module_start(self.start):
            return  # the seed is for a PyTorch module; a start with its own kernels is its own seed
        if not self._start_ok():
            self.seed = Seed("skipped", "the start did not run, so nothing could be compared with it")
        elif getattr(self.options.seed, "precheck", None) is not None and self.options.seed.precheck(self._device):
            self.seed = Seed("skipped", self.options.seed.precheck(self._device))  # no GPU: not a failure
        else:
            self._emit("seeding", candidate=root.id,
                       message="writing torch.compile's kernels for this module as a seed (one torch.compile run)")
            try:
                made, why = await self.options.seed(self.engine, self.task, self.start, self._device)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a provider bug is one line; the Search goes on from the start
                log.exception("seed provider failed")
                made, why = None, f"{type(e).__name__}: {e}"
            if made is None:
                self.seed = Seed("not_generated", " ".join(str(why or "no file was written").split())[:300])
            else:
                self.seed = await self._evaluate_seed(root, made)
        self._step("seed", self.seed.line(), failed=self.seed.status in ("wrong", "not_generated"), candidate=self.seed.id,
                   status=self.seed.status)
        self._emit("seed", candidate=self.seed.id, speedup=self.seed.speedup, note=self.seed.label,
                   verdict=self.seed.evaluation.verdict if self.seed.evaluation else None, message=self.seed.line())

    async def _evaluate_seed(self, root: Node, made: Candidate) -> Seed:
        cand = Candidate(source=made.source, kind=made.kind, origin="seed", parent=root.id,
                         note=made.note or "torch.compile's kernels (seed)")
        key = near_key(cand.source, cand.kind)
        if key in self._seen:
            return Seed("skipped", "the generated file is the start itself, up to comments and whitespace")
        node = Node(cand, depth=1, parent=root.id, step=len(self.nodes), repairs_left=0)
        self.nodes[node.id] = node
        self._seen[key] = node.id
        self._store("add_node", self.search_id, cand, root.id, node.depth, node.step, "seed")
        self._emit("evaluating", candidate=node.id, parent=root.id, note=cand.note,
                   message=f"evaluating the seed: {cand.note}")
        node.evaluation = await self._evaluate(cand)
        self._record(node)
        ev = node.evaluation
        if not self._qualifies(ev):
            node.exhausted = True  # never expanded; the start's lineage goes on alone
            return Seed("wrong", verdicts.evaluation_reason(ev, self.options.kernels_only,
                                                            self.options.accept_less_accurate)[:300],
                        candidate=cand, evaluation=ev)
        first = root.evaluation
        return Seed("used", candidate=cand, evaluation=ev, speedup=node.speedup,
                    speedup_eager=vs_baseline(first, "eager", node.speedup, ev),
                    speedup_compile=vs_baseline(first, "compiled", node.speedup, ev))

    def _seed_node(self) -> Node | None:
        return self.nodes.get(self.seed.id) if self.seed is not None and self.seed.used and self.seed.id else None

    def _vs_seed_text(self, node: Node) -> str:
        """", 1.21x vs the seed" for a counted candidate other than the seed; "" otherwise."""
        seed = self._seed_node()
        if seed is None or node.id == seed.id or not node.speedup or not seed.speedup:
            return ""
        return f", {node.speedup / seed.speedup:.2f}x vs the seed"

    def _needs_repair(self, n: Node) -> bool:
        ev = n.evaluation
        if ev is None or self._qualifies(ev):
            return False
        if ev.verdict in REPAIRABLE:
            return True
        # A correct candidate held back by a flag one fix may lift (never the user's start).
        return (n.id != self.start.id and self._runs(ev) and not self._built_only()
                and bool(set(ev.flags) & REPAIRABLE_FLAGS)
                and not (set(ev.flags) & (self.options.bad_flags - REPAIRABLE_FLAGS - {"not_counted"})))

    def _select(self) -> tuple[Node, str] | None:
        can_repair = getattr(self.proposer, "can_repair", True)
        if can_repair:  # repair first: the newest node that needs it, with turns left
            node = pick_repair(self.nodes.values(), self._needs_repair)
            if node is not None:
                return node, "repair"
        if self.options.repair_only:
            return None
        open_nodes = [n for n in self.nodes.values()
                      if (self._qualifies(n.evaluation) or (n.id == self.start.id and self._runs(n.evaluation)))
                      and not n.exhausted and n.children < self.options.max_children]
        if not open_nodes:
            return None
        total = sum(n.visits for n in self.nodes.values())
        return ucb_pick(open_nodes, total, self.options.exploration), "optimize"

    def _profile_for(self, node: Node) -> Any:
        async def get() -> dict[str, Any] | None:
            if (not self.options.profile or not getattr(self.proposer, "uses_profile", True)
                    or node.depth < self.options.profile_after_depth
                    or not self._qualifies(node.evaluation)):
                return None
            if node.profile is None:
                try:
                    prof = await asyncio.wait_for(
                        self.engine.profile(self.task, node.candidate), self.options.profile_timeout)
                    # The engine reports a failed profile as {"error": ...}: not a fact for the prompt.
                    node.profile = prof if isinstance(prof, dict) and "error" not in prof else {}
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # profiling is a hint, never a reason to stop
                    log.info("profile failed: %s", e)
                    node.profile = {}
            return node.profile or None
        return get()

    def _toolbox(self) -> Toolbox | None:
        if not self.options.tools or not getattr(self.proposer, "uses_tools", False):
            return None

        async def evaluate(cand: Candidate, checks: tuple[str, ...]) -> Evaluation:
            what = {1: "compile", 2: "test", 3: "time"}.get(len(checks), "evaluate")
            self._emit("tool", candidate=cand.id, parent=cand.parent, message=f"the model asked to {what} a version")
            ev = await self._evaluate(cand, checks=checks)
            self._evaluated += 1
            self._step("tool", ev.message or ev.verdict, failed=False, candidate=cand.id, parent=cand.parent,
                       verdict=ev.verdict, checks=list(checks))
            return ev

        async def profile(cand: Candidate) -> dict[str, Any] | None:
            if not self.options.profile:
                return None
            try:
                prof = await asyncio.wait_for(self.engine.profile(self.task, cand), self.options.profile_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a hint, never a reason to stop
                return {"error": f"{type(e).__name__}: {e}"}
            return prof if isinstance(prof, dict) else None

        if self._tool_specs is None:  # once per Search, not per expansion (a file read on the event loop)
            self._tool_specs = tool_specs(self.task)
        return Toolbox(task=self.task, evaluate=evaluate, profile=profile, budget=self.budget,
                       start_evaluation=self.nodes[self.start.id].evaluation, specs=self._tool_specs,
                       seed_evaluation=self.seed.evaluation if self.seed is not None and self.seed.used else None)

    def _elsewhere(self, node: Node) -> list[str]:
        """What other lineages tried (this lineage's own turns are in its conversation)."""
        own = {n.id for n in tree_path(self.nodes, node)}
        return [text for about, text in self._history if about not in own]

    def _directions(self, node: Node, count: int, mode: str) -> list[str | None]:
        if mode != "optimize" or not self.options.directions:
            return [None] * count
        out: list[str | None] = [DIRECTIONS[(node.directions + i) % len(DIRECTIONS)] for i in range(count)]
        node.directions += count
        return out

    async def _expand(self, node: Node, mode: str) -> bool:
        visit(self.nodes, node)
        left = self.budget.proposals_left()
        # As many children as the Executor can evaluate at once (Ray: its GPU actors).
        count = max(self.options.children, self._width()) if mode == "optimize" else 1
        if left is not None:
            count = max(1, min(count, left))
        self._emit("proposing", candidate=node.id, verdict=node.evaluation.verdict if node.evaluation else None,
                   message=f"{'repairing' if mode == 'repair' else 'expanding'} {node.id[:8]}")
        directions = self._directions(node, count, mode)
        request = ProposalRequest(
            task=self.task, parent=node.candidate, evaluation=node.evaluation, mode=mode,  # type: ignore[arg-type]
            count=count, device=self._device, history=self._elsewhere(node),
            profile=await self._profile_for(node) if mode == "optimize" else None,
            start_evaluation=self.nodes[self.start.id].evaluation, round=self.round,
            conversation=list(node.conversation), direction=directions[0],
            siblings=[d for d in directions[1:] if d], tools=self._toolbox(),
            seed=self.seed if self.seed is not None and self.seed.used else None)
        try:
            proposals = await self.proposer.propose(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a Proposer bug is a failed step, not a crash
            log.exception("proposer failed")
            proposals = [Proposal.failed(f"proposer error: {type(e).__name__}: {e}")]
        if left is not None:
            proposals = proposals[: max(1, left)]  # never spend past the proposal budget
        if not proposals:
            node.exhausted = True
            self._step("exhausted", "no more proposals for this node", failed=False, parent=node.id)
            return False

        fresh: list[Node] = []
        if mode == "repair" and any(p.candidate is not None for p in proposals):
            node.repaired = True   # asked and answered; a failed ask leaves a turn less, not none
        elif mode == "repair":
            node.repairs_left -= 1
        for p in proposals:
            self.budget.used_proposals += 1
            self.budget.charge(p.prompt_tokens, p.completion_tokens, p.cost)
            for why in p.sent_back:  # answers the model got back with why, in the same turn
                self._step("proposal", f"unusable answer, sent back to the model: {why}", failed=True,
                           parent=node.id, mode=mode, sent_back=True)
            if p.candidate is None:
                reason = p.error or "no candidate"
                self._errors = self._errors + 1 if (p.fatal or _transport(reason)) else 0
                if p.fatal and self._fatal is None:
                    self._fatal = reason
                self._step("proposal", reason, failed=True, parent=node.id, mode=mode, fatal=p.fatal)
                self._history.append((node.id, f"(failed proposal from {node.id[:8]}: {reason[:160]})"))
                self._emit("proposal_failed", parent=node.id, message=reason)
                continue
            self._errors = 0
            cand = p.candidate
            key = near_key(cand.source, cand.kind) if self.options.near_duplicates else cand.id
            if cand.id in self.nodes or key in self._seen:
                same = cand.id if cand.id in self.nodes else self._seen[key]
                what = ("proposed a source already in this search" if cand.id in self.nodes else
                        f"proposed a near-duplicate of {same[:8]} (same code up to comments and whitespace)")
                self._step("duplicate", what, failed=True, parent=node.id, candidate=cand.id)
                self._emit("duplicate", candidate=cand.id, parent=node.id, message=what)
                continue
            self._seen[key] = cand.id
            node.children += 1
            child = Node(cand, depth=node.depth + 1, parent=node.id, step=len(self.nodes),
                         repairs_left=(node.repairs_left - 1) if mode == "repair" else self.options.repair_rounds,
                         conversation=list(p.messages))
            self.nodes[child.id] = child
            self._store("add_node", self.search_id, cand, node.id, child.depth, child.step, "proposed")
            fresh.append(child)
        if not fresh:
            return False

        for child in fresh:  # compile the batch while earlier ones are being timed
            self._prebuild(child.candidate)
        gate = asyncio.Semaphore(max(1, self.options.max_in_flight, self._width()))

        async def one(child: Node) -> Node:
            async with gate:
                self._emit("evaluating", candidate=child.id, parent=node.id, note=child.candidate.note,
                           message=f"evaluating {child.candidate.note or child.id[:8]}")
                child.evaluation = await self._evaluate(child.candidate)
                return child

        gained = False
        jobs = [asyncio.ensure_future(one(c)) for c in fresh]
        for j in jobs:
            self._tasks.add(j)
            j.add_done_callback(self._tasks.discard)
        for fut in asyncio.as_completed(jobs):
            child = await fut
            gained |= self._record(child)
        return gained

    def _record(self, child: Node) -> bool:
        ev = child.evaluation
        assert ev is not None
        self._evaluated += 1
        self.budget.used_evaluations += 1
        child.speedup = self._speedup(ev) if self._qualifies(ev) else None
        backup(self.nodes, child, child.speedup or 0.0)
        self._store("update_node", self.search_id, child.id, ev.verdict)
        vs_seed = self._vs_seed_text(child)
        shown = (f"{child.speedup:.2f}x" if child.speedup else ev.verdict) + vs_seed
        self._history.append((child.id, f"{child.id[:8]} {child.candidate.note or child.candidate.origin}: {ev.verdict}"
                             + (f", {child.speedup:.2f}x vs start" if child.speedup else "") + vs_seed))
        self._step("evaluation", ev.message or ev.verdict, failed=not self._qualifies(ev),
                   candidate=child.id, parent=child.parent, verdict=ev.verdict, speedup=child.speedup)
        label = verdicts.label(ev.custom_kernel)
        if child.speedup and ev.custom_kernel is False:
            shown += " (PyTorch rewrite)"
        self._emit("evaluated", candidate=child.id, parent=child.parent, verdict=ev.verdict,
                   speedup=child.speedup, note=child.candidate.note, label=label,
                   message=f"{child.candidate.note or child.id[:8]}: {shown}")
        if self._beats_start(child) and self._better(child, self.best):
            self.best = child
            self._store("update_search", self.search_id, best=child.id)
            self._emit("new_best", candidate=child.id, verdict=ev.verdict, speedup=child.speedup,
                       note=child.candidate.note, label=label, message=f"new best: {shown}")
            return True
        return False

    # -- the guard -------------------------------------------------------------

    def _ranking(self) -> list[Node]:
        nodes = [n for n in self.nodes.values() if n.id != self.start.id and self._beats_start(n)]
        return sorted(nodes, key=rank_key)

    async def _finish(self, state: str, reason: str) -> SearchResult:
        root = self.nodes[self.start.id]
        ranked = self._ranking()
        winner: Node | None = None
        win_ev: Evaluation | None = None
        speedup: float | None = None
        confirmed = False
        start_ev = root.evaluation
        if ranked and not self._start_ok():
            winner, win_ev = ranked[0], ranked[0].evaluation   # a repair: correct beats broken
        elif ranked and self.options.confirm:
            self._emit("confirming", candidate=ranked[0].id, message="re-timing the best against the start")
            start_ev = await self._evaluate(self.start)
            self._evaluated += 1
            for node in ranked[: max(1, self.options.confirm_top)]:
                ev = await self._evaluate(node.candidate)
                self._evaluated += 1
                ok = self._qualifies(ev) and self._runs(start_ev)
                s = (start_ev.time.median_ms / ev.time.median_ms) if ok and ev.time.median_ms > 0 else None  # type: ignore[union-attr]
                limit = noise_threshold(start_ev, ev, self.options.min_gain, self.options.noise_factor)
                self._step("confirmation", f"{s:.3f}x vs start (needs > {limit:.3f})" if s else ev.verdict,
                           failed=not (s and s > limit), candidate=node.id, speedup=s)
                node.confirmed_speedup, node.confirmed_evaluation = s, ev
                if s is None and not self._runs(start_ev):
                    self._confirm_note = ("the start did not run when re-timed ("
                                          + verdicts.evaluation_reason(start_ev) + ")")
                elif s is None:
                    self._confirm_note = ("the best candidate did not hold up when re-timed ("
                                          + verdicts.evaluation_reason(ev) + ")")
                else:
                    self._confirm_note = (f"no candidate stayed faster than the start when re-timed "
                                          f"(best {s:.2f}x, needs > {limit:.2f}x)")
                if s is not None and s > limit:
                    winner, win_ev, speedup, confirmed = node, ev, s, True
                    break
            self._emit("confirmed" if confirmed else "not_confirmed",
                       candidate=winner.id if winner else None, speedup=speedup,
                       message=(f"confirmed {speedup:.2f}x" if confirmed and speedup
                                else "no candidate stayed faster than the start when re-timed"))
        elif ranked:  # confirmation off: the Search's own measurement
            winner, win_ev, speedup = ranked[0], ranked[0].evaluation, ranked[0].speedup
        if winner is not None and self._seed_node() is not None and winner.id != self.seed.id and self._start_ok():
            winner, win_ev, speedup, confirmed = await self._against_seed(winner, win_ev, speedup, confirmed, start_ev)
        if winner is not None and speedup is None and self._runs(start_ev) and win_ev and win_ev.time:
            speedup = start_ev.time.median_ms / win_ev.time.median_ms  # type: ignore[union-attr]
        if winner is None and not self._cannot_run:
            reason = self._why_not(reason)
        result = self._final(state, reason, confirmed=confirmed, winner=winner, win_ev=win_ev,
                             speedup=speedup, start_ev=start_ev)
        return result

    async def _against_seed(self, winner: Node, win_ev: Evaluation | None, speedup: float | None,
                            confirmed: bool, start_ev: Evaluation | None
                            ) -> tuple[Node | None, Evaluation | None, float | None, bool]:
        """The winner beat the start; it must beat the seed too, by more than the noise, in the
        same kind of measurement (re-timed in the confirmation when the winner was). Otherwise
        the seed is what is offered, when it beats the start; else nothing is."""
        seed = self._seed_node()
        assert seed is not None and self.seed is not None and win_ev is not None
        seed_ev = seed.evaluation
        if confirmed:
            if seed.confirmed_evaluation is None:  # not re-timed in the confirmation loop yet
                seed.confirmed_evaluation = await self._evaluate(seed.candidate)
                self._evaluated += 1
                ev = seed.confirmed_evaluation
                if self._qualifies(ev) and self._runs(start_ev) and ev.time.median_ms > 0:  # type: ignore[union-attr]
                    seed.confirmed_speedup = start_ev.time.median_ms / ev.time.median_ms  # type: ignore[union-attr]
            seed_ev = seed.confirmed_evaluation
            self.seed.confirmed_speedup = seed.confirmed_speedup
        if not self._qualifies(seed_ev) or win_ev.time is None or win_ev.time.median_ms <= 0:
            self._step("seed", "the seed did not hold up when re-timed; the best is judged against the start alone",
                       failed=True, candidate=seed.id)
            return winner, win_ev, speedup, confirmed
        assert seed_ev is not None and seed_ev.time is not None
        ratio = seed_ev.time.median_ms / win_ev.time.median_ms
        limit = noise_threshold(seed_ev, win_ev, self.options.min_gain, self.options.noise_factor)
        if ratio > limit:
            self._vs_seed = ratio
            self._step("seed", f"{ratio:.3f}x vs the seed (needs > {limit:.3f})", failed=False, candidate=winner.id)
            return winner, win_ev, speedup, confirmed
        s_seed = seed.confirmed_speedup if confirmed else seed.speedup
        beats = s_seed is not None and self._runs(start_ev) and s_seed > noise_threshold(
            start_ev, seed_ev, self.options.min_gain, self.options.noise_factor)  # type: ignore[arg-type]
        self._step("seed", f"the best proposal {winner.id[:8]} was {ratio:.2f}x the seed (needs > {limit:.2f}x): "
                   + ("the seed is offered instead" if beats else "and the seed was not faster than the start"),
                   failed=True, candidate=winner.id)
        if beats:
            self._emit("seed", candidate=seed.id, speedup=s_seed, message="no proposal beat the seed: the seed is offered")
            return seed, seed_ev, s_seed, confirmed
        self._confirm_note = (f"no candidate was faster than the torch.compile seed by more than the noise "
                              f"(best {ratio:.2f}x of it), and the seed was not faster than the start")
        return None, None, None, False

    def _why_not(self, stop: str) -> str:
        """Why the Search stopped, then why no candidate won, in the user's words."""
        tried = [n for n in self.nodes.values() if n.id != self.start.id and n.evaluation is not None]
        why = self._confirm_note or no_winner(tried, self.steps, self._runs, self._qualifies, self.options)
        return f"{stop}; {why}"

    def _final(self, state: str, reason: str, *, confirmed: bool, winner: Node | None = None,
               win_ev: Evaluation | None = None, speedup: float | None = None,
               start_ev: Evaluation | None = None) -> SearchResult:
        root = self.nodes.get(self.start.id)
        if start_ev is None and root is not None:
            start_ev = root.evaluation
        if state != "done" and winner is None and self.best is not None:
            # Cancelled or failed: record the best so far (unconfirmed; improved stays False).
            best_so_far = self.best
        else:
            best_so_far = winner
        first = root.evaluation if root is not None else None
        ranking = rank_rows(self.nodes.values(), self._qualifies, winner, first,
                            self.seed.id if self.seed is not None else None)
        if state == "cancelled":
            outcome = "cancelled"
        elif state == "failed":
            outcome = "failed"
        elif self._cannot_run:
            outcome = "cannot_run"
        else:
            outcome = "improved" if winner is not None else "no_improvement"
        result = SearchResult(
            search_id=self.search_id, task=self.task.name, state=state, reason=reason,
            improved=winner is not None, start=self.start, start_evaluation=start_ev,
            best=winner.candidate if winner else None, best_evaluation=win_ev, speedup=speedup,
            confirmed=confirmed, candidates_evaluated=self._evaluated, usage=self.budget.usage(),
            steps=list(self.steps), ranking=ranking, outcome=outcome)
        if self.seed is not None:
            result.seed = {**self.seed.to_dict(), "vs_seed": self._vs_seed if winner is not None else None,
                           "offered": winner is not None and winner.id == self.seed.id}
        if winner is not None and win_ev is not None:
            result.measurement = "confirmation" if confirmed else "first run"
            result.speedup_eager = vs_baseline(first, "eager", speedup, win_ev)
            result.speedup_compile = vs_baseline(first, "compiled", speedup, win_ev)
            spreads = [e.time.spread_pct for e in (win_ev, start_ev) if e is not None and e.time is not None]
            result.spread_pct = max(spreads) if spreads else None
            result.noisy = verdicts.is_noisy(result.spread_pct)
            result.custom_kernel = win_ev.custom_kernel
            result.label = verdicts.label(win_ev.custom_kernel)
            result.compile_faster = None if result.speedup_compile is None else result.speedup_compile < 1.0
        if first is not None:
            result.eager_ms = first.eager.median_ms if first.eager else None
            result.compile_ms = first.compiled.median_ms if first.compiled else None
        shared = [e.shared_gpu for e in (win_ev, start_ev, first) if e is not None and e.shared_gpu]
        result.shared_gpu = shared[0] if shared else None
        summary = {k: v for k, v in result.to_dict().items() if k not in ("failed_steps", "usage")}
        summary["best_so_far"] = best_so_far.id if best_so_far else None
        if self.search_id is not None:
            # Plain synchronous sqlite: runs to the end even while the task is being cancelled.
            self._store("update_search", self.search_id, budget=self._doc(summary))
            self._store("finish_search", self.search_id, state=state,
                        best=best_so_far.id if best_so_far else None, message=reason)
        self.result = result
        return result


def _transport(reason: str) -> bool:
    return any(w in reason for w in ("cannot reach", "rate limited", "server error", "timed out",
                                     "authentication", "API error"))

