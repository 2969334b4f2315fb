"""What a Search may spend: evaluations, proposals, LLM tokens, money, wall time, rounds without gain.

Evaluations are what a Search really spends (a GPU evaluation of a KernelBench-size Task takes
2-25 s on the H200 once built): the default of 32 is minutes of measurements, not the eight
one-shot calls it used to be. A model's tool calls (compile, test, time, profile) count here too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

# USD per 1M tokens (input, output). Longest prefix of the model name wins; unknown or
# local models cost $0. Override or extend with `Pricing(table={...})` or the config.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-5": (1.25, 10.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "o4-mini": (1.10, 4.40),
    "o3-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "o1": (15.00, 60.00),
    "claude-opus-4": (15.00, 75.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-haiku-4": (1.00, 5.00),
    "deepseek-chat": (0.27, 1.10),
    "deepseek-reasoner": (0.55, 2.19),
}


@dataclass
class Pricing:
    table: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_PRICES))

    def lookup(self, model: str) -> tuple[float, float]:
        name = (model or "").strip().lower()
        if "/" in name:  # "openai/gpt-4o" style provider prefixes
            name = name.rsplit("/", 1)[1]
        best = ""
        for key in self.table:
            if name.startswith(key.lower()) and len(key) > len(best):
                best = key
        return self.table[best] if best else (0.0, 0.0)

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        pin, pout = self.lookup(model)
        return (prompt_tokens * pin + completion_tokens * pout) / 1_000_000


@dataclass
class Budget:
    """Limits (None: no limit) and what has been used so far."""

    proposals: int | None = 20            # candidates proposed (failed proposals count)
    evaluations: int | None = 32          # engine evaluations (the start's, children's, tool calls');
                                          # the final confirmation re-timing is not counted
    tokens: int | None = None             # prompt + completion tokens
    cost: float | None = None             # USD
    seconds: float | None = None          # wall time of the whole Search
    patience: int | None = 5              # rounds without a new best before stopping

    used_proposals: int = 0
    used_evaluations: int = 0
    used_prompt_tokens: int = 0
    used_completion_tokens: int = 0
    used_cost: float = 0.0
    stale_rounds: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def used_tokens(self) -> int:
        return self.used_prompt_tokens + self.used_completion_tokens

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def charge(self, prompt_tokens: int = 0, completion_tokens: int = 0, cost: float = 0.0) -> None:
        self.used_prompt_tokens += prompt_tokens
        self.used_completion_tokens += completion_tokens
        self.used_cost += cost

    def exhausted(self) -> str | None:
        """Why the Search must stop now, or None."""
        if self.evaluations is not None and self.used_evaluations >= self.evaluations:
            return f"evaluation budget spent ({self.used_evaluations}/{self.evaluations})"
        if self.proposals is not None and self.used_proposals >= self.proposals:
            return f"proposal budget spent ({self.used_proposals}/{self.proposals})"
        if self.tokens is not None and self.used_tokens >= self.tokens:
            return f"token budget spent ({self.used_tokens}/{self.tokens})"
        if self.cost is not None and self.used_cost >= self.cost:
            return f"cost budget spent (${self.used_cost:.4f}/${self.cost:.4f})"
        if self.seconds is not None and self.elapsed() >= self.seconds:
            return f"time budget spent ({self.elapsed():.0f}s/{self.seconds:.0f}s)"
        if self.patience is not None and self.stale_rounds >= self.patience:
            return f"no gain in {self.stale_rounds} rounds"
        return None

    def proposals_left(self) -> int | None:
        return None if self.proposals is None else max(0, self.proposals - self.used_proposals)

    def evaluations_left(self) -> int | None:
        return None if self.evaluations is None else max(0, self.evaluations - self.used_evaluations)

    def left(self) -> dict[str, Any]:
        return {
            "proposals": self.proposals_left(),
            "evaluations": self.evaluations_left(),
            "tokens": None if self.tokens is None else max(0, self.tokens - self.used_tokens),
            "cost": None if self.cost is None else max(0.0, self.cost - self.used_cost),
            "seconds": None if self.seconds is None else max(0.0, self.seconds - self.elapsed()),
        }

    def limits(self) -> dict[str, Any]:
        return {"proposals": self.proposals, "evaluations": self.evaluations, "tokens": self.tokens, "cost": self.cost,
                "seconds": self.seconds, "patience": self.patience}

    def usage(self) -> dict[str, Any]:
        return {"proposals": self.used_proposals, "evaluations": self.used_evaluations, "prompt_tokens": self.used_prompt_tokens,
                "completion_tokens": self.used_completion_tokens, "tokens": self.used_tokens,
                "cost": round(self.used_cost, 6), "seconds": round(self.elapsed(), 3)}
