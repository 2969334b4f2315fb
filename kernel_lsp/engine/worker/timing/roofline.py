"""The hardware's floor: no correct kernel is faster than moving the bytes any correct
implementation must move (the inputs and parameters the reference reads, read once; its
outputs, written once) at the device's bandwidth. A measured time below that floor is a
measurement error or a cheat: flag it, never show it as a gain.

The reference's FLOPs are not a floor for the candidate: a different algorithm (diag(A) @ B
done as a row scale, a GEMM-then-sum done as one GEMV) owes nothing to the reference's
arithmetic. A correct candidate below the reference's FLOP floor is an algebraic shortcut,
counted and labelled (`shortcut`). Standard library only (docs/speed-of-light.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Peak DRAM bandwidth (bytes/s) and dense peaks (FLOP/s) by device-name substring, first match
# wins. fp32 uses the TF32 tensor peak: the most generous floor, so only impossible times flag.
_DEVICES: list[tuple[str, float, dict[str, float]]] = [
    ("H200", 4.8e12, {"fp32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12, "fp64": 66.9e12}),
    ("H100 PCIe", 2.0e12, {"fp32": 378e12, "fp16": 756e12, "bf16": 756e12, "fp8": 1513e12, "fp64": 51e12}),
    ("H100", 3.35e12, {"fp32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12, "fp8": 1978.9e12, "fp64": 66.9e12}),
    ("B200", 8.0e12, {"fp32": 1100e12, "fp16": 2250e12, "bf16": 2250e12, "fp8": 4500e12, "fp64": 40e12}),
    ("A100-SXM4-80GB", 2.039e12, {"fp32": 156e12, "fp16": 312e12, "bf16": 312e12, "fp64": 19.5e12}),
    ("A100", 1.555e12, {"fp32": 156e12, "fp16": 312e12, "bf16": 312e12, "fp64": 19.5e12}),
    ("L40S", 0.864e12, {"fp32": 183e12, "fp16": 366e12, "bf16": 366e12, "fp64": 1.4e12}),
    ("L4", 0.3e12, {"fp32": 60e12, "fp16": 121e12, "bf16": 121e12, "fp64": 0.5e12}),
    ("RTX 4090", 1.008e12, {"fp32": 82.6e12, "fp16": 165e12, "bf16": 165e12, "fp64": 1.3e12}),
]

# Below this fraction of the floor the time is called impossible (clock and table slack).
# Accepts a time down to 0.7x the floor, i.e. an apparent bandwidth up to 6.9 TB/s on an H200
# (table 4.8 TB/s; a device-to-device copy measures about 4 TB/s there): 1 GiB read + 1 GiB
# written has a floor of 0.447 ms; 0.313 ms is accepted, 0.31 ms is `beyond_roofline`.
# The same margin makes a time "below the reference's FLOP floor" (`shortcut`): 1e12 fp32
# FLOP at the H200's TF32 peak take 2.02 ms; a correct candidate at 1.4 ms does less arithmetic.
MARGIN = 0.7


@dataclass
class Roofline:
    bandwidth: float | None        # bytes/s
    peak_flops: float | None       # FLOP/s for the dtype
    source: str                    # "table" | "measured" | "unknown"

    def floor_ms(self, nbytes: int, flops: int | None = None) -> float | None:
        """The least time moving `nbytes` once and doing `flops` can take, in ms."""
        floors = [f for f in (self.bytes_ms(nbytes), self.flops_ms(flops)) if f is not None]
        return max(floors) if floors else None

    def bytes_ms(self, nbytes: int | None) -> float | None:
        """Moving `nbytes` once at the bandwidth, in ms (None: bandwidth or bytes unknown)."""
        if not self.bandwidth or not nbytes or nbytes <= 0:
            return None
        return nbytes / self.bandwidth * 1e3

    def flops_ms(self, flops: int | None) -> float | None:
        """`flops` at the dtype's dense peak, in ms (None: peak or FLOPs unknown)."""
        if not self.peak_flops or not flops or flops <= 0:
            return None
        return flops / self.peak_flops * 1e3


