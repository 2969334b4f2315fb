"""The Worker's `inductor_code` request: what torch.compile (Inductor) writes for a Task's module.

For each mode ("default", "max-autotune-no-cudagraphs", and the VARIANTS below: the default mode
with one of Inductor's own choices made the other way), on this GPU and the Task's inputs:
Inductor's output modules (as `run_and_get_code` returns them), what each graph input is in
the module ("self.weight" or a forward argument, matched by storage pointer at the call), the
launch configuration Inductor's autotuner picked for each Triton kernel, and the seconds it
took. The no-LLM writer (kernel_lsp/nollm) turns that into a standalone ModelNew file.

Imports torch lazily; says in one sentence why it cannot run (no CUDA, a CPU-only torch).
Private torch APIs used here, only here, at record time (never by a generated file):
torch._inductor.utils.run_and_get_code, torch._inductor.compile_fx.compile_fx,
torch._inductor.codecache.PyCodeCache (checked with torch 2.11 and 2.13).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from kernel_lsp.engine.protocol import COMPILE_THREADS_CHOSEN_ENV

MODES = ("default", "max-autotune-no-cudagraphs")
# Inductor makes some choices by heuristics, not by timing them; each variant records the default
# mode with one of them made the other way, and the no-LLM Search times the file written from it
# beside torch.compile's own (that is how it finds kernels faster than torch.compile's):
# - a reduction over few long rows (softmax or a norm over 16 x 16384) is split into partial
#   reductions: three to five kernels where one program per row in one kernel may be faster;
# - a reduction along a dimension that is not the innermost is written as a 1D loop; tiled in 2D,
#   each program reads contiguous rows (a max over dim 1 of 16 x 256 x 256);
# - a short reduction is kept whole in registers (persistent); looped, a block holds more rows;
# - nodes that share no buffer are not fused: aggressive fusion launches fewer kernels;
# - a kernel's launch configuration is picked from a few by timing; coordinate descent walks each
#   block size and warp count from there while the time drops (Inductor's own tuner, off by default);
# - a convolution's tensors go channels-last where a table of average speedups per kind of
#   convolution says so (not timed on this GPU or these shapes); the variant keeps their layout.
# Each is recorded only where the default's code has what it changes (`needs`: a split reduction,
# a looped reduction, a persistent one, two kernels or more, a convolution), and one whose code
# comes out the same as the default's is recorded as `same_as` (no second file).
@dataclass(frozen=True)
class Variant:
    options: dict[str, Any]   # Inductor's config patched over the default mode
    label: str                # what the user reads: "Triton kernels generated from torch.compile (LABEL)"
    # What the variant changes: patterns (re.M) in the default's code, each with how many of it
    # there must be
    needs: tuple[tuple[str, int], ...]
    missing: str              # what the default's code has not, when there are fewer


_TRITON = r"^\w+ = async_compile\.triton\('"
VARIANTS: dict[str, Variant] = {
    # A split reduction is a looped partial reduction and a second reduction over the partials,
    # which is persistent where the partials are few (an L1 norm over 16 x 16384: red, per, poi).
    "default-unsplit-reductions": Variant({"split_reductions": False}, "default, reductions not split",
                                          ((_TRITON + "triton_(?:red|per)_", 2), (_TRITON + "triton_red_", 1)),
                                          "fewer than two reduction kernels, one of them looped, so no split "
                                          "reduction"),
    "default-tiled-reductions": Variant({"triton.tile_reductions": True}, "default, reductions tiled",
                                        ((_TRITON + "triton_red_", 1),), "no looped reduction kernel"),
    "default-looped-reductions": Variant({"triton.persistent_reductions": False}, "default, reductions looped",
                                         ((_TRITON + "triton_per_", 1),), "no persistent reduction kernel"),
    "default-aggressive-fusion": Variant({"aggressive_fusion": True}, "default, aggressive fusion",
                                         ((_TRITON + "triton_", 2),), "fewer than two kernels to fuse"),
    "default-coordinate-descent": Variant({"coordinate_descent_tuning": True}, "default, coordinate-descent tuned",
                                          ((_TRITON + "triton_", 1),), "no Triton kernel to tune"),
    "default-layout-kept": Variant({"layout_optimization": False}, "default, convolution layout kept",
                                   ((r"extern_kernels\.convolution\(", 1),), "no convolution"),
}


def variant_skip(mode: str, default_codes: list[str] | None) -> str | None:
    """Why a variant would change nothing in the default's code (None: record it). Without a
    default recording to look at, every variant is recorded."""
    v = VARIANTS.get(mode)
    if v is None or not default_codes:
        return None
    if all(sum(len(re.findall(p, c, re.M)) for c in default_codes) >= n for p, n in v.needs):
        return None
    return f"not recorded: torch.compile's default code has {v.missing}"


# The Search's order: the variants before max-autotune, whose GEMM autotuning can take minutes
# (`variants_within_s` then never leaves a variant out for it).
SEARCH_MODES = ("default", *VARIANTS, "max-autotune-no-cudagraphs")


def why_not() -> str | None:
    """Why this machine cannot record Inductor's GPU code, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed here, so torch.compile cannot write kernels for this module"
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (f"this torch ({torch.__version__}) is a CPU-only build: torch.compile writes GPU kernels only "
                "with a CUDA build of torch and a GPU")
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible here: torch.compile writes its Triton kernels for a GPU"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed here: torch.compile's GPU kernels are Triton kernels"
    return None


