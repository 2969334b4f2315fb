"""The fast build's link step, by linker (issue 21: the link of a kernel-body edit's save).

    python benchmarks/link_time.py [--runs 7] [--out-dir benchmarks/results]

Builds the editor loop's GELU extension once with the fast path (objects kept in a fresh unit
cache), then links it again `--runs` times per linker the compiler can drive here (the compiler's
default GNU ld, gold, lld), each with torch's whole library list and with libtorch_python alone
(`fastbuild.lean_ldflags`, the engine's default): each run is a new extension name, so only the link
(and the module object's rename) runs; the link step's seconds are the build's own `link` step. The engine uses the
first faster linker it finds (`fastbuild.fast_linker`; `KERNEL_LSP_LINKER=default` keeps the
compiler's). Where a GPU is here, each row's last library is imported and its `gelu_forward`
compared with the default linker's on one input (the same output, bit for bit).

Writes OUT/link_time.{json,md} and prints the table. Needs torch with CUDA headers and nvcc.
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

from benchmarks.editor_loop import GELU, device  # noqa: E402


def gelu_args(build_root: Path, name: str) -> dict:
    source = re.search(r'gelu_source = """(.*?)"""', GELU, re.S).group(1)
    return {"name": name, "cpp_sources": "torch::Tensor gelu_forward(torch::Tensor x);", "cuda_sources": source,
            "functions": ["gelu_forward"], "extra_cuda_cflags": ["-O3"], "build_directory": str(build_root / name)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kernel-lsp-link-"))
    os.environ.setdefault("KERNEL_LSP_CACHE", str(tmp / "cache"))
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    from kernel_lsp.engine.worker.build import build, fastbuild  # noqa: PLC0415

    stubs = cpu_stand_ins(tmp)
    nvcc = build._find_nvcc(None)
    flags = fastbuild.torch_flags(nvcc)
    t0 = time.perf_counter()
    first = fastbuild.build_inline(gelu_args(tmp / "b", "link_first"), nvcc)
    if first.reason:
        print(f"the fast build failed: {first.reason}", file=sys.stderr)
        return 2
    cold_s = time.perf_counter() - t0
    first_linker = {"linker": first.linker + (", lean" if first.lean else ""),
                    "log": first.log[first.log.find("[link"):][-3000:] if "[link" in first.log else ""}
    rows = []
    libs: dict[str, str] = {}
    for linker in ("default", "gold", "lld"):
        if linker != "default" and not fastbuild._linker_works(flags.cxx, linker):
            rows.append({"linker": linker, "available": False})
            continue
        os.environ["KERNEL_LSP_LINKER"] = linker
        # torch's whole list, then libtorch_python alone (fastbuild.lean_ldflags: the engine's default)
        for lean in (False, True):
            os.environ["KERNEL_LSP_LEAN_LINK"] = "1" if lean else "0"
            name = f"{linker}, lean" if lean else linker
            secs = []
            for k in range(ns.runs):
                fb = fastbuild.build_inline(gelu_args(tmp / "b", f"link_{linker}_{int(lean)}_{k}"), nvcc)
                if fb.reason or fb.compiled:
                    print(f"{name}: {fb.reason or 'compiled ' + ', '.join(fb.compiled)}", file=sys.stderr)
                    return 2
                if fb.linker != linker or fb.lean != lean:  # it fell back: its time is not this row's
                    rows.append({"linker": name, "available": True, "log": fb.log[-2000:],
                                 "refused": fb.linker + ("" if fb.lean == lean else ", the lean link failed")})
                    break
                secs.append(fb.steps["link"])
                libs[name] = fb.so
            else:
                rows.append({"linker": name, "available": True, "median_s": statistics.median(secs),
                             "min_s": min(secs), "max_s": max(secs), "runs": len(secs),
                             "command": " ".join(fb.commands[-1][:3])})
    os.environ.pop("KERNEL_LSP_LEAN_LINK", None)
    same = same_output(libs)
    os.environ.pop("KERNEL_LSP_LINKER", None)
    doc = {"device": device(), "host": platform.node(), "cpus": os.cpu_count(), "cxx": flags.cxx,
           "date": time.strftime("%Y-%m-%d %H:%M"), "first_build_s": round(cold_s, 2),
           "first_build_linker": first_linker, "rows": rows,
           "same_output": same, "engine_uses": fastbuild.fast_linker(flags.cxx, flags.identity),
           "cpu_stand_ins": stubs}
    out = Path(ns.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "link_time_cpu" if stubs else "link_time"  # a CPU run keeps the GPU machine's table
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = markdown(doc)
    (out / f"{stem}.md").write_text(md)
    print(md)
    return 0


def cpu_stand_ins(tmp: Path) -> list[str]:
    """A CPU build of torch has no libc10_cuda or libtorch_cuda for torch's list to name: empty
    libraries of those names (on LIBRARY_PATH) let the link run, so both lists can be timed here.
    The names made; none with a CUDA torch."""
    import subprocess  # noqa: PLC0415

    import torch  # noqa: PLC0415

    if torch.version.cuda:
        return []
    lib = Path(torch.__file__).parent / "lib"
    stubs = tmp / "stand_ins"
    stubs.mkdir(parents=True, exist_ok=True)
    (stubs / "e.c").write_text("int klsp_stand_in;\n")
    made = []
    for name in ("c10_cuda", "torch_cuda"):
        if not (lib / f"lib{name}.so").exists():
            subprocess.run(["gcc", "-shared", "-o", str(stubs / f"lib{name}.so"), str(stubs / "e.c")], check=True)
            made.append(f"lib{name}.so")
    os.environ["LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(stubs), os.environ.get("LIBRARY_PATH")]))
    return made


def same_output(libs: dict[str, str]) -> dict[str, bool] | None:
    """Each linker's library against the default's, on one GPU input (None without a GPU)."""
    import importlib.util  # noqa: PLC0415

    import torch  # noqa: PLC0415

    if not torch.cuda.is_available() or "default" not in libs:
        return None
    x = torch.randn(1 << 20, device="cuda")
    outs = {}
    for linker, so in libs.items():
        name = Path(so).stem
        spec = importlib.util.spec_from_file_location(name, so)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        outs[linker] = mod.gelu_forward(x)
    return {k: bool(torch.equal(v, outs["default"])) for k, v in outs.items() if k != "default"}


def markdown(doc: dict) -> str:
    lines = [f"# The fast build's link, by linker ({doc['device']}, {doc['cpus']} CPUs)", "",
             f"{doc['date']}; `python benchmarks/link_time.py`. The editor loop's GELU extension, its objects "
             "kept, linked again per run (a new extension name each run); `, lean`: against libtorch_python "
             "alone of torch's libraries (the engine's default)."
             + (f" A CPU build of torch: {', '.join(doc['cpu_stand_ins'])} are empty stand-ins for the link."
                if doc.get("cpu_stand_ins") else ""), "",
             "| linker | median | min | max | runs |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in doc["rows"]:
        if not r["available"]:
            lines.append(f"| {r['linker']} | not here | | | |")
        elif r.get("refused"):
            lines.append(f"| {r['linker']} | refused: {r['refused']} | | | |")
        else:
            lines.append(f"| {r['linker']} | {r['median_s']:.3f} s | {r['min_s']:.3f} s | {r['max_s']:.3f} s "
                         f"| {r['runs']} |")
    same = doc.get("same_output")
    lines += ["", "Same output as the default linker's library: "
              + ("not checked (no GPU)" if same is None else ", ".join(f"{k} {'yes' if v else 'NO'}"
                                                                       for k, v in same.items()) or "-"),
              f"The engine links with: `{doc['engine_uses'] or 'the default'}` (the first build "
              f"linked with: {doc['first_build_linker']['linker']}).", ""]
    if doc["first_build_linker"]["log"]:
        lines += ["The faster linker's failure, kept so that it is not tried again:", "", "```",
                  doc["first_build_linker"]["log"].strip(), "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
