"""Tools a model may call through OpenAI tool calling: compile, test, time, profile, read the
reference or the op's source, submit. Each of compile/test/time/profile is one evaluation of the
Search's budget (the Engine's own work, in a Worker: never in this process), refused with the
reason once the budget is spent. A source is passed whole (`source`) or as SEARCH/REPLACE blocks
(`patch`) against the session's working source, which starts as the lineage's current source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from kernel_lsp.model import Candidate, Evaluation, Task

from .budget import Budget
from .context import op_source
from .patches import ParseError, apply_patches, parse_patches
from .prompts import describe_evaluation, describe_profile, describe_resources, numbered

_SRC = {"source": {"type": "string", "description": "the whole new file"},
        "patch": {"type": "string", "description": "SEARCH/REPLACE blocks against your working source"}}


def _fn(name: str, description: str, props: dict[str, Any] | None = None,
        required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props or {}, "required": required or []}}}


TOOL_SPECS: list[dict[str, Any]] = [
    _fn("compile", "Build the source; returns the compiler's diagnostics with the lines they cite, or "
        "the kernels' registers, shared memory, spills and occupancy. One evaluation.", _SRC),
    _fn("test", "Build and verify against the reference on fresh random inputs; returns the verdict "
        "with its evidence (max error, where). One evaluation.", _SRC),
    _fn("time", "Build, verify and time; returns the median time with its spread and the speedup over "
        "the start, eager and torch.compile. One evaluation.", _SRC),
    _fn("profile", "Profile the source with Nsight Compute; per-kernel facts, hottest first. One "
        "evaluation.", _SRC),
    _fn("read_reference", "The reference Task (KernelBench format): the ground truth."),
    _fn("read_op_source", "The op's own class and helpers from the user's model file (this Task is one "
        "op of a whole model)."),
    _fn("submit", "Hand in the version to keep; the Search re-verifies and times it. Ends this turn.",
        {**_SRC, "note": {"type": "string", "description": "one line: what this version changes"}},
        ["note"]),
]



def tool_specs(task: Task) -> list[dict[str, Any]]:
    """The tools that mean something for this Task: `read_op_source` only for an op Task of the
    whole-model flow (context.op_source finds the op's class in the user's file)."""
    has_op = op_source(task) is not None
    return [s for s in TOOL_SPECS if s["function"]["name"] != "read_op_source" or has_op]


Evaluate = Callable[[Candidate, tuple[str, ...]], Awaitable[Evaluation]]
Profile = Callable[[Candidate], Awaitable[dict[str, Any] | None]]

CHECKS = {"compile": ("compile",), "test": ("compile", "verify"), "time": ("compile", "verify", "bench")}
# Every tool a model may name; any other name is refused before its arguments touch the source.
TOOL_NAMES = ("read_reference", "read_op_source", "submit", "profile", *CHECKS)


@dataclass
class Toolbox:
    """What the Search lends the model: its engine (through `evaluate`/`profile`), its budget."""

    task: Task
    evaluate: Evaluate
    profile: Profile | None
    budget: Budget
    start_evaluation: Evaluation | None = None
    specs: list[dict[str, Any]] = field(default_factory=lambda: list(TOOL_SPECS))
    seed_evaluation: Evaluation | None = None   # the torch.compile seed's, when the Search has one

    def offers(self, name: str) -> bool:
        return any(s["function"]["name"] == name for s in self.specs)

    def session(self, parent: Candidate) -> "ToolSession":
        return ToolSession(self, parent)


class ToolSession:
    """One proposal's tool calls: the working source, the last version that passed, the submit."""

    def __init__(self, box: Toolbox, parent: Candidate) -> None:
        self.box = box
        self.parent = parent
        self.working = parent.source
        self.passed: str | None = None          # the last source `test`/`time` found correct
        self.submitted: Candidate | None = None
        self.note = ""
        self.calls: list[str] = []

    def _source(self, args: dict[str, Any]) -> str:
        if isinstance(args.get("source"), str) and args["source"].strip():
            return args["source"] if args["source"].endswith("\n") else args["source"] + "\n"
        if isinstance(args.get("patch"), str) and args["patch"].strip():
            blocks = parse_patches(args["patch"])
            if not blocks:
                raise ParseError("malformed SEARCH/REPLACE block (needs SEARCH, =======, REPLACE lines)",
                                 why="malformed", patch=args["patch"][:2000])
            return apply_patches(self.working, blocks)
        return self.working

    def _candidate(self, source: str) -> Candidate:
        return Candidate(source=source, kind=self.parent.kind, origin="llm", parent=self.parent.id,
                         note=self.note or "tool")

    async def call(self, name: str, arguments: str | dict[str, Any] | None) -> str:
        """The tool's answer as text for the model; never raises for a bad call."""
        self.calls.append(name)
        try:
            args = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else (arguments or {})
        except json.JSONDecodeError as e:
            return f"error: the arguments are not JSON ({e.msg} at char {e.pos}); nothing was run"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object; nothing was run"
        if name in TOOL_NAMES and not self.box.offers(name):
            return f"error: the tool {name!r} is not offered for this Task; the tools are " + ", ".join(
                s["function"]["name"] for s in self.box.specs)
        if name not in TOOL_NAMES:
            # before anything is applied: a call to a tool that does not exist changes nothing
            return f"error: no tool named {name!r}; the tools are " + ", ".join(
                s["function"]["name"] for s in self.box.specs)
        if name == "read_reference":
            return "```python\n" + self.box.task.reference_source + "\n```"
        if name == "read_op_source":
            op = op_source(self.box.task)
            return ("```python\n" + op + "\n```") if op else "this Task is not an op of a whole model: no op source"
        try:
            source = self._source(args)
        except ParseError as e:
            tail = f"\nThe patch block that failed, whole:\n```\n{e.patch}\n```" if e.patch else ""
            return (f"error: your patch did not apply ({e.why}): {e}{tail}\nYour working source is unchanged:\n"
                    f"```\n{numbered(self.working)}\n```")
        self.working = source
        if name == "submit":
            self.note = str(args.get("note") or "")[:240]
            if source == self.parent.source:
                return "error: this is the current source unchanged; change something before you submit"
            self.submitted = self._candidate(source)
            return "submitted; the Search verifies and times it and tells you the result in the next message"
        left = self.box.budget.evaluations_left()
        if left is not None and left <= 0:
            return "error: the Search's evaluation budget is spent; submit your best version now"
        self.box.budget.used_evaluations += 1
        cand = self._candidate(source)
        if name == "profile":
            if self.box.profile is None:
                return "error: profiling is off for this Search"
            prof = await self.box.profile(cand)
            return describe_profile(prof) if prof else "the profiler gave nothing for this source (see the logs)"
        ev = await self.box.evaluate(cand, CHECKS[name])
        if ev.verdict == "correct" and name in ("test", "time"):
            self.passed = source
        head = f"{name} of your working source ({len(source.splitlines())} lines):\n"
        text = describe_evaluation(ev, source=source, start=self.box.start_evaluation)
        if name == "compile" and ev.compile is not None and ev.compile.ok:
            text = "built" + ("\n" + "\n".join(describe_resources(r) for r in ev.compile.resources[:6])
                              if ev.compile.resources else "")
        if name == "time" and ev.time is not None and self.box.start_evaluation is not None \
                and self.box.start_evaluation.time is not None and ev.time.median_ms > 0:
            text += f"\n{self.box.start_evaluation.time.median_ms / ev.time.median_ms:.2f}x vs the start"
            seed = self.box.seed_evaluation
            if seed is not None and seed.time is not None:
                text += f", {seed.time.median_ms / ev.time.median_ms:.2f}x vs the seed (it must beat both)"
        return head + text
