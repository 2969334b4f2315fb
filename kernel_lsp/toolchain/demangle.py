"""C++ name demangling for ptxas' kernel names: cu++filt, else c++filt, else a small
Itanium reader that recovers the (qualified) function name of simple symbols."""

from __future__ import annotations

import os
import shutil
import subprocess

_cache: dict[str, str] = {}


def _tool(nvcc: str | None) -> str | None:
    if nvcc:
        candidate = os.path.join(os.path.dirname(nvcc), "cu++filt")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("cu++filt") or shutil.which("c++filt")


def demangle(names: list[str], nvcc: str | None = None) -> dict[str, str]:
    """mangled -> demangled ("void foo<64>(float*, int)"); unknown forms map to themselves."""
    todo = [n for n in dict.fromkeys(names) if n not in _cache]
    if todo:
        out: list[str] | None = None
        tool = _tool(nvcc)
        if tool:
            try:
                proc = subprocess.run([tool], input="\n".join(todo) + "\n", capture_output=True,
                                      text=True, timeout=10)
                lines = proc.stdout.splitlines()
                if proc.returncode == 0 and len(lines) == len(todo):
                    out = lines
            except (OSError, subprocess.TimeoutExpired):
                out = None
        if out is None:
            out = [itanium_name(n) or n for n in todo]
        _cache.update(zip(todo, out))
    return {n: _cache.get(n, n) for n in names}


def itanium_name(mangled: str) -> str | None:
    """The qualified function name of `_Z3foo...` / `_ZN2ns3fooE...`; None if not that shape."""
    if not mangled.startswith("_Z"):
        return None
    i = 2
    parts: list[str] = []
    nested = mangled[i:i + 1] == "N"
    if nested:
        i += 1
        while i < len(mangled) and mangled[i] in "rVKL":  # cv/ref qualifiers of methods
            i += 1
    while i < len(mangled):
        if mangled[i] == "E" or not mangled[i].isdigit():
            break
        j = i
        while j < len(mangled) and mangled[j].isdigit():
            j += 1
        length = int(mangled[i:j])
        if j + length > len(mangled):
            return None
        parts.append(mangled[j:j + length])
        i = j + length
        if not nested:
            break
        if mangled[i:i + 1] == "I":  # template args of a scope: not part of the name we need
            break
    if not parts:
        return None
    return "::".join(parts)


def function_name(demangled: str) -> str:
    """`void ns::foo<64>(float*, int)` -> `foo`: the name as written at the definition."""
    text = demangled.strip()
    # Drop the parameter list: the last top-level (...) group.
    if text.endswith(")") or text.endswith(") const"):
        end = text.rfind(")")
        depth = 0
        for k in range(end, -1, -1):
            c = text[k]
            if c == ")":
                depth += 1
            elif c == "(":
                depth -= 1
                if depth == 0:
                    text = text[:k]
                    break
    # Drop trailing template arguments.
    if text.endswith(">"):
        depth = 0
        for k in range(len(text) - 1, -1, -1):
            c = text[k]
            if c == ">":
                depth += 1
            elif c == "<":
                depth -= 1
                if depth == 0:
                    text = text[:k]
                    break
    text = text.strip().split(" ")[-1]  # return type
    return text.split("::")[-1]
