"""`kernel-lsp bench` of several files builds the next ones in the CPU pool while the GPU evaluates
one (cli/bench.py `_BuildAhead`): which files, when, and that nothing is left running."""

from __future__ import annotations

import asyncio

from kernel_lsp.cli.bench import BUILD_AHEAD, _BuildAhead
from kernel_lsp.model import Candidate, Task

CU = "__global__ void k(float* x) { x[0] = 1.0f; }\n"
OPTS = {"device": "cuda", "seed": 3}
PLAIN = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


class Engine:
    kind = "local"

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.gate = asyncio.Event()

    async def prebuild(self, task: Task, cand: Candidate, options=None, ahead=False):
        # the evaluations' own options: the same build, joined or handed over, not a second one
        assert options == OPTS and ahead
        self.asked.append(task.name)
        await self.gate.wait()  # a build under way until the test lets it finish


def rows(kinds: list[str]) -> list:
    out = []
    for i, kind in enumerate(kinds):
        task = Task(name=f"t{i}", reference_path=f"t{i}.py", reference_source="# reference\n")
        if kind == "bad":
            out.append((f"t{i}.py", None, None, "not a Task"))
            continue
        cand = Candidate(source=CU if kind == "cu" else PLAIN, kind="cuda" if kind == "cu" else "python")
        out.append((f"t{i}", task, cand, ""))
    return out


async def test_the_next_files_that_need_a_build_are_built_while_one_is_evaluated():
    engine = Engine()
    ahead = _BuildAhead.for_run(engine, rows(["cu", "plain", "bad", "cu", "cu", "cu"]), gpu=True, options=OPTS)
    assert ahead is not None and BUILD_AHEAD == 2
    ahead.start(0)  # t0 (its own build: the early build) is evaluated; t3 and t4 build meanwhile
    await asyncio.sleep(0)
    assert engine.asked == ["t3", "t4"]
    ahead.start(1)
    ahead.start(3)  # t3 is evaluated (its build already asked for): t4 goes on, t5 starts
    await asyncio.sleep(0)
    assert engine.asked == ["t3", "t4", "t5"]
    engine.gate.set()
    await ahead.close()
    assert all(job.done() for job in ahead.jobs.values())


async def test_a_run_that_ends_early_leaves_no_build_running():
    engine = Engine()
    ahead = _BuildAhead.for_run(engine, rows(["cu", "cu", "cu"]), gpu=True, options=OPTS)
    ahead.start(0)
    await asyncio.sleep(0)
    await ahead.close()  # the gate never opens: the builds are cancelled, not left behind
    assert all(job.cancelled() for job in ahead.jobs.values())


async def test_no_building_ahead_where_it_cannot_help():
    engine = Engine()
    assert _BuildAhead.for_run(engine, rows(["cu", "cu"]), gpu=False, options=OPTS) is None  # no GPU: the builds are the run
    assert _BuildAhead.for_run(engine, rows(["cu", "plain", "plain"]), gpu=True, options=OPTS) is None  # one build only
    engine.kind = "ray"
    assert _BuildAhead.for_run(engine, rows(["cu", "cu"]), gpu=True, options=OPTS) is None  # a cluster builds on its own
