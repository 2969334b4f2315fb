"""Reading ptxas' `-v` report into ResourceUsage records, one per entry function."""

from __future__ import annotations

import re

from kernel_lsp.model import ResourceUsage

_ENTRY = re.compile(r"^ptxas info\s*: Compiling entry function '(?P<name>[^']+)' for '(?P<arch>\w+)'")
_PROPS = re.compile(r"^ptxas info\s*: Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads")
_USED = re.compile(r"^ptxas info\s*: Used (?P<regs>\d+) registers(?P<rest>.*)$")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


def parse_resources(log: str) -> list[ResourceUsage]:
    """Entry functions in report order; `kernel` is the mangled name until demangled."""
    entries: dict[str, ResourceUsage] = {}
    current: ResourceUsage | None = None
    props_for: str | None = None
    for line in log.splitlines():
        m = _ENTRY.match(line)
        if m:
            name = m["name"]
            current = entries.setdefault(name, ResourceUsage(kernel=name, mangled=name, arch=m["arch"]))
            props_for = None
            continue
        m = _PROPS.match(line)
        if m:
            props_for = m["name"]
            continue
        m = _FRAME.search(line)
        if m and props_for is not None:
            target = entries.get(props_for)
            if target is not None:  # device functions have properties too; we report kernels
                target.stack_bytes = int(m["stack"])
                target.spill_stores = int(m["stores"])
                target.spill_loads = int(m["loads"])
            props_for = None
            continue
        m = _USED.match(line)
        if m and current is not None:
            current.registers = int(m["regs"])
            rest = m["rest"]
            s = _SMEM.search(rest)
            current.shared_bytes = int(s.group(1)) if s else 0
            current.constant_bytes = sum(int(c) for c in _CMEM.findall(rest))
    return list(entries.values())
