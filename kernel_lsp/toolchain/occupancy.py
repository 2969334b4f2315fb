"""Theoretical occupancy: the arithmetic of NVIDIA's occupancy calculator.

Follows `cuda_occupancy.h` (CUDA 13): registers are allocated per warp in units of
256 and split across 4 sub-partitions; shared memory is allocated per block in
units of 128 B (256 B before Ampere) plus 1 KB the driver reserves per block on
sm_80 and later; the SM's carveout is assumed at its maximum (the driver picks the
carveout a kernel needs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_THREADS_PER_BLOCK = 256  # used when neither __launch_bounds__ nor a launch site says


@dataclass(frozen=True)
class ArchLimits:
    max_warps_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm: int            # bytes, at the largest carveout
    max_smem_per_block: int     # bytes, with the dynamic shared memory opt-in
    reserved_smem_per_block: int
    smem_granularity: int
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    max_regs_per_thread: int = 255
    reg_granularity: int = 256  # registers, per warp
    sub_partitions: int = 4
    max_threads_per_block: int = 1024
    warp_size: int = 32


_K = 1024
ARCH_LIMITS: dict[int, ArchLimits] = {
    70: ArchLimits(64, 32, 96 * _K, 96 * _K, 0, 256),
    72: ArchLimits(64, 32, 96 * _K, 96 * _K, 0, 256),
    75: ArchLimits(32, 16, 64 * _K, 64 * _K, 0, 256),
    80: ArchLimits(64, 32, 164 * _K, 163 * _K, _K, 128),
    86: ArchLimits(48, 16, 100 * _K, 99 * _K, _K, 128),
    87: ArchLimits(48, 16, 164 * _K, 163 * _K, _K, 128),
    89: ArchLimits(48, 24, 100 * _K, 99 * _K, _K, 128),
    90: ArchLimits(64, 32, 228 * _K, 227 * _K, _K, 128),
    100: ArchLimits(64, 32, 228 * _K, 227 * _K, _K, 128),
    103: ArchLimits(64, 32, 228 * _K, 227 * _K, _K, 128),
    120: ArchLimits(48, 24, 100 * _K, 99 * _K, _K, 128),
    121: ArchLimits(48, 24, 100 * _K, 99 * _K, _K, 128),
}

_ARCH_RE = re.compile(r"^(?:sm|compute)_(\d+)[af]?$")


def arch_number(arch: str) -> int:
    """`sm_90a` -> 90. Raises ValueError for anything that is not an sm_/compute_ name."""
    m = _ARCH_RE.match(arch.strip())
    if not m:
        raise ValueError(f"not a CUDA architecture name: {arch!r} (expected e.g. 'sm_90')")
    return int(m.group(1))


def arch_limits(arch: str) -> ArchLimits:
    number = arch_number(arch)
    limits = ARCH_LIMITS.get(number)
    if limits is None:
        known = ", ".join(f"sm_{n}" for n in sorted(ARCH_LIMITS))
        raise ValueError(f"no occupancy data for {arch!r}; known: {known}")
    return limits


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def occupancy(
    arch: str,
    threads_per_block: int | None,
    registers: int,
    shared_bytes: int,
    dynamic_shared: int = 0,
) -> tuple[float, str]:
    """Theoretical occupancy (active warps / max warps per SM, 0..1) and what limits it.

    `threads_per_block=None` means "not known": DEFAULT_THREADS_PER_BLOCK (256) is assumed.
    The limiter is one of "registers", "shared memory", "blocks", "threads" ("warps"
    per SM). A configuration that cannot launch at all gives (0.0, reason).
    """
    lim = arch_limits(arch)
    threads = DEFAULT_THREADS_PER_BLOCK if threads_per_block is None else threads_per_block
    if threads <= 0:
        raise ValueError(f"threads_per_block must be positive, got {threads}")
    if registers < 0 or shared_bytes < 0 or dynamic_shared < 0:
        raise ValueError("registers and shared memory sizes must not be negative")
    if threads > lim.max_threads_per_block:
        return 0.0, "threads"

    warps_per_block = -(-threads // lim.warp_size)
    limits: dict[str, int] = {}

    # Warps (threads) per SM and blocks per SM.
    limits["threads"] = lim.max_warps_per_sm // warps_per_block
    limits["blocks"] = lim.max_blocks_per_sm

    # Registers: per warp, rounded to the allocation unit, per sub-partition.
    if registers > 0:
        regs_per_warp = _round_up(registers * lim.warp_size, lim.reg_granularity)
        assumed = regs_per_warp * _round_up(warps_per_block, lim.sub_partitions)
        if registers > lim.max_regs_per_thread or assumed > lim.regs_per_block:
            return 0.0, "registers"
        warps_per_partition = (lim.regs_per_sm // lim.sub_partitions) // regs_per_warp
        limits["registers"] = (warps_per_partition * lim.sub_partitions) // warps_per_block

    # Shared memory: static + dynamic + the driver's reserve, rounded to the unit.
    smem = shared_bytes + dynamic_shared
    if smem > 0:
        if smem > lim.max_smem_per_block:
            return 0.0, "shared memory"
        per_block = _round_up(smem + lim.reserved_smem_per_block, lim.smem_granularity)
        limits["shared memory"] = lim.smem_per_sm // per_block

    # The smallest limit wins; on a tie the hardware ceiling is named, since using
    # fewer registers or less shared memory would not raise occupancy.
    order = ["threads", "blocks", "registers", "shared memory"]
    limiter = min(order, key=lambda name: (limits.get(name, 1 << 30), order.index(name)))
    blocks = limits[limiter]
    if blocks <= 0:
        return 0.0, limiter
    active_warps = blocks * warps_per_block
    return min(1.0, active_warps / lim.max_warps_per_sm), limiter
