"""The fraction of the hardware floor that measured Targets reach: the table beside
`kernel_lsp.verdicts.FAR_FROM_HARDWARE` and in docs/speed-of-light.md.

    python benchmarks/speed_of_light_table.py            # from recorded H200 times (no GPU needed)

Times: benchmarks/results/engine_accuracy.json (the 15 `.cu` candidates of examples/ and
benchmarks/tasks/ on an H200, the engine's current method) and examples_variants_h200.json (the
examples' tuned variants). Bytes and FLOPs: each Task's reference run once here on the CPU at its
real sizes under the engine's own recorders (worker/judge/verify.py OpRecorder, torch's FLOP counter),
so the floor is the one the engine computes on the GPU. Written to
benchmarks/results/speed_of_light.{json,md}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def traffic(path: Path) -> tuple[int, int, int | None]:
    """(bytes the reference reads, bytes it writes, its FLOPs or None), its Model run once on the CPU."""
    import torch
    import torch.utils.cpp_extension as ext
    from torch.utils.flop_counter import FlopCounterMode

    from kernel_lsp.engine.worker.harness import flat_tensors
    from kernel_lsp.engine.worker.judge.verify import OpRecorder, read_bytes, written_bytes

    ns: dict = {"__name__": "task"}
    # No kernel is built: a file that builds its ModelNew's at import (load_inline at module level)
    # needs CUDA for that, and Model does not use it.
    saved = ext.load_inline, ext.load
    ext.load_inline = ext.load = lambda *a, **k: None
    try:
        exec(compile(path.read_text(), str(path), "exec"), ns)
    finally:
        ext.load_inline, ext.load = saved
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).eval()
    inputs = ns["get_inputs"]()
    rec = OpRecorder(reads=True)
    with torch.no_grad(), FlopCounterMode(display=False) as counter, rec:
        out = model(*inputs)
    tensors = flat_tensors(inputs) + list(model.parameters()) + list(model.buffers())
    return read_bytes(rec.reads or {}, tensors), written_bytes(out, tensors), int(counter.get_total_flops()) or None


# The corpus's times: `first_bench.py --modes warm --how alone --corpus-only --corpus N` run on the
# GPU, its JSON kept here.
CORPUS_SOURCE = RESULTS / "first_bench_corpus.json"


def corpus_rows(source: Path = CORPUS_SOURCE) -> list[dict]:
    """One row per measured public solution (the warm scenario's alone benches, or its parallel ones
    when only those ran): the engine's own
    speed_of_light, and whether the hint fires on it (kernel_lsp.verdicts.far_from_hardware)."""
    from kernel_lsp.verdicts import far_from_hardware

    if not source.exists():
        return []
    doc = json.loads(source.read_text())
    out = []
    for scn in doc.get("scenarios", []):
        if scn.get("mode") != "warm":
            continue
        part = scn.get("alone") or scn.get("parallel") or {}  # alone if run (--how), else the parallel part
        for r in part.get("rows") or []:
            sol = r.get("speed_of_light")
            if not str(r.get("label", "")).startswith("corpus:") or not isinstance(sol, dict) or not r.get("time_ms"):
                continue
            target = {"verdict": r.get("verdict"), "custom_kernel": r.get("custom_kernel"), "flags": r.get("flags") or [],
                      "evidence": {"speed_of_light": sol}}
            hint = far_from_hardware(target)
            out.append({"target": r["label"].split(":", 1)[1], "device": doc.get("device"), "verdict": r.get("verdict"),
                        "kind": "custom kernel" if r.get("custom_kernel") else "PyTorch rewrite",
                        "median_ms": r["time_ms"], "bytes_floor_ms": sol.get("bytes_floor_ms") or 0.0,
                        "reference_flop_floor_ms": sol.get("reference_flop_floor_ms"), "fraction": sol["fraction"],
                        "launch_overhead_sized": bool(sol.get("launch_overhead_sized")),
                        "hint": "far from the hardware" if hint else None})
    return sorted(out, key=lambda r: r["fraction"])


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from kernel_lsp.engine.worker.timing import roofline
    from kernel_lsp.verdicts import FAR_FROM_HARDWARE

    roof = roofline.for_device("NVIDIA H200", "float32")
    rows = []
    acc = json.loads((RESULTS / "engine_accuracy.json").read_text())
    variants = json.loads((RESULTS / "examples_variants_h200.json").read_text())
    measured = [(c["name"], c["time_ms"], "engine_accuracy") for c in acc["candidates"] if c.get("time_ms")]
    measured += [(f"{v['example']} {v['defines'] if isinstance(v['defines'], str) else v['defines']}", v["ms"],
                  "examples_variants") for v in variants if v.get("correct")]
    for name, ms, source in measured:
        stem = name.split(" ")[0]
        path = next((p for p in (ROOT / "examples" / f"{stem}.py", ROOT / "benchmarks" / "tasks" / f"{stem}.py")
                     if p.exists()), None)
        if path is None:
            continue
        read, written, flops = traffic(path)
        # A .cu kernel's own FLOPs are unknown to the engine: the bytes floor only (as shown).
        sol = roofline.speed_of_light(ms, read + written, None, roof, "NVIDIA H200", flops)
        if sol is None:
            continue
        rows.append({"target": name, "source": source, "median_ms": ms, "bytes": read + written, "flops": flops,
                     "bytes_floor_ms": sol["bytes_floor_ms"], "reference_flop_floor_ms": sol["reference_flop_floor_ms"],
                     "fraction": sol["fraction"], "label": sol["label"]})
    rows.sort(key=lambda r: r["fraction"])
    corpus = corpus_rows()
    (RESULTS / "speed_of_light.json").write_text(json.dumps({"threshold": FAR_FROM_HARDWARE, "rows": rows,
                                                             "corpus": corpus}, indent=1) + "\n")
    lines = ["# Speed of light of measured Targets (H200, recorded times)", "",
             f"Bandwidth {roof.bandwidth / 1e12:.1f} TB/s (table); `far from the hardware` below "
             f"{FAR_FROM_HARDWARE:.0%} of the floor. Written by `python benchmarks/speed_of_light_table.py`.", "",
             "| target | median ms | bytes moved | bytes floor ms | reference FLOP floor ms | fraction |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ref = "-" if r["reference_flop_floor_ms"] is None else f"{r['reference_flop_floor_ms']:.4f}"
        lines.append(f"| {r['target']} | {r['median_ms']:.4f} | {r['bytes'] / 2**20:.0f} MiB | {r['bytes_floor_ms']:.4f} | "
                     f"{ref} | {r['fraction']:.1%} |")
    if corpus:
        lines += ["", f"## The public corpus ({corpus[0]['device']}, measured: `{CORPUS_SOURCE.name}`)", "",
                  "Each public KernelBench solution benched alone as a user would (`kernel-lsp bench --json`, "
                  "warm machine); the fraction and floors are the engine's own (`speed_of_light` of the JSON).", "",
                  "| solution | verdict | kind | median ms | bytes floor ms | reference FLOP floor ms | fraction | hint |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in corpus:
            ref = "-" if r["reference_flop_floor_ms"] is None else f"{r['reference_flop_floor_ms']:.4f}"
            lines.append(f"| {r['target']} | {r['verdict']} | {r['kind']} | {r['median_ms']:.4f} | "
                         f"{r['bytes_floor_ms']:.4f} | {ref} | {r['fraction']:.1%}"
                         f"{' (launch-overhead-sized)' if r['launch_overhead_sized'] else ''} | {r['hint'] or '-'} |")
    (RESULTS / "speed_of_light.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
