"""What a Search ends with: its SearchResult, the ranking of counted candidates (one speedup
each, and which measurement it comes from), the noise a speedup must beat, and why no
candidate won. Pure functions of the tree's nodes: search.py decides, this says."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from kernel_lsp import verdicts
from kernel_lsp.model import KERNELS_ONLY_FLAGS, Candidate, Evaluation, Timing

from .tree import Node


def rank_key(n: Node) -> tuple[bool, float]:
    """How the Search orders counted candidates: an accurate one before any `less_accurate` one
    (docs/correctness.md), then the faster first."""
    ev = n.evaluation
    less = ev is not None and "less_accurate" in ev.flags
    return (less, ev.time.median_ms if ev is not None and ev.time is not None else math.inf)


@dataclass
class SearchResult:
    search_id: int | None
    task: str
    state: str                           # done | cancelled | failed
    reason: str                          # why it stopped
    improved: bool
    start: Candidate
    start_evaluation: Evaluation | None
    best: Candidate | None               # the guard's winner; None without an improvement
    best_evaluation: Evaluation | None
    speedup: float | None                # confirmed, vs the start
    confirmed: bool
    candidates_evaluated: int
    usage: dict[str, Any]
    steps: list[dict[str, Any]]
    ranking: list[dict[str, Any]]        # correct candidates: the winner first, then by speedup
    # What happened, for front ends (kernel_lsp.verdicts turns it into text and exit codes):
    outcome: str = "no_improvement"      # improved | no_improvement | cannot_run | cancelled | failed
    # The best candidate (the winner; None without one):
    speedup_eager: float | None = None   # vs the reference run eagerly
    speedup_compile: float | None = None  # vs torch.compile of the reference
    spread_pct: float | None = None      # the larger relative spread of best and start, percent
    noisy: bool = False                  # spread above verdicts.NOISY_SPREAD_PCT: a warning
    measurement: str | None = None       # "confirmation" | "first run": where `speedup` comes from
    custom_kernel: bool | None = None    # False: a PyTorch rewrite (no custom kernel)
    label: str | None = None             # "custom kernel" | "PyTorch rewrite (no custom kernel)"
    compile_faster: bool | None = None   # torch.compile of the reference beats the best
    shared_gpu: dict[str, Any] | None = None  # timed while other processes used the GPU
    eager_ms: float | None = None        # the reference eagerly, timed with the start
    compile_ms: float | None = None      # torch.compile of the reference, timed with the start
    seed: dict[str, Any] | None = None   # agent/seed.py Seed.to_dict() plus "vs_seed"; None: no seed asked

    @property
    def failed_steps(self) -> list[dict[str, Any]]:
        return [s for s in self.steps if s.get("failed")]

    @property
    def headline(self) -> str:
        """One sentence for the user (verdicts.search_reason)."""
        return verdicts.search_reason(self)

    @property
    def tokens(self) -> int:
        return int(self.usage.get("tokens", 0))

    @property
    def cost(self) -> float:
        return float(self.usage.get("cost", 0.0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "search": self.search_id, "task": self.task, "state": self.state, "reason": self.reason,
            "improved": self.improved, "speedup": self.speedup, "confirmed": self.confirmed,
            "best": self.best.id if self.best else None,
            "best_note": self.best.note if self.best else None,
            "start": self.start.id,
            "start_ms": ms(self.start_evaluation), "best_ms": ms(self.best_evaluation),
            "candidates_evaluated": self.candidates_evaluated,
            "tokens": self.tokens, "cost": round(self.cost, 6), "usage": self.usage,
            "ranking": self.ranking, "failed_steps": self.failed_steps,
            "outcome": self.outcome, "headline": self.headline,
            "speedup_eager": self.speedup_eager, "speedup_compile": self.speedup_compile,
            "spread_pct": self.spread_pct, "noisy": self.noisy, "measurement": self.measurement,
            "custom_kernel": self.custom_kernel, "label": self.label,
            "compile_faster": self.compile_faster, "shared_gpu": self.shared_gpu,
            "eager_ms": self.eager_ms, "compile_ms": self.compile_ms, "seed": self.seed,
            "sandboxed": _sandboxed(self.start_evaluation, self.best_evaluation),
        }


def _sandboxed(*evs: Evaluation | None) -> bool | None:
    """Whether the start and the best ran in the sandbox (engine/caller/sandbox.py); None: nothing ran."""
    ran = [ev for ev in evs if ev is not None]
    return all(ev.sandboxed for ev in ran) if ran else None


def ms(ev: Evaluation | None) -> float | None:
    return ev.time.median_ms if ev is not None and ev.time is not None else None


def noise_threshold(a: Evaluation, b: Evaluation, min_gain: float = 0.02, factor: float = 2.0) -> float:
    """The speedup b must beat over a to count: 1 + max(min_gain, factor * the larger spread)."""
    spread = max(a.time.spread_pct if a.time else 0.0, b.time.spread_pct if b.time else 0.0) / 100
    return 1.0 + max(min_gain, factor * spread)


def rank_rows(nodes: Iterable[Node], qualifies: Callable[[Evaluation | None], bool], winner: Node | None,
              first: Evaluation | None, seed_id: str | None) -> list[dict[str, Any]]:
    """Counted candidates, each with ONE speedup: the confirmation's where it was re-timed,
    else the first run's (and which it is); the winner first, then by that speedup."""
    rows = []
    for n in nodes:
        if not qualifies(n.evaluation):
            continue
        confirmed = n.confirmed_speedup is not None and n.confirmed_evaluation is not None
        ev = n.confirmed_evaluation if confirmed else n.evaluation
        speedup = n.confirmed_speedup if confirmed else n.speedup
        assert ev is not None
        spread = ev.time.spread_pct if ev.time else None
        rows.append({"candidate": n.id, "note": n.candidate.note, "origin": n.candidate.origin,
                     "depth": n.depth, "time_ms": ms(ev), "speedup": speedup,
                     "measurement": "confirmation" if confirmed else "first run",
                     "speedup_eager": vs_baseline(first, "eager", speedup, ev),
                     "speedup_compile": vs_baseline(first, "compiled", speedup, ev),
                     "spread_pct": spread, "noisy": verdicts.is_noisy(spread),
                     "custom_kernel": ev.custom_kernel, "label": verdicts.label(ev.custom_kernel),
                     "less_accurate": "less_accurate" in ev.flags,
                     "accuracy": verdicts.accuracy_phrase(ev.accuracy),
                     "winner": winner is not None and n.id == winner.id,
                     "seed": seed_id is not None and n.id == seed_id})
    rows.sort(key=lambda r: (not r["winner"], r["less_accurate"],
                             -(r["speedup"] if r["speedup"] is not None else -math.inf),
                             r["time_ms"] if r["time_ms"] is not None else math.inf))
    return rows


