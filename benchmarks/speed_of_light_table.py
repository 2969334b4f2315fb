"""The fraction of the hardware floor that measured Targets reach: the table beside
`kernel_lsp.verdicts.FAR_FROM_HARDWARE` and in docs/speed-of-light.md.

    python benchmarks/speed_of_light_table.py            # from recorded H200 times (no GPU needed)

Times: benchmarks/results/engine_accuracy.json (the 15 `.cu` candidates of examples/ and
benchmarks/tasks/ on an H200, the engine's current method) and examples_variants_h200.json (the
examples' tuned variants). Bytes and FLOPs: each Task's reference run once here on the CPU at its
real sizes under the engine's own recorders (worker/verify.py OpRecorder, torch's FLOP counter),
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
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from kernel_lsp.engine.worker.harness import flat_tensors
    from kernel_lsp.engine.worker.verify import OpRecorder, read_bytes, written_bytes

    ns: dict = {"__name__": "task"}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]()).eval()
    inputs = ns["get_inputs"]()
    rec = OpRecorder(reads=True)
    with torch.no_grad(), FlopCounterMode(display=False) as counter, rec:
        out = model(*inputs)
    tensors = flat_tensors(inputs) + list(model.parameters()) + list(model.buffers())
    return read_bytes(rec.reads or {}, tensors), written_bytes(out, tensors), int(counter.get_total_flops()) or None


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from kernel_lsp.engine.worker import roofline
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
    (RESULTS / "speed_of_light.json").write_text(json.dumps({"threshold": FAR_FROM_HARDWARE, "rows": rows},
                                                            indent=1) + "\n")
    lines = ["# Speed of light of measured Targets (H200, recorded times)", "",
             f"Bandwidth {roof.bandwidth / 1e12:.1f} TB/s (table); `far from the hardware` below "
             f"{FAR_FROM_HARDWARE:.0%} of the floor. Written by `python benchmarks/speed_of_light_table.py`.", "",
             "| target | median ms | bytes moved | bytes floor ms | reference FLOP floor ms | fraction |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ref = "-" if r["reference_flop_floor_ms"] is None else f"{r['reference_flop_floor_ms']:.4f}"
        lines.append(f"| {r['target']} | {r['median_ms']:.4f} | {r['bytes'] / 2**20:.0f} MiB | {r['bytes_floor_ms']:.4f} | "
                     f"{ref} | {r['fraction']:.1%} |")
    (RESULTS / "speed_of_light.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
