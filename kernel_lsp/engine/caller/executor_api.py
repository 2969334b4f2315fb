"""What every Executor offers (executor.py builds them; ray_executor.py is one of them)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from kernel_lsp.engine.caller.client import Progress
from kernel_lsp.model import Candidate, CompileResult, Evaluation, Task

EXECUTORS = ("local", "ray")

# status() and the on_status callback carry one dict:
#   {"executor": "local" | "ray", "state": "connected" | "lost" | "closed",
#    "address": str | None, "gpus": int, "nodes": [str], "message": str}
StatusCallback = Callable[[dict[str, Any]], Any]


class ExecutorUnavailable(Exception):
    """The Executor cannot run anything; the message says why, in one sentence."""


@runtime_checkable
class Executor(Protocol):
    kind: str                   # "local" | "ray"
    store: Any

    @property
    def concurrency(self) -> int: ...

    async def evaluate(self, task: Task, candidate: Candidate, checks: Iterable[str] = ...,
                       progress: Progress | None = None, timeout: float | None = None,
                       options: dict[str, Any] | None = None,
                       early: Callable[[Evaluation], Any] | None = None) -> Evaluation: ...
    # early: the partial Evaluation (verdict and eager ratio, torch.compile pending) when the
    # executor can stream one (local); the Ray executor never calls it.

    async def prebuild(self, task: Task, candidate: Candidate, options: dict[str, Any] | None = None,
                       timeout: float | None = None) -> CompileResult: ...

    async def profile(self, task: Task, candidate: Candidate | None = None, timeout: float | None = None,
                      options: dict[str, Any] | None = None) -> dict[str, Any]: ...

    async def device_info(self, timeout: float | None = None) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...
