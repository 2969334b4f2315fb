"""Where a generated file's time per call goes, on a GPU: host time and GPU time of one forward.

    python benchmarks/nollm_launch_cost.py [REF.py ...]   (default: KernelBench l1_p23, softmax 16 x 16384)

For each reference: torch.compile's code is recorded and written as the standalone file, then one
call is timed four ways, each as its host time (perf_counter around the call, no sync inside) and
its GPU time (CUDA events around the call after a busy-wait that covers the host, so only the GPU's
work counts), medians of 200 calls:

  eager        the reference's forward
  jit launch   the generated file with every kernel launched through Triton's `kernel[grid](...)`
               (the files before the lean launcher)
  runner       compiled once, launched through Triton's runner (`compiled[grid]`: the files before
               the direct launch)
  lean         the generated file as written now (compiled once, launched through the compiled
               kernel's own launcher, `_direct`, where the Triton version allows)
  graphed      the lean file's forward replayed from a CUDA graph (inputs copied in, outputs cloned)

A file whose host time exceeds its GPU time is launch-bound: that is the time the engine charges
where its busy-wait lead (set from the baselines' host time) does not cover the candidate's host.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT = ROOT / "benchmarks" / "corpus" / "inline_build" / "l1_p23_claude-3-5-sonnet-20241022_10f650" / "reference.py"


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"m{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _time(fn, xs, torch) -> tuple[float, float]:
    for _ in range(20):
        fn(*xs)
    torch.cuda.synchronize()
    host, gpu = [], []
    for _ in range(200):
        torch.cuda._sleep(2_000_000)  # about 1 ms of GPU busy-wait: the host's launches hide behind it
        t0 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*xs)
        end.record()
        host.append((time.perf_counter() - t0) * 1e6)
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e3)
    return statistics.median(host), statistics.median(gpu)


def main() -> int:
    import torch

    from kernel_lsp.engine.protocol import reference_only_source
    from kernel_lsp.engine.worker.inductor_code import record
    from kernel_lsp.nollm import graphs
    from kernel_lsp.nollm.proposer import convert_recording

    paths = [Path(p) for p in sys.argv[1:]] or [DEFAULT]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| task | variant | host us | GPU us |\n| --- | --- | ---: | ---: |")
    for path in paths:
        ref = reference_only_source(path.read_text())
        rec = record(ref, ("default",))
        gens, why = convert_recording(ref, rec)
        if "default" not in gens:
            print(f"| {path.parent.name or path.stem} | not written: {why} | | |")
            continue
        lean = gens["default"].source
        jit = lean.replace('if hasattr(compiled, "packed_metadata"):', "if False:")
        runner = lean.replace("_direct(compiled, self.grid, device) or runner", "runner")
        assert jit != lean and runner != lean, "the file's launcher changed: update these variants"
        with tempfile.TemporaryDirectory() as d, torch.no_grad():
            files = {}
            for name, src in (("jit launch", jit), ("runner", runner), ("lean", lean), ("graphed", graphs.graphed(lean))):
                f = Path(d) / f"{name.replace(' ', '_')}.py"
                f.write_text(src)
                files[name] = _load(f)
            mod = files["lean"]
            torch.manual_seed(0)
            model = mod.Model(*mod.get_init_inputs()).cuda().eval()
            xs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
            rows = [("eager", model)]
            for name, m in files.items():
                new = m.ModelNew(*mod.get_init_inputs()).cuda().eval()
                new.load_state_dict(model.state_dict())
                assert torch.allclose(new(*xs), model(*xs), atol=1e-4, rtol=1e-4), name
                rows.append((name, new))
            for name, fn in rows:
                h, g = _time(fn, xs, torch)
                print(f"| {path.parent.name if path.name == 'reference.py' else path.stem} | {name} | {h:.1f} | {g:.1f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