def no_winner(tried: list[Node], steps: list[dict[str, Any]], runs: Callable[[Evaluation | None], bool],
              qualifies: Callable[[Evaluation | None], bool], options: Any) -> str:
    """Why no candidate won, in the user's words (`tried`: every evaluated one but the start)."""
    if not tried:
        failed = [st for st in steps if st["kind"] == "proposal" and st["failed"]]
        if failed:
            return f"no proposal gave a candidate ({len(failed)} failed; last: {failed[-1]['reason'][:160]})"
        return "no candidate was proposed"
    correct = [n for n in tried if runs(n.evaluation)]
    if not correct:
        counts = Counter(n.evaluation.verdict for n in tried if n.evaluation is not None)
        what = ", ".join(f"{k} {v}" for k, v in counts.most_common())
        return f"no candidate was correct ({what})"
    counted = [n for n in correct if qualifies(n.evaluation)]
    if not counted:
        if options.kernels_only and any(
                n.evaluation is not None and n.evaluation.custom_kernel is False for n in correct):
            return "the correct candidates were PyTorch rewrites, which kernels_only does not count"
        flags = sorted({f for n in correct if n.evaluation is not None for f in n.evaluation.flags}
                       & (options.bad_flags | KERNELS_ONLY_FLAGS))
        hint = ("; less accurate ones count with accept_less_accurate = true"
                if "less_accurate" in flags and not options.accept_less_accurate else "")
        return f"every correct candidate was disqualified ({', '.join(flags) or 'flags'}){hint}"
    best = max((n.speedup for n in counted if n.speedup is not None), default=None)
    if best is None:
        return "the start could not be compared with the candidates"
    if best <= 1.0:
        return f"{verdicts.ALL_SLOWER} than the start (best {best:.2f}x)"
    return f"no candidate was faster than the start by more than the measured noise (best {best:.2f}x)"


def vs_baseline(first: Evaluation | None, baseline: str, speedup: float | None, ev: Evaluation) -> float | None:
    """A candidate's speedup over a baseline of the reference. The baselines are timed once, with
    the start: baseline/start from that run times the candidate's speedup over the start (from the
    measurement `speedup` comes from), so both speedups describe the same measurement; without
    a timed start, baseline / candidate time directly."""
    base: Timing | None = getattr(first, baseline, None) if first is not None else None
    if base is None or base.median_ms <= 0:
        return None
    if speedup is not None and first is not None and first.time is not None and first.time.median_ms > 0:
        return base.median_ms / first.time.median_ms * speedup
    if ev.time is not None and ev.time.median_ms > 0:
        return base.median_ms / ev.time.median_ms
    return None
