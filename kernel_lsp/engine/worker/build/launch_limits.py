"""Say which limit a failed launch passed, instead of "CUDA error: invalid argument".

A launch asking for more shared memory per block than the GPU allows fails with
cudaErrorInvalidValue ("invalid argument"), or leaves its output unwritten when nobody checks
(a silent launch failure). The request is static shared memory (ptxas' report of the build) plus the dynamic
size in the launch's third `<<<grid, block, bytes>>>` argument; the GPU allows
`sharedMemPerBlock` (48 KiB) without opt-in and `sharedMemPerBlockOptin` (227 KiB on
H100/H200) with `cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, n)`.

Standard library only: the Worker passes the device's limits in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

LAUNCH_FAILURES = ("invalid argument", "too many resources requested for launch", "out of resources",
                   "invalid configuration argument")

_LAUNCH = re.compile(r"\b(\w+)\s*<<<\s*([^;]*?)>>>")
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+\(?([^\n/]+?)\)?[ \t]*(?://.*)?$", re.M)
_CONST = re.compile(r"\b(?:static\s+)?(?:constexpr|const)\s+(?:unsigned\s+)?(?:int|long|size_t|unsigned)\s+"
                    r"([A-Za-z_]\w*)\s*=\s*([^;]+);")
_SIZEOF = {"float": 4, "int": 4, "unsigned": 4, "double": 8, "half": 2, "__half": 2, "__nv_bfloat16": 2,
           "float4": 16, "float2": 8, "int4": 16, "char": 1, "uint8_t": 1, "int64_t": 8, "long": 8}
_OPT_IN = "cudaFuncAttributeMaxDynamicSharedMemorySize"


@dataclass(frozen=True)
class Limits:
    per_block: int          # bytes without opt-in (sharedMemPerBlock)
    per_block_optin: int    # bytes with cudaFuncSetAttribute (sharedMemPerBlockOptin)
    device: str = ""


def _split_args(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _value(expr: str, names: dict[str, str], depth: int = 0) -> int | None:
    """An integer expression of literals, sizeof(type) and constants; None otherwise."""
    if depth > 8:
        return None
    expr = re.sub(r"sizeof\s*\(\s*([\w:]+)\s*\)", lambda m: str(_SIZEOF.get(m.group(1).split("::")[-1], "?")), expr)
    expr = re.sub(r"(\d+)[uUlL]+\b", r"\1", expr)
    expr = re.sub(r"\((?:size_t|int|unsigned|long)\)", "", expr)

    def name(m: re.Match[str]) -> str:
        v = names.get(m.group(0))
        if v is None:
            return "?"
        got = _value(v, names, depth + 1)
        return str(got) if got is not None else "?"

    expr = re.sub(r"[A-Za-z_]\w*", name, expr)
    if "?" in expr or not re.fullmatch(r"[\d\s*+\-/()<]+", expr):
        return None
    try:
        return int(eval(expr.replace("/", "//"), {"__builtins__": {}}, {}))  # digits and operators only
    except Exception:
        return None


def dynamic_requests(source: str) -> list[dict[str, Any]]:
    """Every launch with a dynamic shared memory argument: kernel, line (1-based), expr, bytes or None."""
    names = {m.group(1): m.group(2) for m in _DEFINE.finditer(source)}
    names.update({m.group(1): m.group(2) for m in _CONST.finditer(source)})
    out = []
    for m in _LAUNCH.finditer(source):
        args = _split_args(m.group(2))
        if len(args) < 3:
            continue
        out.append({"kernel": m.group(1), "line": source.count("\n", 0, m.start()) + 1, "expr": args[2],
                    "bytes": _value(args[2], names)})
    return out


def _kib(n: int) -> str:
    return f"{n} bytes ({n / 1024:.0f} KiB)"


def explain(message: str, source: str, static: dict[str, int], limits: Limits,
            definite_only: bool = False) -> str | None:
    """A sentence naming the shared-memory limit a failed launch passed; None when the failure
    does not look like one (or nothing in the source asks for that much). `definite_only`:
    only requests whose size is known (for an unchecked launch that left output unwritten)."""
    low = message.lower()
    if not definite_only and not any(w in low for w in LAUNCH_FAILURES):
        return None
    opted_in = _OPT_IN in source
    found = []
    for req in dynamic_requests(source):
        kernel = req["kernel"]
        stat = static.get(kernel, 0)
        dyn = req["bytes"]
        if dyn is None:
            if definite_only:
                continue
            found.append(f"the launch of {kernel} at line {req['line']} asks for `{req['expr']}` bytes of "
                         f"dynamic shared memory (+{stat} static)")
            continue
        total = dyn + stat
        if total > limits.per_block_optin:
            found.append(f"the launch of {kernel} at line {req['line']} asks for {_kib(total)} of shared memory "
                         f"per block ({dyn} dynamic + {stat} static), more than this GPU's per-block opt-in "
                         f"limit of {_kib(limits.per_block_optin)}")
        elif total > limits.per_block and not opted_in:
            found.append(f"the launch of {kernel} at line {req['line']} asks for {_kib(total)} of shared memory "
                         f"per block ({dyn} dynamic + {stat} static), more than the {_kib(limits.per_block)} "
                         f"allowed without opt-in: call cudaFuncSetAttribute({kernel}, {_OPT_IN}, bytes) "
                         f"first (up to {_kib(limits.per_block_optin)} on this GPU)")
    for kernel, stat in static.items():
        if stat > limits.per_block:
            found.append(f"{kernel} declares {_kib(stat)} of static shared memory, more than the "
                         f"{_kib(limits.per_block)} a block may have statically (use dynamic shared memory "
                         f"with the opt-in above that)")
    if not found:
        return None
    where = f" ({limits.device})" if limits.device else ""
    return "; ".join(found) + f"; limits{where}: {_kib(limits.per_block)} per block, " \
        f"{_kib(limits.per_block_optin)} with opt-in"
