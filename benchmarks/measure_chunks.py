"""The float64 measure's chunk size on the host (worker/judge/accuracy.py HOST_CHUNK): seconds to
measure one softmax output against its float64 oracle, all three in host memory, per chunk size.

    python benchmarks/measure_chunks.py [--elements 100663296] [--repeat 3]

Each chunk allocates float64 temporaries of 8 x chunk bytes; above glibc's 32 MiB mmap ceiling
each one is fresh pages, faulted in again every chunk. Prints a table and writes
benchmarks/results/measure_chunks.{json,md} (--out-dir elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHUNKS = [1 << 20, 1 << 21, 1 << 22, 1 << 25]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=256 * 393216, help="output elements (default 100,663,296)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if args.elements < 1 or args.repeat < 1:
        print("measure_chunks: --elements and --repeat must be at least 1", file=sys.stderr)
        return 2
    import torch

    from kernel_lsp.engine.worker.judge import accuracy

    rows = args.elements // 393216 or 1
    x = torch.rand(rows, max(1, args.elements // rows), dtype=torch.float64)
    oracle = torch.softmax(x, 1)
    del x
    expected = oracle.float()
    out = expected.clone()
    results = []
    chosen = accuracy.HOST_CHUNK
    try:
        for chunk in CHUNKS:
            accuracy.HOST_CHUNK = chunk
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                accuracy.measure(out, expected, oracle)
                times.append(time.perf_counter() - t)
            results.append({"chunk_elements": chunk, "temporary_mib": chunk * 8 >> 20,
                            "median_s": round(statistics.median(times), 3), "runs_s": [round(s, 3) for s in times],
                            "chosen": chunk == chosen})
    finally:
        accuracy.HOST_CHUNK = chosen
    head = (f"# The float64 measure on the host by chunk size ({platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs, torch {torch.__version__}, {oracle.numel():,} elements)\n\n"
            f"Command: `python benchmarks/measure_chunks.py --elements {args.elements} --repeat {args.repeat}`\n\n"
            "| chunk (elements) | float64 temporaries | median s | runs |\n| --- | --- | --- | --- |\n")
    lines = [f"| {r['chunk_elements']:,}{' (HOST_CHUNK)' if r['chosen'] else ''} | {r['temporary_mib']} MiB | "
             f"{r['median_s']} | {', '.join(map(str, r['runs_s']))} |" for r in results]
    text = head + "\n".join(lines) + "\n"
    print(text)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "measure_chunks.md").write_text(text)
    (out_dir / "measure_chunks.json").write_text(json.dumps({"elements": int(oracle.numel()), "cpus": os.cpu_count(),
                                                              "rows": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
