"""The torch.compile seed of an LLM Search (kernel_lsp/agent/seed.py), its policy over the fake
engine (tests/agent/fakes.py reads `# ms:` / `# verdict:` lines; `# ms@2:` is a re-timing) with
the LLM behind a real HTTP server and the real `openai` client; the setting; and the production
provider turning a recorded Inductor module (tests/data/inductor) into the seed through the
real writer. The seed through the real Engine: test_seed_e2e.py."""

import asyncio

import pytest

import openai  # noqa: F401  (a dependency of the project: missing is a failure, not a skip)

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.llm import LLMConfig, LLMProposer
from kernel_lsp.agent.search import Search, SearchOptions
from kernel_lsp.agent.seed import NO_GPU, inductor_seed, provider_for
from kernel_lsp.agent.tuner import TunerProposer
from kernel_lsp.config import Settings, SettingsError
from kernel_lsp.model import Candidate, Task

from tests.nollm.fixtures import load

from .fakes import FakeEngine
from .openai_server import start

TASK = Task(name="fake", reference_path="fake.py", reference_source="class Model:\n    pass\n")
START = Candidate(source="import torch\nclass ModelNew:\n    pass\n# ms: 10\n# compiled: 4\n", kind="python")
LABEL = "Triton kernels generated from torch.compile (default): 2 Triton kernels"
SEED_SRC = "import torch\nclass ModelNew:\n    SEED_KERNELS = 2\n# ms: 5\n"


def seed_of(source=SEED_SRC, note=LABEL):
    calls = []

    async def provider(engine, task, start_cand, device):
        calls.append((task.name, start_cand.id))
        return Candidate(source=source, kind="python", origin="tuner", note=note), ""

    provider.calls = calls
    return provider


def patch(old, new):
    return f"Plan: one change.\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n"


async def search(server, seed, engine=None, budget=None, **opts):
    proposer = LLMProposer(LLMConfig(model="m", base_url=server.base_url, api_key="sk-x", tools="off",
                                     client_max_retries=0, backoff=0.01))
    s = Search(engine or FakeEngine(), None, TASK, START, proposer,
               SearchOptions(budget=budget or Budget(proposals=1), children=1, near_duplicates=False,
                             seed=seed, **opts))
    try:
        return s, await s.run()
    finally:
        await proposer.aclose()


def opening(server, i=0):
    return [m["content"] for m in server.requests[i]["body"]["messages"] if m["role"] == "user"][0]


async def test_the_seed_reaches_the_prompt_and_a_patch_faster_than_it_wins():
    with start([patch("# ms: 5", "# ms: 4")]) as server:
        s, result = await search(server, seed_of())
    text = opening(server)
    # The lineage starts from the seed: its source, its label, its numbers against both baselines.
    assert "SEED_KERNELS = 2" in text and "Current source (the seed)" in text
    assert f"The current source is the seed: {LABEL}" in text
    assert "2.00x vs the user's starting source" in text and "2.00x vs PyTorch eager" in text
    assert "0.80x vs torch.compile" in text  # the start's torch.compile baseline: 4 ms
    assert f"- the seed ({LABEL}): 5.0000 ms" in text
    # The patch applied to the seed's text (its SEARCH line exists only there), was evaluated,
    # and won against both: 2.5x the start, 1.25x the seed, re-timed in the confirmation.
    assert result.improved and result.confirmed and "# ms: 4" in result.best.source
    assert result.best.parent == s.seed.id and result.speedup == pytest.approx(2.5)
    assert result.seed["status"] == "used" and result.seed["vs_seed"] == pytest.approx(1.25)
    assert result.seed["speedup"] == pytest.approx(2.0) and not result.seed["offered"]
    assert any(st["kind"] == "seed" and "1.250x vs the seed" in st["reason"] for st in s.steps)
    rows = {r["candidate"]: r for r in result.ranking}
    assert rows[s.seed.id]["seed"] and rows[s.seed.id]["origin"] == "seed"


async def test_a_proposal_slower_than_the_seed_is_never_offered():
    # Faster than the start in its first run (4 ms, ranked first), 6 ms when re-timed: still
    # faster than the start (1.67x), slower than the seed (5 ms). The seed is what is offered.
    with start([patch("# ms: 5", "# ms: 4\n# ms@2: 6")]) as server:
        s, result = await search(server, seed_of())
    assert result.improved and result.best.id == s.seed.id and result.best.origin == "seed"
    assert result.speedup == pytest.approx(2.0) and result.seed["offered"]
    judged = [st["reason"] for st in s.steps if st["kind"] == "seed" and st["failed"]]
    assert judged and "the seed is offered instead" in judged[0] and "0.83x the seed" in judged[0]


async def test_a_slower_child_and_no_confirmation_still_ranks_the_seed_first():
    with start([patch("# ms: 5", "# ms: 7")]) as server:
        s, result = await search(server, seed_of(), confirm=False)
    assert result.improved and result.best.id == s.seed.id and result.seed["offered"]
    assert [r["candidate"] for r in result.ranking][:2] == [s.seed.id, s.nodes[result.ranking[1]["candidate"]].id]
    assert result.ranking[1]["time_ms"] == 7.0


