"""What the way main.cpp binds costs: its compile in a fresh build cache, and each Python call.

One extension of three host functions that do nothing (a tensor back, a tensor and two tensors and
a float in, an int doubled), so what is timed is the binding alone, built three ways by the fast
build (kernel_lsp/engine/worker/build/fastbuild.py):
  table      the table binding's one main.cpp (table_binding.py; the default on x86-64 Linux)
  signature  main.cpp bound by signature (binding.py; KERNEL_LSP_TABLE_BINDING=0)
  text       load_inline's own main.cpp (KERNEL_LSP_SIGNATURE_BINDING=0)
each in a fresh build cache (the torch headers precompiled once, beforehand, not counted), then
built again with other function names (a second file: what it compiles again). The calls are timed in a
fresh process per extension: per function, the median over 7 rounds of 20,000 calls, ns per call,
the three ways interleaved round by round.

  python benchmarks/binding_overhead.py [--cpu] [--out-dir DIR]
      --cpu: this machine has torch without CUDA (CI's): link against its CPU libraries

Prints a table and writes binding_overhead.{json,md} (benchmarks/results/ by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results_out import write_results  # noqa: E402

CUDA = r'''
#include <torch/extension.h>
__global__ void unused_kernel(float* x) { x[threadIdx.x] = 0.f; }
torch::Tensor keep(torch::Tensor x) { return x; }
torch::Tensor pick(torch::Tensor x, torch::Tensor y, torch::Tensor z, float a) { return y; }
int twice(int k) { return 2 * k; }
'''
DECLS = ("torch::Tensor keep(torch::Tensor x);\ntorch::Tensor pick(torch::Tensor x, torch::Tensor y, torch::Tensor z, "
         "float a);\nint twice(int k);")
WAYS = {"table": {}, "signature": {"KERNEL_LSP_TABLE_BINDING": "0"}, "text": {"KERNEL_LSP_SIGNATURE_BINDING": "0"}}
TIMER = textwrap.dedent(r"""
    import importlib.machinery, importlib.util, json, statistics, sys, time, torch
    mods = {}
    for way, name, so in json.loads(sys.argv[1]):
        spec = importlib.util.spec_from_loader(name, importlib.machinery.ExtensionFileLoader(name, so))
        m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); mods[way] = m
    x = torch.ones(4)
    calls = {"keep(x)": lambda m: m.keep, "pick(x, x, x, 0.5)": lambda m: m.pick, "twice(21)": lambda m: m.twice}
    argv = {"keep(x)": (x,), "pick(x, x, x, 0.5)": (x, x, x, 0.5), "twice(21)": (21,)}
    n, out = 20000, {}
    for label, get in calls.items():
        laps = {w: [] for w in mods}
        for _ in range(7):
            for w, m in mods.items():  # interleaved: a drift of the machine falls on every way alike
                f, a = get(m), argv[label]
                t0 = time.perf_counter()
                for _ in range(n):
                    f(*a)
                laps[w].append((time.perf_counter() - t0) / n * 1e9)
        out[label] = {w: {"median_ns": round(statistics.median(v), 1), "min_ns": round(min(v), 1),
                          "max_ns": round(max(v), 1)} for w, v in laps.items()}
    print(json.dumps(out))
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="torch without CUDA: link against its CPU libraries")
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    a = ap.parse_args()
    import torch

    from kernel_lsp.engine.worker.build import fastbuild

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    env = dict(os.environ)
    if a.cpu:
        lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        cudart = os.path.join(fastbuild._cuda_home(nvcc), "lib64")
        cpu = dataclasses.replace(fastbuild.torch_flags(nvcc), ldflags=(
            f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python", f"-L{cudart}", "-lcudart"))
        fastbuild.torch_flags = lambda _nvcc: cpu  # type: ignore[assignment]
        env["LD_LIBRARY_PATH"] = f"{lib}:{cudart}"
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        os.environ["KERNEL_LSP_LEAN_LINK"] = "0"
    os.environ["KERNEL_LSP_PREBUILT_BINDINGS"] = "0"  # nothing built ahead: each way pays its own
    work = Path(tempfile.mkdtemp(prefix="klsp_binding_overhead_"))
    os.environ["KERNEL_LSP_PCH_CACHE"] = str(work / "pch")
    flags = fastbuild.torch_flags(nvcc)
    for header in (fastbuild.LIGHT_MAIN, fastbuild.LIGHT_HOST):  # made once, not counted
        pch, why, _ = fastbuild.ensure_pch(flags, headers=(header,))
        if pch is None:
            print(f"binding_overhead: the precompiled headers: {why}", file=sys.stderr)
            return 1
    builds, loaded = {}, []
    for way, extra in WAYS.items():
        os.environ["KERNEL_LSP_CACHE"] = str(work / f"cache_{way}")
        for k in ("KERNEL_LSP_TABLE_BINDING", "KERNEL_LSP_SIGNATURE_BINDING"):
            os.environ.pop(k, None)
        os.environ.update(extra)
        rows = []
        for second in (False, True):
            name = f"klsp_overhead_{way}{'_2' if second else ''}"
            # the second file: the same types, other function names (as another file would have)
            ren = (lambda t: t.replace("keep(", "keep2(").replace("pick(", "pick2(").replace("twice(", "twice2(")) \
                if second else (lambda t: t)
            fb = fastbuild.build_inline({"name": name, "cpp_sources": ren(DECLS), "cuda_sources": ren(CUDA),
                                         "functions": [ren(f + "(")[:-1] for f in ("keep", "pick", "twice")],
                                         "build_directory": str(work / name)}, nvcc)
            if fb.reason or not fb.so:
                print(f"binding_overhead: {way}: {fb.reason}\n{fb.log[-2000:]}", file=sys.stderr)
                return 1
            rows.append({"binding": fb.binding, "main_s": round(fb.steps.get("main", 0.0), 2),
                         "compiled": fb.compiled, "seconds": round(fb.seconds, 2)})
        builds[way] = rows
        loaded.append((way, f"klsp_overhead_{way}", str(work / f"klsp_overhead_{way}" / f"klsp_overhead_{way}.so")))
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", TIMER, json.dumps(loaded)], capture_output=True,
                          text=True, env=env, timeout=600)
    if proc.returncode != 0:
        print(f"binding_overhead: the calls: {proc.stderr[-2000:]}", file=sys.stderr)
        return 1
    calls = json.loads(proc.stdout)
    machine = f"{platform.node()} ({os.cpu_count()} CPUs), torch {torch.__version__}"
    doc = {"machine": machine, "builds": builds, "calls": calls}
    lines = ["# What the way main.cpp binds costs", "", f"`python benchmarks/binding_overhead.py"
             f"{' --cpu' if a.cpu else ''}` on {machine}", "",
             "| way | binding | main.cpp compiled, first file | build, first file | second file compiles |",
             "| --- | --- | ---: | ---: | --- |"]
    for way, (first, second) in builds.items():
        lines.append(f"| {way} | {first['binding'][:60]} | {first['main_s']} s | {first['seconds']} s | "
                     f"{', '.join(second['compiled']) or 'nothing'} |")
    lines += ["", "ns per call, median of 7 rounds of 20,000 (min-max):", "",
              "| call | " + " | ".join(WAYS) + " |", "| --- |" + " ---: |" * len(WAYS)]
    for label, per in calls.items():
        lines.append(f"| `{label}` | " + " | ".join(
            f"{per[w]['median_ns']} ({per[w]['min_ns']}-{per[w]['max_ns']})" for w in WAYS) + " |")
    write_results(a.out_dir, "binding_overhead", doc, "\n".join(lines) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
