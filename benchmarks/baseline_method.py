"""Does Python launch cost leak into small-kernel baselines? (issue 21; docs/baselines.md)

For small references, times PyTorch eager and torch.compile four ways and prints their medians:

  no lead     CUDA events around the call, nothing before it (KernelBench's way): the host's
              launch cost is counted whenever the GPU waits for it
  fixed lead  the engine's old way: a ~60 us GPU busy-wait before the start event
  lead        the engine's way now: a busy-wait covering the slowest baseline's host time
  graph       the call captured once in a CUDA graph and replayed: GPU time only, no host

with each callable's host time per call. Where "lead" is close to "graph" and "fixed lead" is
not, the old method charged a baseline for its Python; where "no lead" differs, that harness
would. Needs a GPU:  python benchmarks/baseline_method.py   (about 1-2 minutes on the H200;
writes benchmarks/results/baseline_method.{json,md})
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernel_lsp.engine.worker.timing import bench  # noqa: E402


class NewGELU(nn.Module):  # minGPT's, as KernelBench has it: seven ops eager
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class ReLU(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class LayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(x)


class Softmax(nn.Module):
    def forward(self, x):
        return F.softmax(x, dim=-1)


CASES = [
    ("minGPT GELU 2000x2000", NewGELU, (), (2000, 2000)),
    ("minGPT GELU 256x256", NewGELU, (), (256, 256)),
    ("ReLU 4096", ReLU, (), (4096,)),
    ("LayerNorm 64x256", LayerNorm, (256,), (64, 256)),
    ("softmax 16x1024", Softmax, (), (16, 1024)),
]


def graph_ms(fn, x, runs: int = 50) -> float:
    """Median of `runs` replays of `fn(x)` captured in a CUDA graph (L2 flushed before each)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(x)
    flush = bench.l2_flush_buffer(x.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(runs):
        flush.zero_()
        torch.cuda.synchronize()
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return sorted(out)[len(out) // 2]


def no_lead_ms(fn, x, runs: int = 50) -> float:
    flush = bench.l2_flush_buffer(x.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(runs):
        flush.zero_()
        torch.cuda.synchronize()
        start.record()
        fn(x)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return sorted(out)[len(out) // 2]


def main() -> int:
    if not torch.cuda.is_available():
        print("baseline_method: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = []
    for name, cls, init, shape in CASES:
        model = cls(*init).to(dev).eval()
        x = torch.randn(*shape, device=dev)
        with torch.no_grad():
            compiled = torch.compile(model)
            compiled(x)
            fns = {"eager": model, "torch.compile": compiled}
            hosts = {k: bench.host_us(f, [[x]], dev) for k, f in fns.items()}
            lead = bench.lead_for(list(hosts.values()))
            for kind, fn in fns.items():
                opts = dict(min_runs=50, max_runs=50, side_streams=False)
                row = {"case": name, "callable": kind, "host_us": hosts[kind], "lead_us": lead,
                       "no_lead_us": no_lead_ms(fn, x) * 1e3,
                       "fixed_lead_us": bench.time_fn(fn, [[x]], dev, **opts).timing.median_ms * 1e3,
                       "lead_now_us": bench.time_fn(fn, [[x]], dev, lead_us=lead, **opts).timing.median_ms * 1e3}
                try:
                    row["graph_us"] = graph_ms(fn, x) * 1e3
                except Exception as exc:  # noqa: BLE001 - a callable that cannot be captured
                    row["graph_us"] = None
                    row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
                rows.append(row)
                print(json.dumps(row))
    lines = [f"# Baseline timing method ({torch.cuda.get_device_name()}, torch {torch.__version__})", "",
             f"{platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}. `python benchmarks/baseline_method.py`. "
             "Medians of 50 calls, L2 flushed before each, microseconds.", "",
             "| case | callable | host us | no lead | fixed ~60 us lead | lead now (us) | CUDA graph |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        g = "-" if r["graph_us"] is None else f"{r['graph_us']:.1f}"
        lines.append(f"| {r['case']} | {r['callable']} | {r['host_us']:.0f} | {r['no_lead_us']:.1f} | "
                     f"{r['fixed_lead_us']:.1f} | {r['lead_now_us']:.1f} ({r['lead_us']:.0f}) | {g} |")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "baseline_method.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                          "torch": torch.__version__, "rows": rows}, indent=2) + "\n")
    (out / "baseline_method.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
