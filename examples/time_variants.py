"""Time each example's default constants against the better ones (GPU machine).

    python examples/time_variants.py [--json out.json]

Builds every examples/*.cu with build_library (defaults and the variants below), checks each
against its Model, and times kernel_forward with CUDA events (median of 50 after 5 warm-ups,
L2 flushed before each run). It shows whether a tuner has room to find a speedup.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

from kernel_lsp.toolchain import CompileOptions, build_library  # noqa: E402

VARIANTS = {
    "softmax": [{"BLOCK_SIZE": "128"}, {"BLOCK_SIZE": "256"}, {"BLOCK_SIZE": "512"}],
    "layernorm": [{"BLOCK_SIZE": "128"}, {"BLOCK_SIZE": "256"}, {"BLOCK_SIZE": "512"}],
    "matmul": [{"TILE": "16"}, {"TILE": "32"}],
    "bias_gelu": [{"BLOCK_SIZE": "256"}, {"BLOCK_SIZE": "256", "ITEMS_PER_THREAD": "4"}],
    "reduce_sum": [{"BLOCK_SIZE": "256"}, {"BLOCK_SIZE": "256", "UNROLL": "4"}, {"BLOCK_SIZE": "512", "UNROLL": "4"}],
}


def time_ms(fn, runs: int = 50, warmup: int = 5) -> float:
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write the table here too")
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for stem, variants in VARIANTS.items():
            spec = importlib.util.spec_from_file_location(stem, os.path.join(HERE, stem + ".py"))
            harness = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(harness)
            torch.manual_seed(0)
            model = harness.Model(*harness.get_init_inputs()).cuda().eval()
            inputs = [x.cuda() for x in harness.get_inputs()]
            with torch.no_grad():
                expected = model(*inputs)
                eager = time_ms(lambda: model(*inputs))
            with open(os.path.join(HERE, stem + ".cu"), encoding="utf-8") as f:
                source = f.read()
            base = None
            for i, defines in enumerate([{}] + variants):
                out = os.path.join(tmp, f"{stem}_{i}.so")
                result = build_library(source, out_path=out, timeout=300, path=os.path.join(HERE, stem + ".cu"),
                                       options=CompileOptions(arch=args.arch, defines=dict(defines)))
                if not result.ok:
                    print(f"{stem} {defines}: build failed\n{result.log}", file=sys.stderr)
                    return 1
                lib = ctypes.CDLL(out)
                with torch.no_grad():
                    got = harness.kernel_forward(lib, model, *inputs)
                    correct = torch.allclose(got, expected, rtol=1e-3, atol=1e-3)
                    ms = time_ms(lambda: harness.kernel_forward(lib, model, *inputs))
                base = base or ms
                rows.append({"example": stem, "defines": defines or "defaults", "correct": correct,
                             "ms": round(ms, 4), "speedup_vs_default": round(base / ms, 2),
                             "eager_ms": round(eager, 4)})
                print(f"{stem:11s} {str(defines or 'defaults'):45s} correct={correct!s:5s} "
                      f"{ms:8.4f} ms  x{base / ms:5.2f} vs default  (eager {eager:.4f} ms)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
