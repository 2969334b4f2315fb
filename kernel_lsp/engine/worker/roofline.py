"""The hardware's floor: no correct kernel is faster than moving its bytes once or doing its
FLOPs at peak. A measured time below that floor is a measurement error or a cheat:
flag it, never show it as a gain. Standard library only.
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
MARGIN = 0.7


@dataclass
class Roofline:
    bandwidth: float | None        # bytes/s
    peak_flops: float | None       # FLOP/s for the dtype
    source: str                    # "table" | "measured" | "unknown"

    def floor_ms(self, nbytes: int, flops: int | None = None) -> float | None:
        """The least time moving `nbytes` once and doing `flops` can take, in ms."""
        floors = []
        if self.bandwidth and nbytes > 0:
            floors.append(nbytes / self.bandwidth * 1e3)
        if self.peak_flops and flops:
            floors.append(flops / self.peak_flops * 1e3)
        return max(floors) if floors else None


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


def check(median_ms: float, nbytes: int, flops: int | None, roof: Roofline) -> dict[str, Any] | None:
    """Evidence when `median_ms` beats the floor by more than the margin; else None."""
    floor = roof.floor_ms(nbytes, flops)
    if floor is None or median_ms <= 0:
        return None
    if median_ms < MARGIN * floor:
        return {"median_ms": median_ms, "floor_ms": floor, "bytes": nbytes, "flops": flops,
                "bandwidth": roof.bandwidth, "peak_flops": roof.peak_flops, "source": roof.source}
    return None
