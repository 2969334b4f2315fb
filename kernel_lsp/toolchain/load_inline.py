"""What `torch.utils.cpp_extension.load_inline` adds around the strings it is given, so the
compile check builds an embedded source as load_inline does.

load_inline writes `main.cpp` = its implicit C++ header(s) + `cpp_sources` + a
`PYBIND11_MODULE` binding each name of `functions`, and `cuda.cu` = its implicit CUDA
headers + `cuda_sources`; `no_implicit_headers=True` drops the headers. Which headers
depends on the torch version: they are read from the installed torch's
`torch/utils/cpp_extension.py` (found without importing torch), with the rules of torch
2.5-2.13 as the fallback.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass

# torch 2.13's rules (and 2.11's, on the GPU machine): the fallback when the file is not there.
DEFAULT_HEADERS: dict[str, tuple[str, ...]] = {
    "cpp": ("torch/extension.h",),
    "cuda": ("torch/types.h", "cuda.h", "cuda_runtime.h"),
}

_INSERT = re.compile(r"\b(cpp|cuda)_sources\.insert\(\s*(\d+)\s*,\s*['\"]#include\s*<([^>]+)>['\"]\s*\)")


def headers_from_text(text: str) -> dict[str, tuple[str, ...]]:
    """The implicit headers a cpp_extension.py inserts, per kind, in order."""
    found: dict[str, list[tuple[int, str]]] = {"cpp": [], "cuda": []}
    for m in _INSERT.finditer(text):
        found[m.group(1)].append((int(m.group(2)), m.group(3)))
    return {kind: tuple(h for _, h in sorted(items)) for kind, items in found.items()}


def _cpp_extension_path() -> str | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "cpp_extension.py")
    return path if os.path.isfile(path) else None


@functools.cache
def implicit_headers() -> dict[str, tuple[str, ...]]:
    """The installed torch's implicit headers per kind ("cpp", "cuda")."""
    path = _cpp_extension_path()
    if path is None:
        return dict(DEFAULT_HEADERS)
    try:
        with open(path, encoding="utf-8") as f:
            found = headers_from_text(f.read())
    except OSError:
        return dict(DEFAULT_HEADERS)
    return {kind: found.get(kind) or DEFAULT_HEADERS[kind] for kind in DEFAULT_HEADERS}


@dataclass(frozen=True)
class Wrapped:
    """An embedded source as load_inline writes it: `prelude` + the user's text + `postlude`."""

    prelude: str
    postlude: str
    headers: tuple[str, ...]

    @property
    def prelude_lines(self) -> int:
        return self.prelude.count("\n")

    def text(self, source: str) -> str:
        return self.prelude + source + self.postlude


def wrap(kind: str, functions: list[str] | tuple[str, ...] = (), implicit: bool = True,
         headers: dict[str, tuple[str, ...]] | None = None) -> Wrapped:
    """What load_inline puts around a `kind` ("cpp" | "cuda") source; `implicit=False` is
    `no_implicit_headers=True`. The PYBIND11_MODULE of `functions` goes after C++ sources."""
    rules = headers if headers is not None else implicit_headers()
    chosen = rules.get(kind, ()) if implicit else ()
    prelude = "".join(f"#include <{h}>\n" for h in chosen)
    postlude = ""
    if kind == "cpp" and functions:
        defs = "".join(f'm.def("{f}", {f}, "{f}");\n' for f in functions)
        postlude = f"\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}}}\n"
    return Wrapped(prelude=prelude, postlude=postlude, headers=tuple(chosen))
