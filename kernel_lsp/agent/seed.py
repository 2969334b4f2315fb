"""The LLM Search's seed: the best start the machine already knows, made without an LLM.

With `agent.seed = "inductor"`, a Search of the LLM Proposer over a module Target (a Python
Task with no kernel of its own) first asks the no-LLM writer (kernel_lsp/nollm) for the file
torch.compile's Triton kernels make for this module, these shapes and this GPU. The Search
verifies and times that file like any candidate; a correct one becomes a child of the start
that the tree can expand, and the prompt of its lineage shows its kernels with their numbers.
What the Search offers must then beat the seed too, not only the start (search.py).

The seed is made by a provider, `async (engine, task, start, device) -> (Candidate | None, why)`:
`inductor_seed` in production; tests pass one that converts a recorded Inductor module (CI has
no GPU). Generation costs one torch.compile of the module in the Worker (about 20 s on the H200,
benchmarks/results/no_llm.md), paid once per Search.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from kernel_lsp.model import Candidate, Evaluation, Task

NO_GPU = ("no CUDA GPU is visible, and torch.compile writes its Triton kernels for the GPU it runs on")

SeedProvider = Callable[[Any, Task, Candidate, dict], Awaitable[tuple[Candidate | None, str]]]


async def inductor_seed(engine: Any, task: Task, start: Candidate, device: dict[str, Any],
                        timeout: float = 600.0) -> tuple[Candidate | None, str]:
    """torch.compile's default-mode kernels as a standalone ModelNew file (one compile in the
    Worker; max-autotune is left to the no-LLM path: it takes minutes, not seconds)."""
    why_not = _precheck(device)
    if why_not:
        return None, why_not
    from kernel_lsp.nollm.proposer import generate, label

    try:
        gens, why = await generate(engine, task.reference_source, modes=("default",), timeout=timeout)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - a writer bug is one sentence, the Search goes on
        return None, f"writing torch.compile's kernels failed: {type(exc).__name__}: {exc}"
    for mode, gen in gens.items():
        return Candidate(source=gen.source, kind="python", origin="seed", note=label(gen, mode)), ""
    return None, "; ".join(why.values()) or "torch.compile's code gave no file"


def _precheck(device: dict[str, Any]) -> str | None:
    """Why no seed can be made on this machine, before any work (the Search says it as a skip)."""
    return NO_GPU if device.get("cuda") is False else None


inductor_seed.precheck = _precheck  # type: ignore[attr-defined]


def provider_for(setting: str, proposer: Any) -> SeedProvider | None:
    """The provider the setting asks for, when the Search's Proposer is the LLM (the no-LLM
    path starts from torch.compile's kernels anyway); None: no seed."""
    if setting != "inductor" or getattr(proposer, "name", None) != "llm":
        return None
    return inductor_seed


@dataclass
class Seed:
    """What became of the seed, for the prompt, the progress and the report."""

    status: str                         # used | wrong | not_generated | skipped
    reason: str = ""                    # one line: why it is not used ("" when used)
    candidate: Candidate | None = None
    evaluation: Evaluation | None = None
    speedup: float | None = None        # vs the start, first run
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    confirmed_speedup: float | None = None  # vs the start, when re-timed in the confirmation

    @property
    def id(self) -> str | None:
        return self.candidate.id if self.candidate is not None else None

    @property
    def label(self) -> str:
        return self.candidate.note if self.candidate is not None else ""

    @property
    def used(self) -> bool:
        return self.status == "used"

    @property
    def time_ms(self) -> float | None:
        ev = self.evaluation
        return ev.time.median_ms if ev is not None and ev.time is not None else None

    def line(self) -> str:
        """One line for the progress and the report."""
        if not self.used:
            what = {"wrong": "did not pass verification", "not_generated": "could not be generated",
                    "skipped": "was not generated"}.get(self.status, self.status)
            return f"the torch.compile seed {what}: {self.reason}; the Search started from your code alone"
        parts = [f"{self.speedup:.2f}x vs the start" if self.speedup else None,
                 f"{self.speedup_eager:.2f}x PyTorch eager" if self.speedup_eager else None,
                 f"{self.speedup_compile:.2f}x torch.compile" if self.speedup_compile else None]
        ms = f"{self.time_ms:.4g} ms, " if self.time_ms is not None else ""
        return f"seed: {self.label} ({ms}{', '.join(p for p in parts if p) or 'not timed'})"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "candidate": self.id, "label": self.label,
                "time_ms": self.time_ms, "speedup": self.speedup, "speedup_eager": self.speedup_eager,
                "speedup_compile": self.speedup_compile, "confirmed_speedup": self.confirmed_speedup,
                "line": self.line()}


def summary_line(seed: dict[str, Any] | None) -> str | None:
    """The seed's line (Seed.line() in SearchResult.seed) with how the best compares with it,
    for the CLI's summary and the report; None when no seed was asked for. `offered` and
    `vs_seed` are set only when there is a best and the seed was used (search.py)."""
    if not isinstance(seed, dict) or not seed.get("line"):
        return None
    text = str(seed["line"])
    if seed.get("offered"):
        return text + "; no proposal beat it: the seed itself is the best"
    if seed.get("vs_seed"):
        return text + f"; the best is {seed['vs_seed']:.2f}x faster than the seed"
    return text
