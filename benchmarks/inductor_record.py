"""Record the code torch.compile (Inductor) writes for KernelBench-format references, on a GPU.

    python benchmarks/inductor_record.py --out DIR [--modes default,max-autotune] REF.py [REF.py ...]

A mode is torch.compile's (default, max-autotune), one of inductor_code.VARIANTS
(default-unsplit-reductions: the default with Inductor's option made the other way), or
`default+OPTION=VALUE[+OPTION=VALUE]` for any other Inductor option (values read as Python
literals), e.g. `default+triton.cooperative_reductions=True`.

For each reference (a file with ``Model``, ``get_inputs``, ``get_init_inputs``) it writes
``DIR/<name>/<mode>_<i>.py`` (Inductor's output modules, as ``run_and_get_code`` returns them),
``DIR/<name>/<mode>.json`` (each graph input's place in the module, the autotuner's launch choices),
and ``DIR/index.json`` with eager and compiled times (CUDA events, median of do_bench) and errors.
The recorded modules feed the no-LLM writer's CPU tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"ref_{abs(hash(str(path)))}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def mode_patch(mode: str) -> tuple[str | None, dict]:
    """(torch.compile's mode, the Inductor options patched around it) for a --modes entry."""
    import ast

    from kernel_lsp.engine.worker import inductor_code

    if mode in inductor_code.VARIANTS:
        return None, inductor_code.options_of(mode)
    if mode.startswith("default+"):
        pairs = [kv.split("=", 1) for kv in mode.split("+")[1:]]
        return None, {k: ast.literal_eval(v) for k, v in pairs}
    return (None if mode == "default" else mode), {}


def main() -> int:
    import torch
    import torch._inductor.config  # noqa: F401 - torch._inductor.config.patch below
    from triton.testing import do_bench

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from kernel_lsp.engine.worker import inductor_code

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="default,max-autotune")
    ap.add_argument("--max-s", type=float, default=120.0, help="skip max-autotune past this many seconds of the run")
    ap.add_argument("refs", nargs="+")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    index = []
    t_start = time.time()
    for ref in a.refs:
        path = Path(ref)
        name = path.stem if path.stem != "reference" else path.parent.name
        name = name.replace("/", "_")
        row = {"name": name, "path": str(ref)}
        try:
            mod = load(path)
            torch.manual_seed(0)
            model = mod.Model(*mod.get_init_inputs()).cuda().eval()
            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
            with torch.no_grad():
                row["eager_ms"] = do_bench(lambda: model(*inputs), return_mode="median")
                for mode in a.modes.split(","):
                    if mode != "default" and time.time() - t_start > a.max_s:
                        row[f"{mode}_skipped"] = "time"
                        continue
                    torch._dynamo.reset()
                    t0 = time.time()
                    compile_mode, patch = mode_patch(mode)
                    with torch._inductor.config.patch(patch):
                        compiled = torch.compile(model, mode=compile_mode)
                        compiled(*inputs)
                        row[f"{mode}_compile_s"] = round(time.time() - t0, 2)
                        row[f"{mode}_ms"] = do_bench(lambda: compiled(*inputs), return_mode="median")
                    # The code, each graph input's place in the module and the autotuner's launch
                    # choices, as the Worker's inductor_code request records them (cudagraph-free mode).
                    rec_mode = "max-autotune-no-cudagraphs" if mode == "max-autotune" else mode
                    if mode.startswith("default+"):
                        with torch._inductor.config.patch(patch):
                            rec = inductor_code.record(path.read_text(), ("default",))
                        rec.get("modes", {})[rec_mode] = rec.get("modes", {}).pop("default", {})
                    else:
                        rec = inductor_code.record(path.read_text(), (rec_mode,))
                    got = rec.get("modes", {}).get(rec_mode, {})
                    if rec.get("why") or got.get("error"):
                        row[f"{mode}_record_error"] = rec.get("why") or got.get("error")
                    codes = got.get("codes") or []
                    d = out / name
                    d.mkdir(exist_ok=True)
                    for i, code in enumerate(codes):
                        (d / f"{mode}_{i}.py").write_text(code)
                    (d / f"{mode}.json").write_text(json.dumps({"args": got.get("args"), "configs": got.get("configs"),
                                                                "torch": rec.get("torch")}, indent=1))
                    row[f"{mode}_modules"] = len(codes)
            (out / name / "reference.py").write_text(path.read_text()) if (out / name).exists() else None
        except Exception as e:  # noqa: BLE001 - a row per failure, the run goes on
            row["error"] = f"{type(e).__name__}: {e}"[:500]
            row["trace"] = traceback.format_exc()[-2000:]
        index.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)
    (out / "index.json").write_text(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                                                "rows": index}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
