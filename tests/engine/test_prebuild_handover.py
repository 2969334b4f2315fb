"""A build made ahead in the CPU pool (bench's early build, its next files) is handed to the
evaluation that asks for it with the same options, steps and all, once; a second ask builds
again (a cache hit that says it built nothing). Engine.prebuild's table, with a pool that counts."""

from __future__ import annotations

import asyncio

from kernel_lsp.engine.caller.client import PREBUILT_KEPT, Engine
from kernel_lsp.model import Candidate, CompileResult, Task

TASK = Task(name="t", reference_path="t.py", reference_source="# reference\n")
OPTS = {"arch": "sm_90", "compile_mode": "default"}


class CountingPool:
    def __init__(self) -> None:
        self.builds: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def build(self, kind, source, filename, options=None, timeout=None, readable=None) -> CompileResult:
        self.builds.append(source)
        await self.gate.wait()
        cached = self.builds.count(source) > 1  # the pool's cache: a second build of a source is a hit
        return CompileResult(ok=True, cached=cached, seconds=0.01 if cached else 3.5,
                             steps={} if cached else {"device": 0.8, "link": 0.1})

    async def aclose(self) -> None:
        pass


def _cand(i: int) -> Candidate:
    return Candidate(source=f"__global__ void k{i}(float* x) {{ x[0] = {i}; }}\n", kind="cuda")


async def test_a_build_ahead_is_handed_to_its_evaluation_once_with_its_steps():
    pool = CountingPool()
    engine = Engine(pool=pool)  # type: ignore[arg-type]
    ahead = await engine.prebuild(TASK, _cand(0), OPTS, ahead=True)
    assert ahead.steps
    got = await engine.prebuild(TASK, _cand(0), OPTS)  # the evaluation's own ask
    assert got is ahead and got.steps == {"device": 0.8, "link": 0.1} and len(pool.builds) == 1
    again = await engine.prebuild(TASK, _cand(0), OPTS)  # nothing left to hand over: the pool's hit
    assert again.cached and not again.steps and len(pool.builds) == 2


async def test_other_options_or_a_plain_prebuild_hand_nothing_over():
    pool = CountingPool()
    engine = Engine(pool=pool)  # type: ignore[arg-type]
    await engine.prebuild(TASK, _cand(1), {"arch": "sm_90"}, ahead=True)
    other = await engine.prebuild(TASK, _cand(1), OPTS)  # not the same build request
    assert other.cached and len(pool.builds) == 2
    await engine.prebuild(TASK, _cand(2), OPTS)  # an evaluation's own prebuild keeps nothing
    assert (await engine.prebuild(TASK, _cand(2), OPTS)).cached


async def test_an_evaluation_that_joins_a_build_under_way_takes_it():
    pool = CountingPool()
    pool.gate.clear()
    engine = Engine(pool=pool)  # type: ignore[arg-type]
    ahead = asyncio.ensure_future(engine.prebuild(TASK, _cand(3), OPTS, ahead=True))
    await asyncio.sleep(0)
    joined = asyncio.ensure_future(engine.prebuild(TASK, _cand(3), OPTS))
    await asyncio.sleep(0)
    pool.gate.set()
    assert (await joined).steps and (await ahead) is (await joined) and len(pool.builds) == 1
    assert (await engine.prebuild(TASK, _cand(3), OPTS)).cached  # taken by the join, not kept


async def test_only_the_newest_builds_ahead_are_kept():
    pool = CountingPool()
    engine = Engine(pool=pool)  # type: ignore[arg-type]
    for i in range(PREBUILT_KEPT + 2):
        await engine.prebuild(TASK, _cand(10 + i), OPTS, ahead=True)
    assert (await engine.prebuild(TASK, _cand(10), OPTS)).cached  # the oldest went
    assert not (await engine.prebuild(TASK, _cand(10 + PREBUILT_KEPT + 1), OPTS)).cached
