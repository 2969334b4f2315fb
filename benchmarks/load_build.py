"""Compile time of a ``load()`` extension (a .cu and a .cpp): torch's normal commands against the
fast path (issue 9), without the link, so that it runs on a machine without a GPU or CUDA torch.

    python benchmarks/load_build.py [--sources DIR] [--repeat N] [--out-dir benchmarks/results]

DIR (default ``tests/engine/load_sources/ext``) holds the ``.cu`` and ``.cpp`` files of one
extension; their flags are the test's (``-DKLSP_BIAS=0.5f`` and friends). Normal: the two
compiles torch's ninja file runs for ``load()`` (nvcc on the .cu, the host compiler on the .cpp,
both with ``torch/extension.h``), at once. Fast: ``fastbuild.build_load(link=False)`` with the
precompiled headers already made (their one-time cost is reported apart). Writes
``OUT/load_build.json`` and ``OUT/load_build.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXTRA_CFLAGS = ["-O2", "-DKLSP_CPP_FLAG=7"]
EXTRA_CUDA = ["-O3", "-DKLSP_BIAS=0.5f", "-Xcompiler", "-DKLSP_HOST_ONLY=1"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", default=str(ROOT / "tests/engine/load_sources/ext"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks/results"))
    args = ap.parse_args(argv)
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    from torch.utils import cpp_extension as ce

    from kernel_lsp.engine.worker.build import build, fastbuild

    nvcc = build._find_nvcc(None)
    src = Path(args.sources)
    cus, cpps = sorted(src.glob("*.cu")), sorted(src.glob("*.cpp"))
    if not cus:
        print(f"no .cu file in {src}", file=sys.stderr)
        return 2
    f = fastbuild.torch_flags(nvcc)
    inc = [x for d in f.includes for x in ("-isystem", d)]
    common = ["-DTORCH_EXTENSION_NAME=klsp_bench", *f.defines, *inc, f.std]
    work = Path(tempfile.mkdtemp(prefix="klsp-load-bench-"))
    normal_cmds = [[nvcc, "-c", *common, *f.nvcc_common, *ce._get_cuda_arch_flags(EXTRA_CUDA), "--compiler-options",
                    "-fPIC", *EXTRA_CUDA, str(p), "-o", str(work / f"{p.stem}.cuda.o")] for p in cus]
    normal_cmds += [[f.cxx, "-c", *common, "-fPIC", *EXTRA_CFLAGS, str(p), "-o", str(work / f"{p.stem}.o")]
                    for p in cpps]
    load_args = {"name": "klsp_bench", "sources": [str(p) for p in cus + cpps], "extra_cflags": EXTRA_CFLAGS,
                 "extra_cuda_cflags": EXTRA_CUDA}
    t0 = time.perf_counter()  # the precompiled headers, once per torch version (kept in the cache)
    warm = fastbuild.build_load({**load_args, "build_directory": str(work / "warm")}, nvcc, link=False)
    pch_s = sum(v for k, v in warm.steps.items() if k.startswith("pch"))
    if warm.reason:
        print(f"the fast path does not take these sources: {warm.reason}", file=sys.stderr)
        return 1
    normal, fast = [], []
    for i in range(args.repeat):
        t0 = time.perf_counter()
        procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in normal_cmds]
        for p in procs:
            _, err = p.communicate()
            if p.returncode:
                print(err[-3000:], file=sys.stderr)
                return 1
        normal.append(time.perf_counter() - t0)
        fb = fastbuild.build_load({**load_args, "build_directory": str(work / f"fast{i}")}, nvcc, link=False)
        if fb.reason:
            print(fb.reason, file=sys.stderr)
            return 1
        fast.append(fb.seconds)
    shutil.rmtree(work, ignore_errors=True)
    cores = os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    res = {"device": f"CPU only ({platform.node()}, {cores} cores, load {load:.1f} at the end; no link)",
           "command": "python " + " ".join(shlex.quote(a) for a in ["benchmarks/load_build.py", *argv]),
           "sources": [str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in cus + cpps],
           "pch_first_time_s": round(pch_s, 1), "normal_s": [round(x, 1) for x in normal],
           "fast_s": [round(x, 1) for x in fast],
           "median": {"normal_s": round(statistics.median(normal), 1), "fast_s": round(statistics.median(fast), 1)}}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "load_build.json").write_text(json.dumps(res, indent=1) + "\n")
    spread = lambda xs: f"{statistics.median(xs):.1f} s ({min(xs):.1f}-{max(xs):.1f}, n={len(xs)})"  # noqa: E731
    md = ["# load() of a .cu and a .cpp: compile time, normal vs fast (no link)", "",
          f"Command: `{res['command']}` on {res['device']}.", "",
          "| build | median (min-max) |", "| --- | --- |",
          f"| normal: nvcc + host compiler with torch/extension.h, at once | {spread(normal)} |",
          f"| fast: split units against the precompiled light headers | {spread(fast)} |", "",
          f"Precompiled headers made by this run: {pch_s:.0f} s (0: already in the cache; made once per torch "
          "version and flags, kept under `$KERNEL_LSP_PCH_CACHE` or the build cache)."]
    (out / "load_build.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
