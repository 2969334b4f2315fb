"""Searches on a real GPU with the CUDA examples (run on the device machine):

    python -m pytest -q -m gpu tests/agent/test_gpu.py

The tuner tests need only torch; the LLM test needs the `openai` package too. Plain
functions around asyncio.run: the device machine may have no pytest-asyncio.
"""

import asyncio
from pathlib import Path

import pytest

from kernel_lsp.agent.budget import Budget
from kernel_lsp.agent.search import Search, SearchOptions
from kernel_lsp.agent.tuner import TunerProposer
from kernel_lsp.store import Store

from .openai_server import start

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).parents[2] / "examples"


def example(name):
    from kernel_lsp.engine import find_task

    path = EXAMPLES / f"{name}.cu"
    assert path.exists(), f"{path} is missing"
    return find_task(str(path))


async def tune(name, tmp_path, proposals=6):
    from kernel_lsp.engine import Engine

    task, cand = example(name)
    store = Store(tmp_path / "store.sqlite")
    events = []
    async with Engine(timeout=180) as engine:
        result = await Search(engine, store, task, cand, TunerProposer(),
                              SearchOptions(budget=Budget(proposals=proposals, patience=2), children=2)
                              ).run(events.append)
    return result, store, events


@pytest.mark.parametrize("name, knob", [("softmax", "BLOCK_SIZE"), ("bias_gelu", None), ("matmul", "TILE")])
def test_tuner_speeds_up_examples(name, knob, tmp_path):
    result, store, events = asyncio.run(tune(name, tmp_path))
    assert result.improved and result.confirmed, result.reason
    assert result.speedup > 1.3
    if knob:
        assert result.best.note.startswith(knob)
    assert result.best_evaluation.verdict == "correct" and "not_counted" not in result.best_evaluation.flags
    # A .cu kernel: a custom-kernel result, against both baselines, from the confirmation run.
    assert result.custom_kernel is True and result.label == "custom kernel" and result.outcome == "improved"
    assert result.measurement == "confirmation" and result.speedup_eager is not None
    assert result.eager_ms is not None and (result.speedup_compile is None) == (result.compile_ms is None)
    assert result.ranking[0]["speedup"] == result.speedup and result.ranking[0]["winner"]
    row = store.search(result.search_id)
    assert row["state"] == "done" and row["best"] == result.best.id
    assert all(n["evaluation"] for n in row["nodes"])  # every proposed variant was evaluated
    assert result.start_evaluation.device and "H" in str(result.start_evaluation.device.get("name", ""))


def test_llm_repairs_then_tunes_softmax_on_gpu(tmp_path):
    import openai  # noqa: F401  (a dependency of the project: missing is a failure, not a skip)
    asyncio.run(_llm_repairs_then_tunes_softmax(tmp_path))


async def _llm_repairs_then_tunes_softmax(tmp_path):
    from kernel_lsp.agent.llm import LLMConfig, LLMProposer
    from kernel_lsp.engine import Engine

    task, cand = example("softmax")
    broken = ("Use 256 threads.\n<<<<<<< SEARCH\n#define BLOCK_SIZE 32  // correct but slow: 256 keeps far more "
              "loads in flight\n=======\n#define BLOCK_SIZE 256\nthis does not compile;\n>>>>>>> REPLACE\n")
    fix = "Remove the stray line.\n<<<<<<< SEARCH\nthis does not compile;\n=======\n>>>>>>> REPLACE\n"
    server = start([broken, fix], default="")
    store = Store(tmp_path / "store.sqlite")
    proposer = LLMProposer(LLMConfig(model="local", base_url=server.base_url, api_key="sk-gpu-test",
                                     client_max_retries=0, backoff=0.05))
    try:
        async with Engine(timeout=180) as engine:
            result = await Search(engine, store, task, cand, proposer,
                                  SearchOptions(budget=Budget(proposals=3), children=1,
                                                profile_after_depth=1)).run()
    finally:
        await proposer.aclose()
        server.close()
    assert result.improved and result.confirmed, result.reason
    assert "#define BLOCK_SIZE 256" in result.best.source and result.best.origin == "repair"
    prompts = [r["body"]["messages"][-1]["content"] for r in server.requests]  # each request's newest turn
    assert "FAILS (compile_error)" in prompts[1] and "compiler messages:" in prompts[1]
    assert "NVIDIA" in prompts[0] and "sm_90a" in prompts[0]  # the GPU's facts from engine.device_info()
    # The third request optimizes the correct repaired node (depth 2): profiler facts included
    # (the empty answers after it are sent back, so more requests may follow).
    assert len(prompts) >= 3 and "Profiler facts" in prompts[2]


SEEDED_MODULE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return F.gelu(x + self.bias) * 0.5


def get_inputs():
    return [torch.randn(4096, 2048, device="cuda")]


def get_init_inputs():
    return [2048]
'''


def _patch_the_seed(body):
    """The scripted model's answer: a launch change in the seed's CONFIGS, read off the prompt it
    was sent (the seed's text is known only once torch.compile wrote it on this GPU)."""
    import re

    prompt = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
    if "The current source is the seed" not in prompt:
        return "No idea for this one."
    m = re.search(r"^\s*\d+\| (    '\w+': dict\([^\n]*num_warps=(\d+)[^\n]*\),)$", prompt, re.M)
    if not m:
        return "No CONFIGS line found."
    line, warps = m.group(1), m.group(2)
    other = line.replace(f"num_warps={warps}", f"num_warps={8 if warps != '8' else 4}")
    return f"Plan: other warps.\n<<<<<<< SEARCH\n{line}\n=======\n{other}\n>>>>>>> REPLACE\n"


def test_llm_search_seeded_by_torch_compile(tmp_path):
    """`optimize --seed inductor` with an LLM on a PyTorch module: the Worker writes torch.compile's
    kernels as the seed, the engine verifies and times it, the prompt shows it, the scripted
    model's patch on its CONFIGS is judged against the seed and the start."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "plain.py").write_text(SEEDED_MODULE)
    root = Path(__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_LSP_MODEL"):
        env.pop(var, None)
    server = start([_patch_the_seed], default="No more ideas.")
    try:
        r = subprocess.run([sys.executable, "-m", "kernel_lsp.cli", "optimize", "plain.py", "--model", "local",
                            "--base-url", server.base_url, "--seed", "inductor", "--budget", "1", "--json"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=480)
    finally:
        server.close()
    assert r.returncode in (0, 1), r.stderr[-3000:]
    doc = json.loads(r.stdout)
    seed = doc["seed"]
    assert seed["status"] == "used", seed
    assert seed["label"].startswith("Triton kernels generated from torch.compile (default)")
    assert seed["speedup_eager"] and seed["speedup_compile"] and seed["time_ms"]
    prompt = [m["content"] for m in server.requests[0]["body"]["messages"] if m["role"] == "user"][0]
    assert "The current source is the seed" in prompt and "@triton.jit" in prompt
    child = [e for e in doc["evaluations"] if e["candidate"] not in (doc["start"], seed["candidate"])]
    assert child and child[0]["verdict"] == "correct", doc["failed_steps"]
    if doc["improved"] and doc["best"] != seed["candidate"]:
        assert seed["vs_seed"] and seed["vs_seed"] > 1.0  # an improvement over the seed, said as such
    if doc["improved"] and doc["best"] == seed["candidate"]:
        assert seed["offered"]
    print(json.dumps({"seed": seed, "best": doc["best"], "speedup": doc["speedup"], "reason": doc["reason"]}))
