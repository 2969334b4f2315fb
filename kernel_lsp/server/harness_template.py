"""A KernelBench-format harness skeleton for a `.cu` (the "Create a harness" action).

The skeleton names the exported function, maps its C parameters to ctypes, and leaves the
parts only the author knows (the reference Model, the input shapes) as clear TODOs that
fail loudly rather than measure something made up.
"""

from __future__ import annotations

import os

from kernel_lsp.source import Document

_CTYPES = {"int": "ctypes.c_int", "unsigned": "ctypes.c_uint", "long": "ctypes.c_long",
           "size_t": "ctypes.c_size_t", "int64_t": "ctypes.c_int64", "float": "ctypes.c_float",
           "double": "ctypes.c_double", "bool": "ctypes.c_bool"}


def _ctype(param_type: str) -> str:
    t = param_type.replace("const", "").strip()
    if "*" in t or "cudaStream_t" in t:
        return "ctypes.c_void_p"
    return _CTYPES.get(t.split()[-1] if t else "int", "ctypes.c_int")


def _identifier(name: str, index: int) -> str:
    """A C parameter name as a Python name (keywords and unnamed parameters renamed)."""
    import keyword

    name = name.strip().lstrip("*&").strip()
    if not name.isidentifier():
        return f"arg{index}"
    return f"{name}_" if keyword.iskeyword(name) else name


def _comment(text: str) -> str:
    return " ".join(text.split())


def harness_for(doc: Document) -> str:
    stem = os.path.splitext(os.path.basename(doc.path))[0]
    export = next((e for e in doc.exports if e.via == "extern_c"), None) or (doc.exports[0] if doc.exports else None)
    entry = export.name if export else "TODO_exported_function"
    fn = doc.host_function(export.function or export.name) if export else None
    params = fn.params if fn else []
    args = []
    for i, p in enumerate(params):
        ptype = " ".join(str(p.get("type", "int")).split())
        name = _identifier(str(p.get("name") or ""), i)
        if "cudaStream_t" in ptype:
            args.append(("ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)", f"{ptype} {name}"))
        elif "*" in ptype:
            args.append((f"ctypes.c_void_p({name}.data_ptr())", f"{ptype} {name}"))
        else:
            args.append((f"{_ctype(ptype)}({name})", f"{ptype} {name}"))
    # The comma goes before the comment: `f(a,  # const float* a` parses, `f(a  # ..., ` does not.
    call = "\n        ".join(f"{code},  # {_comment(what)}" for code, what in args)
    return f'''"""KernelBench harness for {stem}.cu: the reference, its inputs, and how {entry} stands in
for Model.forward. Written by kernel-lsp; fill in the TODOs."""

import ctypes

import torch
import torch.nn as nn

ENTRY = "{entry}"


class Model(nn.Module):
    """The reference: what {stem}.cu must compute, in plain PyTorch."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError({f"TODO: write the reference computation of {stem}.cu"!r})


def get_inputs():
    # TODO: shapes and dtypes the kernel is meant for (random data, never zeros).
    return [torch.randn(4096, 4096, device="cuda")]


def get_init_inputs():
    return []


def kernel_forward(lib, model, *inputs):
    # TODO: allocate outputs and pass each argument of {entry} in order.
    out = torch.empty_like(inputs[0])
    lib.{entry}(
        {call}
    )
    return out
'''
