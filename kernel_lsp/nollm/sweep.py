"""Launch-configuration variants of a generated file: one kernel at a time.

A generated file holds `CONFIGS = {"kernel": dict(XBLOCK=1024, num_warps=4, num_stages=1), ...}`.
Each variant doubles or halves one block size, or moves num_warps / num_stages one step, for
one kernel, within what the kernel can launch with (the kernel's text, also in the file, says
its numels and which dims have no bounds mask: there a block must divide the numel). With the
Search expanding its best node, that is coordinate descent over every kernel's configuration.

After every kernel's one-parameter moves come its paired moves, the two that coordinate descent
cannot make one step at a time because each half alone is slower: the tile's shape changed at the
same size (one block doubled, another halved: a reduction's rows against its columns), and a block
with its warps (both doubled or both halved: the same work per thread on more or fewer threads).
Inductor's own coordinate descent makes such moves only with `coordinate_descent_search_radius` 2.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .writer import pow2, unmasked_dims

_CONFIG_LINE = re.compile(r"^    '(\w+)': dict\(([^()]*)\),$", re.M)
_NUMEL = re.compile(r"^    (x|y|z|r0_|r1_)numel = (\d+)$", re.M)
_BLOCK_DIM = {"XBLOCK": "x", "YBLOCK": "y", "ZBLOCK": "z", "R0_BLOCK": "r0_", "R1_BLOCK": "r1_"}

# Limits that keep every variant launchable and sane (what they accept / reject):
MAX_BLOCK = {"x": 4096, "y": 1024, "z": 1024, "r0_": 4096, "r1_": 4096}  # larger blocks spill registers
MAX_ELEMENTS = 16384     # elements one program holds (XBLOCK * R0_BLOCK ...): past it, spills
WARPS = (1, 2, 4, 8, 16)  # 16 warps = 512 threads; 32 rejected (rarely faster, often fails to fit)
STAGES = (1, 2, 3, 4)     # software pipelining depth for loops with loads
# A kernel with a tl.dot (a max-autotune GEMM template) pipelines its K loop deeper: Inductor's own
# template configs use 2 to 5 stages.
DOT_STAGES = (1, 2, 3, 4, 5)
MAX_GRID_YZ = 65535      # CUDA's limit on a grid's y and z dimensions


@dataclass(frozen=True)
class KernelFacts:
    name: str
    numels: dict[str, int]
    unmasked: frozenset[str]
    fixed_elements: int  # elements per program from blocks fixed in the text (a persistent R0_BLOCK)
    stages: tuple[int, ...] = STAGES  # the pipeline depths it may take


def configs(source: str) -> dict[str, dict[str, int]]:
    """The CONFIGS table of a generated file ({} when it has none)."""
    out: dict[str, dict[str, int]] = {}
    for m in _CONFIG_LINE.finditer(source):
        cfg: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in m.group(2).split(","))):
            k, _, v = part.partition("=")
            if v.strip().lstrip("-").isdigit():
                cfg[k.strip()] = int(v)
        out[m.group(1)] = cfg
    return out


def kernel_facts(source: str, name: str) -> KernelFacts:
    start = source.find(f"\ndef {name}(")
    end = source.find("\n@triton.jit", start + 1)
    end = source.find("\n\n\n", start + 1) if end < 0 else end
    body = source[start:end if end > 0 else len(source)]
    numels = {m.group(1): int(m.group(2)) for m in _NUMEL.finditer(body)}
    unmasked = frozenset(unmasked_dims(body))
    fixed = 1
    for m in re.finditer(r"^    R\d_BLOCK: tl\.constexpr = (\d+)$", body, re.M):
        fixed *= int(m.group(1))
    return KernelFacts(name, numels, unmasked, fixed, DOT_STAGES if "tl.dot(" in body else STAGES)


def config_ok(facts: KernelFacts, cfg: dict[str, int]) -> bool:
    elements = facts.fixed_elements
    for key, value in cfg.items():
        dim = _BLOCK_DIM.get(key)
        if dim is None:
            continue
        if value < 1 or value & (value - 1) or value > MAX_BLOCK[dim]:
            return False
        numel = facts.numels.get(dim)
        if dim in facts.unmasked and (numel is None or numel % value):
            return False  # no bounds mask: a partial block would read and write out of bounds
        if numel is not None:
            if value > pow2(numel):
                return False  # a block past the whole dim only wastes lanes
        elements *= value
        if dim in ("y", "z") and numel is not None and -(-numel // value) > MAX_GRID_YZ:
            return False  # the launch grid's y and z axes stop at 65535 programs
    if cfg.get("num_warps", 4) not in WARPS or cfg.get("num_stages", 1) not in facts.stages:
        return False
    return elements <= MAX_ELEMENTS


def _render(cfg: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def neighbours(facts: KernelFacts, cfg: dict[str, int]) -> list[tuple[dict[str, int], str]]:
    out: list[tuple[dict[str, int], str]] = []
    for key, value in cfg.items():
        if key in _BLOCK_DIM:
            steps = [value * 2, value // 2]
        elif key == "num_warps":
            i = WARPS.index(value) if value in WARPS else 2
            steps = [WARPS[j] for j in (i + 1, i - 1) if 0 <= j < len(WARPS)]
        elif key == "num_stages":
            i = facts.stages.index(value) if value in facts.stages else 0
            steps = [facts.stages[j] for j in (i + 1, i - 1) if 0 <= j < len(facts.stages)]
        else:
            continue
        for new in steps:
            c = {**cfg, key: new}
            if new != value and config_ok(facts, c):
                out.append((c, f"{key} {value} -> {new}"))
    return out


def paired(facts: KernelFacts, cfg: dict[str, int]) -> list[tuple[dict[str, int], str]]:
    """Two parameters of one kernel moved together: the tile reshaped at the same size, and a block
    with its warps (see the module's docstring)."""
    blocks = [k for k in cfg if k in _BLOCK_DIM]
    moves: list[tuple[tuple[str, int], tuple[str, int]]] = []
    for i, a in enumerate(blocks):
        for b in blocks[i + 1:]:
            moves += [((a, cfg[a] * 2), (b, cfg[b] // 2)), ((a, cfg[a] // 2), (b, cfg[b] * 2))]
    warps = cfg.get("num_warps")
    if warps in WARPS:
        i = WARPS.index(warps)
        for key in blocks:
            if i + 1 < len(WARPS):
                moves.append(((key, cfg[key] * 2), ("num_warps", WARPS[i + 1])))
            if i > 0:
                moves.append(((key, cfg[key] // 2), ("num_warps", WARPS[i - 1])))
    out: list[tuple[dict[str, int], str]] = []
    for (a, va), (b, vb) in moves:
        c = {**cfg, a: va, b: vb}
        if va != cfg[a] and vb != cfg[b] and config_ok(facts, c):
            out.append((c, f"{a} {cfg[a]} -> {va}, {b} {cfg[b]} -> {vb}"))
    return out


def variants(source: str) -> list[tuple[str, str]]:
    """(new source, note) for every one-parameter change of one kernel's launch config, then every
    paired change (so a small budget sees the one-parameter moves of every kernel first)."""
    singles: list[tuple[str, str]] = []
    pairs: list[tuple[str, str]] = []
    for m in _CONFIG_LINE.finditer(source):
        name = m.group(1)
        cfg = configs(m.group(0)).get(name, {})
        facts = kernel_facts(source, name)
        for moves, out in ((neighbours(facts, cfg), singles), (paired(facts, cfg), pairs)):
            for new, note in moves:
                line = f"    {name!r}: dict({_render(new)}),"
                out.append((source[:m.start()] + line + source[m.end():], f"{name}: {note}"))
    return singles + pairs


def with_config(source: str, name: str, cfg: dict[str, int]) -> str:
    """`source` with kernel `name`'s configuration replaced (the max-autotune choice, a recorded one)."""
    for m in _CONFIG_LINE.finditer(source):
        if m.group(1) == name:
            return source[:m.start()] + f"    {name!r}: dict({_render(cfg)})," + source[m.end():]
    return source
