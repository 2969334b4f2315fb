"""The Proposer protocol: what the Search asks for and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from kernel_lsp.model import Candidate, Evaluation, Task

Mode = Literal["optimize", "repair"]


@dataclass
class ProposalRequest:
    """One expansion of a Search node."""

    task: Task
    parent: Candidate                      # the node's source: what to improve or repair
    evaluation: Evaluation | None          # what running `parent` gave
    mode: Mode = "optimize"                # repair: fix the compile error / wrong result first
    count: int = 1                         # how many children the Search wants
    device: dict[str, Any] = field(default_factory=dict)       # engine.device_info()
    history: list[str] = field(default_factory=list)           # short lines: what was tried
    profile: dict[str, Any] | None = None  # profiler facts, only once the node is correct
    start_evaluation: Evaluation | None = None                 # the user's source, as timed
    round: int = 0
    # The lineage's conversation so far (no system message): the turns that led to `parent`,
    # ending with the answer that made it; empty for the start. Its evaluation is the next turn.
    conversation: list[dict[str, Any]] = field(default_factory=list)
    direction: str | None = None           # this child's idea to pursue (siblings differ)
    siblings: list[str] = field(default_factory=list)          # what the siblings were asked for
    tools: Any = None                      # a tools.Toolbox: evaluations the model may call itself
    seed: Any = None                       # agent/seed.py Seed, when a correct torch.compile seed is in the tree


@dataclass
class Proposal:
    """One proposed child, or one failed proposal with its reason."""

    candidate: Candidate | None
    error: str | None = None               # why no candidate (a recorded failed step)
    fatal: bool = False                    # the Proposer cannot go on (wrong key, no endpoint)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0
    form: str = ""                         # "file" | "patch" | "tuner"
    # The lineage's turns up to and including the answer that made `candidate` (no system
    # message): the conversation its own expansion continues.
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0                         # model requests this proposal took
    sent_back: list[str] = field(default_factory=list)  # why earlier answers in it were unusable

    @classmethod
    def failed(cls, reason: str, **kw: Any) -> "Proposal":
        return cls(candidate=None, error=reason, **kw)


# Optional hooks the Search calls before any timing, when a Proposer has them:
#   async check() -> None: raise kernel_lsp.verdicts.CannotRun (EndpointUnreachable) when it
#       cannot work at all (the LLM proposer probes its endpoint);
#   precheck(start: Candidate, device: dict) -> str | None: why it has nothing to offer for
#       this start (the tuner without tunables), or None.
# Either stops the Search at once with outcome "cannot_run" and that reason.


@runtime_checkable
class Proposer(Protocol):
    name: str                              # "llm" | "tuner" | ...
    model: str | None                      # for the store and the report; None without an LLM

    async def propose(self, request: ProposalRequest) -> list[Proposal]:
        """Children of `request.parent`; never raises for a bad answer (a failed Proposal)."""
        ...

    async def aclose(self) -> None:
        ...
