"""The whole-model flow on a real model (issue 11): a minGPT block (benchmarks/models/mingpt_block.py,
KernelBench level-3 style) is profiled on the GPU, a Task is extracted per hot op, each op's
Search gets its answers from a scripted OpenAI-compatible endpoint (a real HTTP server, the real
openai client): a fused CUDA kernel (load_inline) for NewGELU and a scaled_dot_product_attention
rewrite of the attention (benchmarks/models/mingpt_answers.py); every other op gets no idea.
The winners are put back behind guards and the block is verified end to end and timed against
eager and torch.compile.

Reports each op's share of forward, its speedup alone (vs eager and vs torch.compile of the op),
its kind (custom kernel / PyTorch rewrite), whether it stayed in the model, and the end-to-end
speedups with their spread.

Run on the GPU machine: `python benchmarks/whole_model.py [--budget N] [--min-share F] [--out-dir DIR]`.
`--smoke` runs a tiny block on whatever device there is without baselines (a check of the
flow, not a measurement; its results go to --out-dir only when given).
Writes whole_model.json and whole_model.md under --out-dir (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "models"))

from kernel_lsp.agent.llm import LLMConfig, LLMProposer  # noqa: E402
from kernel_lsp.agent.search import SearchOptions  # noqa: E402
from kernel_lsp.agent.whole_model import WholeModelOptions, optimize_model, write_integrated  # noqa: E402
from kernel_lsp.engine import Engine  # noqa: E402
from kernel_lsp.store import Store  # noqa: E402
from mingpt_answers import ANSWERS, fenced  # noqa: E402
from tests.agent.openai_server import start  # noqa: E402

MODEL = ROOT / "benchmarks" / "models" / "mingpt_block.py"
SMOKE_SIZES = {"BATCH": 2, "SEQ": 16, "N_EMBD": 64, "N_HEAD": 4}


def model_text(smoke: bool) -> str:
    text = MODEL.read_text()
    if smoke:
        text = re.sub(r"^(BATCH, SEQ, N_EMBD, N_HEAD = ).*$",
                      lambda m: m.group(1) + ", ".join(str(v) for v in SMOKE_SIZES.values()), text, flags=re.M)
    return text


async def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="klsp-whole-model-"))
    model = work / "mingpt_block.py"
    model.write_text(model_text(args.smoke))
    servers = {}

    def make_proposer(op):
        server = start([fenced(note, src) for note, src in ANSWERS.get(op.name, [])], default="")
        servers[op.name] = server
        return LLMProposer(LLMConfig(model="scripted", base_url=server.base_url, api_key="scripted",
                                     client_max_retries=0, backoff=0.05))

    events: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        events.append((round(time.monotonic() - t0, 1), msg))
        print(f"[{time.monotonic() - t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    baselines = {} if not args.smoke else {"baselines": False}
    search = SearchOptions(children=1, profile=False, repair_rounds=1, eval_timeout=args.timeout)
    if args.smoke:
        search.start_engine_options = {"baselines": False}
    opts = WholeModelOptions(min_share=args.min_share, budget=args.budget, patience=1, search=search,
                             end_to_end_options=baselines or None, eval_timeout=args.timeout)
    # The smoke run is for a shared CPU: no cache probe (its 3x rule trips on scheduler noise there).
    engine = Engine(timeout=args.timeout, options={"cache_probe": False, "bench_seconds": 0.3} if args.smoke else None)
    store = Store(work / ".kernel-lsp" / "store.sqlite")
    try:
        result = await optimize_model(str(model), engine, store, make_proposer, opts, root=str(work),
                                      progress=progress)
        info = await engine.device_info()
    finally:
        await engine.aclose()
        for s in servers.values():
            s.close()
    out = work / "mingpt_block_optimized.py"
    if result.improved:
        write_integrated(result, str(out))
    doc = result.to_dict()
    doc.update({
        "benchmark": "whole_model", "smoke": bool(args.smoke),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/whole_model.py " + " ".join(sys.argv[1:]),
        "wall_seconds": round(time.monotonic() - t0, 1), "device_info": info, "workspace": str(work),
        "integrated_source": out.read_text() if out.exists() else None, "events": events,
        "scripted_answers": {k: [note for note, _ in v] for k, v in ANSWERS.items()},
    })
    return doc


def markdown(doc: dict) -> str:
    dev = doc.get("device_info") or {}
    lines = [
        "# Whole model: minGPT block" + (" (smoke run, not a measurement)" if doc.get("smoke") else ""),
        "",
        f"`{doc['command']}` on {dev.get('name', doc.get('device'))} ({doc['date']}), {doc['wall_seconds']} s.",
        f"Forward {doc['total_ms']:.3f} ms ({doc['time']} time, profiled); the scripted endpoint answered: "
        + "; ".join(f"{k}: {', '.join(v)}" for k, v in doc["scripted_answers"].items()) + ".",
        "",
        "| op | class | share | proposals | speedup alone | vs torch.compile (op) | kind | in model | note |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for op in doc["ops"]:
        lines.append(
            f"| {op['name']} | {op['class']} | {100 * op['share']:.1f}% | {op['budget']} | "
            + (f"{op['speedup']:.2f}x (spread {op['spread_pct']:.1f}%)" if op["speedup"] and op.get("spread_pct")
               is not None else f"{op['speedup']:.2f}x" if op["speedup"] else "-") + " | "
            + (f"{op['speedup_compile']:.2f}x" if op.get("speedup_compile") else "-")
            + f" | {op['label'] or '-'} | {'yes' if op['kept'] else 'no'} | {(op['reason'] or '')[:90]} |")
    e = doc.get("end_to_end")
    lines.append("")
    if e:
        lines.append(
            f"End to end: {'correct' if e['correct'] else 'NOT counted: ' + e['verdict']}"
            + (f" ({', '.join(e.get('bad_flags') or [])})" if e.get("bad_flags") else "") + "; integrated "
            + (f"{e['time_ms']:.4f} ms" if e.get("time_ms") else "-")
            + (f" (spread {e['spread_pct']:.1f}%)" if e.get("spread_pct") is not None else "")
            + ", eager " + (f"{e['eager_ms']:.4f} ms" if e.get("eager_ms") else "-")
            + ", torch.compile " + (f"{e['compile_ms']:.4f} ms" if e.get("compile_ms") else "not timed")
            + ": " + (f"**{e['speedup_eager']:.2f}x** vs eager" if e.get("speedup_eager") else "-")
            + (f", **{e['speedup_compile']:.2f}x** vs torch.compile" if e.get("speedup_compile") else "") + ".")
    lines += ["", f"Result: {doc['reason']}.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=8, help="proposals over all ops (default 8)")
    parser.add_argument("--min-share", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=400.0, help="per evaluation (a cold load_inline is ~60 s)")
    parser.add_argument("--smoke", action="store_true", help="a tiny block, no baselines: a check of the flow")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args()
    doc = asyncio.run(run(args))
    md = markdown(doc)
    print(md)
    out_dir = Path(args.out_dir) if args.out_dir else (None if args.smoke else ROOT / "benchmarks" / "results")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "whole_model.json").write_text(json.dumps(doc, indent=2, default=str))
        (out_dir / "whole_model.md").write_text(md)
        print(f"wrote {out_dir / 'whole_model.json'} and {out_dir / 'whole_model.md'}", file=sys.stderr)
    return 0 if doc.get("end_to_end") and doc["end_to_end"].get("correct") else 1


if __name__ == "__main__":
    sys.exit(main())
