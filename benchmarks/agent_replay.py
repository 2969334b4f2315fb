"""Scripted multi-step agent episodes on the project's KernelBench tasks, through the real
Engine, the real Store, the real `openai` client and a local OpenAI-compatible server whose
answers are scripted (tests/agent/openai_server.py): what a Search costs outside the model.

Each episode starts from a deliberately slow version of benchmarks/tasks/<task>.cu (64 threads
a block, at most 66 blocks: the grid-stride loop still covers every element) and replays:

  text protocol:  1. a faster rewrite with a typo (`blockDimx`): a compile error;
                  2. a patch whose SEARCH text is not in the source: sent back whole, with why;
                  3. the right patch: correct and faster;
                  4. another variant (512 threads a block) from there.
  tool calling:   compile(the typo) -> the model reads the error -> compile(patch) -> test ->
                  time -> submit.

Reported per episode: model requests (steps) and seconds until the first correct, faster
candidate; seconds per step spent outside the model (evaluations and the agent's own work:
the scripted model answers at once); tokens per step; the confirmed speedup.

Without a CUDA GPU the timed episodes are skipped (said so) and a compile-only episode runs
per task instead: the typo'd start, a patch that does not apply, the fix; nvcc builds it.

    python benchmarks/agent_replay.py [--tasks relu,gelu_tanh] [--out-dir benchmarks/results]

Writes agent_replay.json and agent_replay.md (agent_replay_cpu.* without a GPU). On the H200:
about 2-4 minutes for the default two tasks (a Worker start, ~6 .cu builds of 2 s, baselines).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

try:
    import openai  # noqa: F401  (the LLM proposer's client: the episodes drive it for real)
except ImportError:
    sys.exit("agent_replay needs the `openai` package (pip install openai): the episodes use the real client")

from kernel_lsp.agent.budget import Budget  # noqa: E402
from kernel_lsp.agent.llm import LLMConfig, LLMProposer  # noqa: E402
from kernel_lsp.agent.search import Search, SearchOptions  # noqa: E402
from kernel_lsp.engine import Engine, find_task  # noqa: E402
from kernel_lsp.model import Candidate  # noqa: E402
from kernel_lsp.store import Store  # noqa: E402
from tests.agent.openai_server import start as start_server  # noqa: E402

TASKS = ROOT / "benchmarks" / "tasks"
FAST_THREADS = "  const int threads = 256;"
FAST_CAP = "  if (blocks > (1LL << 20)) blocks = 1LL << 20;"
INDEX = "blockIdx.x * blockDim.x + threadIdx.x"


def variants(cu: str) -> dict[str, str]:
    assert FAST_THREADS in cu and FAST_CAP in cu and INDEX in cu, "not a generated elementwise .cu"
    slow = cu.replace(FAST_THREADS, "  const int threads = 64;  // slow start").replace(
        FAST_CAP, "  if (blocks > 66) blocks = 66;  // slow start: few blocks")
    return {"slow": slow, "fast": cu, "typo": cu.replace(INDEX, "blockIdx.x * blockDimx + threadIdx.x"),
            "wide": cu.replace(FAST_THREADS, "  const int threads = 512;")}


def patch(old: str, new: str, note: str) -> str:
    return f"{note}\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n"


def text_script(v: dict[str, str]) -> list[Any]:
    typo_line = next(ln for ln in v["typo"].splitlines() if "blockDimx" in ln)
    return [
        "Plan: the start runs 64-thread blocks on 66 SMs' worth of blocks; use 256 threads and enough "
        "blocks to fill the GPU.\n```cuda\n" + v["typo"] + "```\n",
        patch("  for (long long i = blockIdx.x * blockDimx;", "  for (long long i = 0;", "Plan: fix the index."),
        patch(typo_line, typo_line.replace("blockDimx", "blockDim.x"), "Plan: the missing dot in blockDim.x."),
        "Plan: 512-thread blocks.\n```cuda\n" + v["wide"] + "```\n",
    ]


def tool_script(v: dict[str, str]) -> list[Any]:
    typo_line = next(ln for ln in v["typo"].splitlines() if "blockDimx" in ln)
    fix = patch(typo_line, typo_line.replace("blockDimx", "blockDim.x"), "")
    return [
        {"text": "Plan: fill the GPU with 256-thread blocks.", "tool_calls": [{"name": "compile", "arguments": {"source": v["typo"]}}]},
        {"tool_calls": [{"name": "compile", "arguments": {"patch": fix}}]},
        {"tool_calls": [{"name": "test", "arguments": {}}]},
        {"tool_calls": [{"name": "time", "arguments": {}}]},
        {"tool_calls": [{"name": "submit", "arguments": {"note": "256-thread blocks, enough of them"}}]},
    ]


class TimedLLM(LLMProposer):
    """The LLM proposer, with the seconds spent waiting for the model."""

    model_seconds = 0.0
    requests = 0

    async def complete(self, messages, tools=None):  # type: ignore[override]
        t0 = time.monotonic()
        try:
            return await super().complete(messages, tools)
        finally:
            self.model_seconds += time.monotonic() - t0
            self.requests += 1


async def episode(engine: Any, store: Store, task_path: Path, protocol: str, gpu: bool) -> dict[str, Any]:
    task, cand = find_task(str(task_path))
    assert cand is not None
    v = variants(cand.source)
    if gpu:
        start = Candidate(source=v["slow"], kind="cuda")
        script = text_script(v) if protocol == "text" else tool_script(v)
        options = SearchOptions(budget=Budget(proposals=3 if protocol == "text" else 1, evaluations=16, patience=3),
                                children=1, tools=protocol == "tools", directions=False)
    else:  # compile only: the typo'd start is repaired; nvcc is the test
        start = Candidate(source=v["typo"], kind="cuda")
        script = text_script(v)[1:3]
        options = SearchOptions(budget=Budget(proposals=2, evaluations=8), children=1, checks=("compile",),
                                repair_only=True, confirm=False, tools=False, profile=False)
    server = start_server(script, default="No more ideas.")
    proposer = TimedLLM(LLMConfig(model="scripted-replay", base_url=server.base_url, api_key="none",
                                  client_max_retries=0, tools="auto" if protocol == "tools" else "off"))
    first_good: dict[str, Any] = {}
    t0 = time.monotonic()

    def progress(ev: Any) -> None:
        good = ev.kind in ("new_best",) or (not gpu and ev.kind == "evaluated" and ev.verdict not in ("compile_error",))
        if good and not first_good:
            first_good.update(seconds=round(time.monotonic() - t0, 3), steps=proposer.requests,
                              model_seconds=round(proposer.model_seconds, 3))

    search = Search(engine, store, task, start, proposer, options)
    try:
        result = await search.run(progress)
    finally:
        await proposer.aclose()
        server.close()
    wall = time.monotonic() - t0
    steps = max(1, proposer.requests)
    usage = result.usage
    return {
        "task": task.name, "protocol": protocol, "mode": "timed" if gpu else "compile only (no GPU)",
        "outcome": result.outcome, "reason": result.reason, "speedup": result.speedup,
        "speedup_eager": result.speedup_eager, "speedup_compile": result.speedup_compile,
        "steps": proposer.requests, "evaluations": usage.get("evaluations"),
        "first_good": first_good or None, "seconds": round(wall, 3),
        "model_seconds": round(proposer.model_seconds, 3),
        "outside_model_per_step_s": round((wall - proposer.model_seconds) / steps, 3),
        "prompt_tokens_per_step": round(usage.get("prompt_tokens", 0) / steps),
        "completion_tokens_per_step": round(usage.get("completion_tokens", 0) / steps),
        "failed_steps": [s.get("reason", "")[:160] for s in result.failed_steps][:8],
        "tool_steps": [s.get("checks") for s in result.steps if s.get("kind") == "tool"],
    }


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [f"# agent replay ({meta['when']}, {meta['device']})", "", meta["note"], "",
           "| task | protocol | outcome | speedup (start / eager / compile) | steps | steps to first good | "
           "s to first good | s outside model per step | prompt tok/step | completion tok/step | evaluations |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]

    def x(v: Any) -> str:
        return f"{v:.2f}x" if isinstance(v, (int, float)) else "n/a"

    for r in rows:
        fg = r["first_good"] or {}
        out.append(f"| {r['task']} | {r['protocol']} | {r['outcome']} | {x(r['speedup'])} / {x(r['speedup_eager'])} / "
                   f"{x(r['speedup_compile'])} | {r['steps']} | {fg.get('steps', 'n/a')} | {fg.get('seconds', 'n/a')} | "
                   f"{r['outside_model_per_step_s']} | {r['prompt_tokens_per_step']} | "
                   f"{r['completion_tokens_per_step']} | {r['evaluations']} |")
    out += ["", "Reasons:"] + [f"- {r['task']} ({r['protocol']}): {r['reason']}" for r in rows]
    return "\n".join(out) + "\n"


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="relu,gelu_tanh")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    try:
        import torch

        gpu = bool(torch.cuda.is_available())
    except ImportError:
        gpu = False
    note = ("Timed episodes on the GPU: text protocol and tool calling." if gpu else
            "No CUDA GPU here: the timed episodes are skipped; compile-only episodes (the typo'd start, "
            "a patch that does not apply, the fix) ran with the real nvcc instead.")
    print(note, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="klsp-replay-") as tmp:
        engine = Engine(timeout=300)
        store = Store(Path(tmp) / "replay.sqlite")
        try:
            for name in [t.strip() for t in args.tasks.split(",") if t.strip()]:
                for protocol in (("text", "tools") if gpu else ("text",)):
                    row = await episode(engine, store, TASKS / f"{name}.cu", protocol, gpu)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            await engine.aclose()
    meta = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": "GPU" if gpu else "CPU (no GPU)", "note": note}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "agent_replay" if gpu else "agent_replay_cpu"
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "episodes": rows}, indent=1))
    (out / f"{stem}.md").write_text(markdown(rows, meta))
    print(f"wrote {out / (stem + '.md')}")
    bad = [r for r in rows if r["outcome"] not in ("improved",)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