async def test_a_wrong_seed_is_said_and_the_search_goes_on_from_the_start():
    with start([patch("# ms: 10", "# ms: 8")]) as server:
        s, result = await search(server, seed_of("import torch\nclass ModelNew:\n    X = 1\n# verdict: mismatch\n"))
    assert result.seed["status"] == "wrong" and "mismatch" in result.seed["reason"]
    assert result.seed["line"].startswith("the torch.compile seed did not pass verification: mismatch")
    assert "Search started from your code alone" in result.seed["line"]
    text = opening(server)
    assert "the seed" not in text and "X = 1" not in text  # the start's lineage, no seed in the prompt
    assert result.improved and result.best.parent == START.id and result.seed["vs_seed"] is None
    assert any(st["kind"] == "seed" and st["failed"] for st in result.failed_steps)


async def test_no_file_and_a_broken_provider_are_one_line_each():
    async def none(engine, task, start_cand, device):
        return None, "graph break:\n  data-dependent shape"

    async def broken(engine, task, start_cand, device):
        raise RuntimeError("writer bug")

    for provider, words in ((none, "could not be generated: graph break: data-dependent shape"),
                            (broken, "could not be generated: RuntimeError: writer bug")):
        with start([patch("# ms: 10", "# ms: 8")]) as server:
            s, result = await search(server, provider)
        assert words in result.seed["line"] and "\n" not in result.seed["line"]
        assert result.improved and result.seed["status"] == "not_generated"


class CPUEngine(FakeEngine):
    async def device_info(self):
        return {"name": "cpu", "cuda": False}

    async def request(self, *a, **kw):
        raise AssertionError("no torch.compile recording without a GPU")


async def test_the_production_provider_skips_at_once_without_a_gpu():
    with start([patch("# ms: 10", "# ms: 8")]) as server:
        s, result = await search(server, inductor_seed, engine=CPUEngine())
    assert result.seed["status"] == "skipped" and NO_GPU in result.seed["line"]
    assert not [st for st in result.failed_steps if st["kind"] == "seed"]  # no GPU here is not a failure
    assert result.improved


class RecordingEngine(FakeEngine):
    """Answers the Worker's `inductor_code` request with what the H200 recorded for relu."""

    def __init__(self):
        super().__init__()
        ref, code, args = load("relu")
        self.reference = ref
        self.requests = []
        self.answer = {"torch": "2.11.0+cu130", "triton": "3.6.0", "device": "NVIDIA H200",
                       "modes": {"default": {"codes": [code], "args": args}}}

    async def request(self, op, params, timeout=None, warm=False):
        self.requests.append((op, params))
        return self.answer


def test_the_production_provider_writes_the_seed_from_a_recording():
    eng = RecordingEngine()
    task = Task(name="relu", reference_path="relu.py", reference_source=eng.reference)
    cand, why = asyncio.run(inductor_seed(eng, task, START, {"cuda": True}))
    assert why == "" and cand is not None and cand.origin == "seed"
    # One torch.compile: the default mode only (max-autotune takes minutes; the no-LLM path has it).
    assert eng.requests == [("inductor_code", {"reference_source": eng.reference, "modes": ["default"]})]
    assert "@triton.jit\ndef triton_poi_fused_relu_0(" in cand.source and "class ModelNew(Model):" in cand.source
    assert cand.note == "Triton kernels generated from torch.compile (default): 1 Triton kernel"
    eng.answer = {"why": "torch.compile needs a CUDA GPU here"}
    assert asyncio.run(inductor_seed(eng, task, START, {"cuda": True})) == (None, "torch.compile needs a CUDA GPU here")


def test_the_setting():
    llm = object.__new__(LLMProposer)
    llm.name = "llm"
    assert Settings().agent_seed == "inductor"
    assert provider_for(Settings().agent_seed, llm) is inductor_seed
    off = Settings().merged({"agent": {"seed": "none"}})  # the editor's agent.seed
    assert off.agent_seed == "none" and provider_for(off.agent_seed, llm) is None
    assert Settings().merged({"agent_seed": "none"}).agent_seed == "none"  # [tool.kernel-lsp]
    assert provider_for("inductor", TunerProposer()) is None  # the no-LLM path starts there anyway
    with pytest.raises(SettingsError, match="agent.seed' accepts none, inductor"):
        Settings().merged({"agent": {"seed": "max"}})


async def test_the_setting_decides_whether_the_search_seeds():
    """The setting as the CLI and the server apply it (provider_for on the Search's own LLM
    proposer): "none" gives no seed and no line; "inductor" asks the engine for torch.compile's
    code (this fake engine has none to give: one line says so)."""
    got = {}
    for setting in ("none", "inductor"):
        with start([patch("# ms: 10", "# ms: 8")]) as server:
            proposer = LLMProposer(LLMConfig(model="m", base_url=server.base_url, api_key="sk-x", tools="off",
                                             client_max_retries=0))
            seed = provider_for(Settings().merged({"agent": {"seed": setting}}).agent_seed, proposer)
            s = Search(FakeEngine(), None, TASK, START, proposer,
                       SearchOptions(budget=Budget(proposals=1), children=1, near_duplicates=False, seed=seed))
            result = await s.run()
            await proposer.aclose()
        got[setting] = (result, opening(server))
    off, on = got["none"][0], got["inductor"][0]
    assert off.seed is None and not [st for st in off.steps if st["kind"] == "seed"]
    assert "seed" not in got["none"][1] and off.improved and off.best.parent == START.id
    assert on.seed["status"] == "not_generated" and "recording torch.compile's code failed" in on.seed["reason"]
