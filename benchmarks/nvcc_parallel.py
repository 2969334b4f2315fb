"""The device unit of a kernel-body edit, compiled by plain nvcc and with its host and device front
ends side by side (kernel_lsp/toolchain/nvcc_parallel.py; issue 33: a body edit's save <= 1.5 s).

    python benchmarks/nvcc_parallel.py [--runs 7] [--out-dir benchmarks/results]

Builds each of the editor loop's load_inline sources (GELU, ReLU, the two-kernel LayerNorm) once with
the fast path, then `--runs` times per mode with a new comment in a kernel's body, alternating the
modes: each run recompiles the device unit only (the host unit and main.cpp come from the unit
cache), and its seconds are the build's own `device` step. Plain nvcc is
`KERNEL_LSP_NVCC_SERIAL=1`. Writes OUT/nvcc_parallel.json and .md (`nvcc_parallel_cpu.*` on a machine
without a GPU: its CPUs are not the GPU machine's) and prints the table. Needs torch's headers and nvcc.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.editor_loop import GELU, LAYERNORM, RELU, device  # noqa: E402

SOURCES = {  # name: (file text, source variable, declaration, function)
    "gelu": (GELU, "gelu_source", "torch::Tensor gelu_forward(torch::Tensor x);", "gelu_forward"),
    "relu": (RELU, "relu_source", "torch::Tensor relu_forward(torch::Tensor x);", "relu_forward"),
    "layernorm": (LAYERNORM, "ln_source", "torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor w, "
                  "torch::Tensor b, double eps);", "layer_norm_forward"),
}


RUN = time.time_ns()  # in each edit's comment: no earlier run's object is found in the unit cache


def args_for(name: str, build_root: Path, tag: str, edit: int) -> dict:
    text, var, decl, fn = SOURCES[name]
    source = re.search(rf'{var} = """(.*?)"""', text, re.S).group(1)
    # A comment inside the first kernel's body: the device unit's text changes, the host unit's does not.
    at = source.index("{", source.index("__global__")) + 1
    source = f"{source[:at]} /* edit {RUN}.{edit} */{source[at:]}"
    return {"name": f"{name}_{tag}", "cpp_sources": decl, "cuda_sources": source, "functions": [fn],
            "extra_cuda_cflags": ["-O3"], "build_directory": str(build_root / f"{name}_{tag}")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ns = ap.parse_args()
    if ns.runs < 1:
        ap.error("--runs must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="kernel-lsp-nvcc-par-"))
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")  # the build cache is the machine's (its headers)
    from kernel_lsp.engine.worker.build import build, fastbuild  # noqa: PLC0415
    from kernel_lsp.toolchain import nvcc_parallel  # noqa: PLC0415

    nvcc = build._find_nvcc(None)
    rows = []
    for name in SOURCES:
        first = fastbuild.build_inline(args_for(name, tmp / "b", "first", 0), nvcc, link=False)
        if first.reason:
            print(f"{name}: the fast build failed: {first.reason}", file=sys.stderr)
            return 2
        secs: dict[str, list[float]] = {"nvcc": [], "parallel": []}
        logs: dict[str, str] = {}
        for k in range(ns.runs):
            for mode in ("nvcc", "parallel") if k % 2 == 0 else ("parallel", "nvcc"):
                if mode == "nvcc":
                    os.environ[nvcc_parallel.SERIAL_ENV] = "1"
                else:
                    os.environ.pop(nvcc_parallel.SERIAL_ENV, None)
                fb = fastbuild.build_inline(args_for(name, tmp / "b", f"{mode}_{k}", 1 + 2 * k + (mode == "nvcc")),
                                            nvcc, link=False)
                if fb.reason or fb.compiled != ["device"]:
                    print(f"{name} {mode}: {fb.reason or 'compiled ' + ', '.join(fb.compiled)}", file=sys.stderr)
                    return 2
                secs[mode].append(fb.steps["device"])
                logs[mode] = re.sub(r"Compile time = [0-9.]+ ms", "", fb.log)
        os.environ.pop(nvcc_parallel.SERIAL_ENV, None)
        row = {"source": name, "runs": ns.runs, "same_words": logs["nvcc"] == logs["parallel"]}
        for mode, vals in secs.items():
            row[mode] = {"median_s": round(statistics.median(vals), 3), "min_s": round(min(vals), 3),
                         "max_s": round(max(vals), 3)}
        row["saved"] = round(1 - row["parallel"]["median_s"] / row["nvcc"]["median_s"], 3)
        rows.append(row)
    doc = {"device": device(), "host": platform.node(), "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"),
           "command": "python benchmarks/nvcc_parallel.py " + " ".join(sys.argv[1:]), "rows": rows}
    out = Path(ns.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "nvcc_parallel_cpu" if doc["device"] == "no GPU" else "nvcc_parallel"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = markdown(doc)
    (out / f"{stem}.md").write_text(md)
    print(md)
    return 0


def markdown(doc: dict) -> str:
    lines = [f"# A body edit's device unit: plain nvcc against its front ends side by side ({doc['device']})",
             "", f"{doc['cpus']} CPUs, {doc['date']}. `{doc['command'].strip()}`.", "",
             "Seconds of the fast build's `device` step (the unit of a kernel-body edit: the host unit and "
             "main.cpp come from the unit cache), the modes alternating run by run.", "",
             "| source | runs | plain nvcc (median, min-max) | side by side (median, min-max) | saved | same words |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in doc["rows"]:
        a, b = r["nvcc"], r["parallel"]
        lines.append(f"| {r['source']} | {r['runs']} | {a['median_s']:.3f} ({a['min_s']:.3f}-{a['max_s']:.3f}) | "
                     f"{b['median_s']:.3f} ({b['min_s']:.3f}-{b['max_s']:.3f}) | {r['saved']:.0%} | "
                     f"{'yes' if r['same_words'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
