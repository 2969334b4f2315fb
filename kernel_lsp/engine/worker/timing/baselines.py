"""Baselines kept between evaluations: this run's key, a kept match, the record to keep.

Eager and torch.compile times of a Task are facts of its reference, its inputs (shapes, dtypes),
the GPU, torch's version, the compile mode and the timing method; never of a candidate. The
caller sends the kept records of a reference (option `cached_baselines`); this module builds
the key from what only the Worker knows (the inputs get_inputs() makes, the GPU's uuid, the
torch imported here) and picks the record with the same key. A measurement made here comes
back on `Evaluation.baselines` for the caller to keep (docs/baselines.md).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kernel_lsp.engine import protocol
from kernel_lsp.model import NOISY_SPREAD_PCT, Timing

# The timing method, part of every key: change it when bench.py measures differently, so
# that no number measured the old way is compared with one measured the new way.
METHOD = "cuda-events l2-flush lead>=host interleaved v1"
CPU_METHOD = "perf_counter interleaved v1"
KEEP_SPREAD_ENV = "KERNEL_LSP_BASELINE_KEEP_SPREAD"


@dataclass
class Plan:
    """This run's baselines: their key (None when it cannot be made, with why), and a kept
    record with that key (None: measure them)."""

    parts: dict[str, str] = field(default_factory=dict)
    key: str | None = None
    match: dict[str, Any] | None = None
    why: str = ""           # why there is no key, or why a kept record was not used

    @property
    def eager(self) -> Timing | None:
        return timing(self.match.get("eager")) if self.match else None

    @property
    def compiled(self) -> Timing | None:
        return timing(self.match.get("compiled")) if self.match else None


def signature(value: Any, depth: int = 0) -> str:
    """Shapes, dtypes, strides' contiguity and devices of tensors; Python scalars by value."""
    if isinstance(value, torch.Tensor):
        layout = "" if value.is_contiguous() else " strided"
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}{layout}"
    if isinstance(value, (list, tuple)) and depth < 4:
        inner = ", ".join(signature(v, depth + 1) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, (bool, int, float, str)) or value is None:
        return repr(value)[:64]
    return type(value).__name__


def gpu_identity(device: torch.device, cpu_threads: int) -> str:
    """A GPU's name and uuid (the same model of GPU is not the same GPU: clocks, thermals);
    on the CPU the host, its processor and the thread count timed with."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        uuid = getattr(props, "uuid", None)
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"{props.name} {uuid}" if uuid is not None else f"{props.name} #{index}"
    return f"cpu {platform.node()} {platform.machine()} threads={cpu_threads}"


def plan(reference_source: str, init_inputs: list[Any], sets: list[list[Any]], device: torch.device,
         options: Any) -> Plan:
    """The key of this run's baselines and the kept record that matches it, unless a
    re-measure was asked for."""
    raw = getattr(options, "raw", None) or {}
    try:
        parts = {
            "reference": protocol.reference_fingerprint(reference_source),
            "inputs": f"init {signature(list(init_inputs))}; inputs {signature(list(sets[0]) if sets else [])}"
                      f" x{len(sets)} sets",
            "gpu": gpu_identity(device, int(getattr(options, "cpu_threads", 1))),
            "torch": str(torch.__version__),
            "compile_mode": str(getattr(options, "compile_mode", "default") or "default"),
            "method": METHOD if device.type == "cuda" else CPU_METHOD,
        }
        key = protocol.baseline_key(parts)
    except Exception as exc:  # a key that cannot be made: measure, keep nothing
        return Plan(why=f"no baseline key: {type(exc).__name__}: {exc}")
    p = Plan(parts=parts, key=key)
    if _truthy(raw.get(protocol.REMEASURE_BASELINES)):
        p.why = "a re-measure was asked for"
        return p
    kept = raw.get(protocol.CACHED_BASELINES) or []
    if not isinstance(kept, list):
        p.why = f"option {protocol.CACHED_BASELINES} is not a list"
        return p
    for record in kept:
        if isinstance(record, dict) and record.get("key") == key and timing(record.get("eager")) is not None:
            p.match = record
            return p
    p.why = _why_none(kept, parts)
    return p


def _why_none(kept: list[Any], parts: dict[str, str]) -> str:
    """Which key part differs from the newest kept record of this reference (what changed)."""
    for record in kept:
        other = record.get("parts") if isinstance(record, dict) else None
        if not isinstance(other, dict) or other.get("reference") != parts["reference"]:
            continue
        changed = [p for p in protocol.BASELINE_PARTS if str(other.get(p)) != parts[p]]
        if changed:
            return "measured again: " + ", ".join(changed) + " changed since the kept baselines"
    return "none kept yet"


def record(p: Plan, eager: Timing | None, compiled: Timing | None, lead_us: float | None,
           notes: list[str], flags: list[str], interleaved: bool) -> dict[str, Any]:
    """What the caller keeps (the store's row) and what the Evaluation says about its baselines."""
    return {
        "key": p.key, "parts": dict(p.parts), "measured_at": time.time(),
        "eager": eager.to_dict() if eager else None, "compiled": compiled.to_dict() if compiled else None,
        "lead_us": lead_us, "notes": list(notes), "flags": list(flags), "interleaved": interleaved,
    }


def too_noisy(eager: Timing | None, compiled: Timing | None, options: Any) -> str:
    """Why baselines this noisy are not kept ("" when they may be): a number reused for days must
    be one that holds still; the spread above which a timing is a warning (NOISY_SPREAD_PCT)
    is the limit (option `baseline_keep_spread_pct` moves it)."""
    raw = getattr(options, "raw", None) or {}
    try:  # the option, else $KERNEL_LSP_BASELINE_KEEP_SPREAD (tests on a busy 2-core machine)
        limit = float(raw.get("baseline_keep_spread_pct", os.environ.get(KEEP_SPREAD_ENV) or NOISY_SPREAD_PCT))
    except (TypeError, ValueError):
        limit = NOISY_SPREAD_PCT
    for name, t in (("eager", eager), ("torch.compile", compiled)):
        if t is not None and not t.spread_pct <= limit:
            return f"not kept: the {name} spread is {t.spread_pct:.1f} % (above {limit:g} %)"
    return ""


def used(p: Plan) -> dict[str, Any]:
    """The Evaluation's `baselines` when a kept record was used."""
    m = dict(p.match or {})
    m["cached"] = True
    m["keep"] = False  # already kept
    return m


def timing(data: Any) -> Timing | None:
    if isinstance(data, Timing):
        return data
    if not isinstance(data, dict):
        return None
    try:
        return Timing.from_dict(data)
    except TypeError:
        return None


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    return bool(value)
