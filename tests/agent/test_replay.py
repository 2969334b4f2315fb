"""benchmarks/agent_replay.py's episodes play out as scripted (over the fake engine here; the
real Engine on the GPU): the broken try, the patch sent back, the fix, the faster version,
and the same through tools."""

import sys
from pathlib import Path

import pytest

import openai  # noqa: F401,E402  (a dependency of the project: missing is a failure, not a skip)

from kernel_lsp.model import CompileResult, Diagnostic, Evaluation, Span
from kernel_lsp.store import Store

from .fakes import FakeEngine, timing

sys.path.insert(0, str(Path(__file__).parents[2]))
import benchmarks.agent_replay as replay  # noqa: E402


class SimEngine(FakeEngine):
    """Compiles unless `blockDimx` is in the source; the slow start takes 2 ms, the rest 0.06."""

    async def device_info(self):
        return {"name": "NVIDIA H200", "capability": [9, 0], "sm_count": 132, "cuda": True}

    async def evaluate(self, task, candidate, checks=(), progress=None, timeout=None, options=None):
        self.calls.append(tuple(checks))
        if "blockDimx" in candidate.source:
            return Evaluation(task=task.name, candidate=candidate.id, verdict="compile_error", correct=None,
                              compile=CompileResult(ok=False, log="error", diagnostics=[
                                  Diagnostic(Span(7, 0, 7, 1), "error", 'identifier "blockDimx" is undefined')]))
        if tuple(checks) == ("compile",):
            return Evaluation(task=task.name, candidate=candidate.id, verdict="not_run", compile=CompileResult(ok=True))
        ms = 2.0 if "slow start" in candidate.source else 0.06
        return Evaluation(task=task.name, candidate=candidate.id, verdict="correct", correct=True, time=timing(ms),
                          eager=timing(0.058), compiled=timing(0.057))


@pytest.mark.parametrize("protocol, first_good_step", [("text", 3), ("tools", 5)])
async def test_replay_episode(tmp_path, protocol, first_good_step):
    row = await replay.episode(SimEngine(), Store(tmp_path / "s.sqlite"), replay.TASKS / "relu.cu", protocol, True)
    assert row["outcome"] == "improved" and row["speedup"] > 30
    assert row["first_good"]["steps"] == first_good_step
    assert row["prompt_tokens_per_step"] > 0 and row["outside_model_per_step_s"] >= 0
    if protocol == "text":
        assert any("sent back to the model" in f and "not found" in f for f in row["failed_steps"])
    else:
        assert row["tool_steps"] == [["compile"], ["compile"], ["compile", "verify"], ["compile", "verify", "bench"]]


def test_markdown_says_what_ran():
    rows = [{"task": "relu", "protocol": "text", "outcome": "improved", "speedup": 2.0, "speedup_eager": None,
             "speedup_compile": 1.5, "steps": 4, "first_good": None, "outside_model_per_step_s": 1.2,
             "prompt_tokens_per_step": 100, "completion_tokens_per_step": 10, "evaluations": 5, "reason": "r"}]
    text = replay.markdown(rows, {"when": "now", "device": "CPU (no GPU)", "note": "No CUDA GPU here"})
    assert "| relu | text | improved | 2.00x / n/a / 1.50x | 4 | n/a |" in text and "No CUDA GPU here" in text


@pytest.mark.gpu
@pytest.mark.parametrize("protocol", ["text", "tools"])
def test_replay_on_the_gpu(tmp_path, protocol):
    """The same episodes through the real Engine on a GPU: a correct, faster .cu kernel."""
    import asyncio

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    from kernel_lsp.engine import Engine

    async def go():
        async with Engine(timeout=300) as engine:
            return await replay.episode(engine, Store(tmp_path / "s.sqlite"), replay.TASKS / "relu.cu", protocol, True)

    row = asyncio.run(go())
    assert row["outcome"] == "improved" and row["speedup"] > 2, row
    assert row["first_good"] is not None
    if protocol == "tools":
        assert ["compile"] in row["tool_steps"] and ["compile", "verify", "bench"] in row["tool_steps"]