def _load(source: str, name: str) -> Any:
    fd, path = tempfile.mkstemp(suffix=".py", prefix="kernel_lsp_ref_")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    finally:
        os.unlink(path)
    return mod


def _chosen_configs(code: str) -> dict[str, dict[str, Any]]:
    """The launch config Inductor's autotuner kept for each kernel named in `code`."""
    from torch._inductor.codecache import PyCodeCache

    names = set(re.findall(r"^(\w+) = async_compile\.triton\(", code, re.M))
    mods = PyCodeCache.modules if isinstance(PyCodeCache.modules, list) else list(PyCodeCache.modules.values())
    mods = list(mods) + list(getattr(PyCodeCache, "modules_no_attr", {}).values())
    out: dict[str, dict[str, Any]] = {}
    for mod in reversed(mods):
        for name in names - set(out):
            k = getattr(mod, name, None)
            launchers = getattr(k, "launchers", None) or []
            cfg = getattr(launchers[0], "config", None) if len(launchers) == 1 else None
            if cfg is None and len(getattr(k, "configs", None) or []) == 1:
                cfg = k.configs[0]
            if cfg is not None:
                out[name] = {"kwargs": {a: v for a, v in dict(cfg.kwargs).items() if isinstance(v, int)},
                             "num_warps": int(cfg.num_warps), "num_stages": int(cfg.num_stages)}
    return out


def mode_threads(mode: str) -> dict[str, Any]:
    """Inductor config for compiling in `mode`: for max-autotune, the compile threads its GEMM
    precompile runs on. The Worker has one by default (caller/process.py), and max-autotune's
    candidate GEMM kernels compiled one at a time would take minutes. {} for the default mode and
    its VARIANTS, or where the user set TORCHINDUCTOR_COMPILE_THREADS (theirs stands)."""
    if mode in (None, "default") or mode in VARIANTS or os.environ.get(COMPILE_THREADS_CHOSEN_ENV) != "1":
        return {}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"compile_threads": max(1, min(32, cpus))}


def recording_options(mode: str, mode_options: dict[str, Any]) -> dict[str, Any]:
    """Inductor's config for recording one mode: the mode's own options, compiled now (no FX graph
    cache, so that run_and_get_code sees the code), on mode_threads' threads."""
    return {**mode_options, "fx_graph_cache": False, **mode_threads(mode)}


def options_of(mode: str) -> dict[str, Any]:
    """Inductor's config for `mode` (one of MODES or VARIANTS) before recording_options. Raises
    ValueError with one sentence for a mode this torch's Inductor does not have."""
    import torch
    import torch._inductor.config as inductor_config

    if mode in VARIANTS:
        for key in VARIANTS[mode].options:
            node: Any = inductor_config
            for part in key.split("."):
                if not hasattr(node, part):
                    raise ValueError(f"this torch ({torch.__version__}) has no Inductor option {key!r}")
                node = getattr(node, part)
        return dict(VARIANTS[mode].options)
    if mode in (None, "default"):
        return {}
    try:
        return dict(torch._inductor.list_mode_options(mode))
    except Exception as exc:  # noqa: BLE001 - an unknown mode is one sentence
        raise ValueError(f"torch.compile has no mode {mode!r}") from exc