def dtype_key(dtype_name: str) -> str:
    name = dtype_name.replace("torch.", "")
    if "float8" in name:
        return "fp8"
    return {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float64": "fp64", "double": "fp64"}.get(name, "fp32")


def for_device(name: str, dtype: str = "float32", measured_bandwidth: float | None = None) -> Roofline:
    for key, bw, peaks in _DEVICES:
        if key.lower() in (name or "").lower():
            return Roofline(bandwidth=bw, peak_flops=peaks.get(dtype_key(dtype)), source="table")
    if measured_bandwidth:
        return Roofline(bandwidth=measured_bandwidth, peak_flops=None, source="measured")
    return Roofline(bandwidth=None, peak_flops=None, source="unknown")


def check(median_ms: float, nbytes: int, flops: int | None, roof: Roofline,
          l2_bytes: int = 0, written: int = 0) -> dict[str, Any] | None:
    """Evidence when `median_ms` beats the BYTES floor by more than the margin; else None.
    `flops` (the reference's) is recorded, never a floor. `written` of `nbytes` are outputs: up
    to `l2_bytes` of them may still sit in L2 (write-back) when the end event fires, so they are
    not counted toward the impossible floor."""
    must = max(0, nbytes - min(max(0, written), max(0, l2_bytes)))
    floor = roof.bytes_ms(must)
    if floor is None or median_ms <= 0:
        return None
    if median_ms < MARGIN * floor:
        return {"median_ms": median_ms, "floor_ms": floor, "bytes": must, "flops": flops,
                "bandwidth": roof.bandwidth, "peak_flops": roof.peak_flops, "source": roof.source}
    return None


def shortcut(median_ms: float, reference_flops: int | None, roof: Roofline) -> dict[str, Any] | None:
    """Evidence when a (correct) candidate is faster than the reference's FLOPs at peak allow,
    by more than the margin: it does less arithmetic than the reference. Else None."""
    floor = roof.flops_ms(reference_flops)
    if floor is None or median_ms <= 0 or median_ms >= MARGIN * floor:
        return None
    return {"median_ms": median_ms, "reference_flop_floor_ms": floor, "reference_flops": reference_flops,
            "peak_flops": roof.peak_flops}


# A floor under this is launch-overhead-sized: a kernel launch and its events cost about 5-10 us
# on an H200, so the fraction measures the overhead, not the kernel (said in the label).
LAUNCH_FLOOR_MS = 0.01


def _pct(fraction: float) -> str:
    pct = fraction * 100
    return f"{pct:.0f} %" if pct >= 10 else f"{pct:.1f} %" if pct >= 1 else f"{pct:.2f} %"


def _ms(ms: float) -> str:
    return f"{ms:.3g} ms" if ms >= 0.1 else f"{ms * 1e3:.3g} us"


def speed_of_light(median_ms: float | None, nbytes: int, own_flops: int | None, roof: Roofline,
                   device: str = "", reference_flops: int | None = None,
                   launch_overhead_sized: bool = False) -> dict[str, Any] | None:
    """How close a measured time is to the hardware: the bytes floor (`nbytes` moved once), the
    FLOP floor of the candidate's OWN arithmetic (None when unknown), and floor / median.
    Keys read by other parts (the agent's prompt among them): bytes_floor_ms, flop_floor_ms,
    fraction, bandwidth, bandwidth_source, label. None when nothing is known."""
    bytes_ms = roof.bytes_ms(nbytes)
    flop_ms = roof.flops_ms(own_flops)
    if median_ms is None or median_ms <= 0 or (bytes_ms is None and flop_ms is None):
        return None
    floor = max(f for f in (bytes_ms, flop_ms) if f is not None)
    fraction = min(1.0, floor / median_ms)
    gpu = device.replace("NVIDIA ", "") or "GPU"
    if flop_ms is not None and (bytes_ms is None or flop_ms > bytes_ms):
        label = f"{_pct(fraction)} of the {gpu}'s compute floor ({_ms(flop_ms)} for its FLOPs at peak)"
        bound = "compute"
    else:
        label = f"{_pct(fraction)} of the {gpu}'s memory floor ({_ms(floor)} to move its bytes once)"
        bound = "memory"
    small = floor < LAUNCH_FLOOR_MS or launch_overhead_sized
    if small:
        label += "; launch-overhead-sized: the floor is under a kernel launch, the fraction measures overhead"
    ref_ms = roof.flops_ms(reference_flops)
    return {"bytes_floor_ms": bytes_ms, "flop_floor_ms": flop_ms, "fraction": fraction,
            "bandwidth": roof.bandwidth, "bandwidth_source": roof.source, "label": label,
            "bytes": nbytes, "flops": own_flops, "bound": bound, "launch_overhead_sized": small,
            "reference_flop_floor_ms": ref_ms, "peak_flops": roof.peak_flops}