def _code_only(codes: list[str]) -> list[str]:
    """The modules without their whole-line comments (source-node notes, cache paths): what a
    variant is compared on against the default."""
    return ["\n".join(line for line in c.splitlines() if not line.lstrip().startswith("#")) for c in codes]


def record(reference_source: str, modes: tuple[str, ...] = MODES, seed: int = 0,
           variants_within_s: float | None = None) -> dict[str, Any]:
    """{"torch", "triton", "device", "modes": {mode: {"codes", "args", "configs", "seconds",
    "error"? , "same_as"?}}} or {"why": sentence}. A VARIANTS mode whose code is the default's
    (recorded before it) has "same_as": "default" and no codes. `variants_within_s`: no VARIANTS
    mode is started past that many seconds of the recording (so the variants cannot run the
    caller's timeout out on torch.compile's own modes); each skipped one says so."""
    why = why_not()
    if why:
        return {"why": why}
    import torch
    import triton
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code

    mod = _load(reference_source, f"kernel_lsp_inductor_ref_{os.getpid()}")
    torch.manual_seed(seed)
    model = mod.Model(*mod.get_init_inputs()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    names = list(inspect.signature(mod.Model.forward).parameters)[1:]
    where: dict[int, str] = {}
    for n, p in model.named_parameters():
        where.setdefault(p.data_ptr(), f"self.{n}")
    for n, b in model.named_buffers():
        where.setdefault(b.data_ptr(), f"self.{n}")
    for n, x in zip(names, inputs):
        if isinstance(x, torch.Tensor):
            where[x.data_ptr()] = n  # an input wins over a parameter sharing its storage
    out: dict[str, Any] = {"torch": torch.__version__, "triton": triton.__version__,
                           "device": torch.cuda.get_device_name(), "modes": {}}
    began = time.perf_counter()
    for mode in modes:
        spent = time.perf_counter() - began
        if mode in VARIANTS and variants_within_s is not None and spent > variants_within_s:
            out["modes"][mode] = {"error": f"not recorded: the recording had taken {spent:.0f} s, past the "
                                           f"{variants_within_s:.0f} s its variants may start within"}
            continue
        skip = variant_skip(mode, (out["modes"].get("default") or {}).get("codes"))
        if skip:
            out["modes"][mode] = {"skipped": skip}
            continue
        seen: list[list[str | None]] = []

        def backend(gm: Any, example_inputs: list[Any]) -> Any:
            compiled = compile_fx(gm, example_inputs)

            def run(*args: Any) -> Any:
                seen.append([where.get(a.data_ptr()) if isinstance(a, torch.Tensor) else None for a in args])
                return compiled(*args)
            return run

        torch._dynamo.reset()
        t0 = time.perf_counter()
        row: dict[str, Any] = {}
        try:
            options = recording_options(mode, options_of(mode))
            with torch.no_grad(), torch._inductor.config.patch(options):
                _, codes = run_and_get_code(torch.compile(model, backend=backend, dynamic=False), *inputs)
            row["codes"] = list(codes)
            default_codes = (out["modes"].get("default") or {}).get("codes")
            if mode in VARIANTS and default_codes and _code_only(row["codes"]) == _code_only(default_codes):
                row["codes"], row["same_as"] = [], "default"
            row["args"] = seen[0] if len(seen) == 1 else None
            if len(seen) > 1:
                row["error"] = (f"torch.compile split this module into {len(seen)} graphs (graph breaks); "
                                "the writer needs a single graph")
            elif row.get("same_as"):
                pass
            elif not codes or not seen:
                row["error"] = "torch.compile produced no GPU code for this module (nothing for Inductor to compile)"
            elif any(a is None for a in seen[0]):
                row["error"] = "a graph input is neither a parameter, a buffer nor a forward input of the module"
            row["configs"] = {}
            for code in row["codes"]:
                try:
                    row["configs"].update(_chosen_configs(code))
                except Exception:  # noqa: BLE001 - the configs are a hint; the writer has defaults
                    pass
        except ValueError as exc:
            row["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - one sentence per mode
            row["error"] = f"torch.compile failed on this module: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        row["seconds"] = round(time.perf_counter() - t0, 2)
        out["modes"][mode] = row
    torch._dynamo.reset()
    return out


def worker_op(params: dict[str, Any]) -> dict[str, Any]:
    modes = tuple(params.get("modes") or MODES)
    within = params.get("variants_within_s")
    return record(str(params["reference_source"]), modes,
                  variants_within_s=float(within) if isinstance(within, (int, float)) else None)
