"""Compile analysis of a document: what the server shows and `kernel-lsp check` prints.

nvcc diagnostics and ptxas resources for .cu files and for CUDA embedded in Python strings,
with the occupancy the source's block size implies and warnings for spills and low occupancy.
No LSP and no command line here: both front ends call these functions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

from kernel_lsp.config import Settings
from kernel_lsp.model import CompileResult, Diagnostic, ResourceUsage, Span, TargetKind
from kernel_lsp.source import Document
from kernel_lsp.toolchain import CompileOptions, compile_check, occupancy
from kernel_lsp.toolchain.compile import Around
from kernel_lsp.toolchain.load_inline import wrap

DEFAULT_THREADS = 256  # when neither __launch_bounds__ nor a literal launch says
TORCH_HEADERS_TIMEOUT = 900.0  # seconds: torch/extension.h is a large translation unit


def compile_options(settings: Settings, path: str, torch_headers: bool = False) -> CompileOptions:
    includes = [*settings.include_paths, os.path.dirname(os.path.abspath(path))]
    return CompileOptions(
        nvcc=settings.nvcc or "nvcc",
        arch=settings.effective_arch,
        flags=list(settings.extra_flags),
        include_paths=includes,
        torch_headers=torch_headers,
    )


async def compile_document(doc: Document, settings: Settings) -> list[CompileResult]:
    """Compile a document's CUDA: the file itself, or each embedded CUDA source in a .py.

    Results are cached in memory and on disk by content, so an unchanged source answers at
    once, also after a restart. Embedded sources are built as load_inline builds them: CUDA
    sources after its implicit headers (torch/types.h, cuda.h, cuda_runtime.h), C++ sources
    after torch/extension.h and before the PYBIND11_MODULE of `functions` (none of it with
    no_implicit_headers=True). torch's headers take nvcc minutes on a small machine the
    first time: they get a longer limit.
    """
    cache = compile_cache_dir()
    if doc.path.endswith(".py"):
        jobs = [
            compile_check(emb.text, path=doc.path,
                          options=compile_options(settings, doc.path, torch_headers=True),
                          line_map=emb.to_document, timeout=TORCH_HEADERS_TIMEOUT, cache_dir=cache,
                          around=load_inline_around(emb.kind, emb.functions, emb.implicit_headers))
            for emb in doc.embedded if emb.kind in ("cuda", "cpp")
        ]
        return list(await asyncio.gather(*jobs))
    return [await compile_check(doc.text, path=doc.path, options=compile_options(settings, doc.path),
                                cache_dir=cache)]


def load_inline_around(kind: str, functions: list[str], implicit: bool) -> Around:
    """What load_inline compiles around an embedded `kind` source, as an Around."""
    w = wrap(kind, functions, implicit)
    which = "cuda_sources" if kind == "cuda" else "cpp_sources"
    return Around(prelude=w.prelude, postlude=w.postlude,
                  prelude_note=f"a header load_inline adds before {which}",
                  postlude_note="in the PYBIND11_MODULE load_inline writes for functions=[...]")


def compile_cache_dir() -> str:
    base = os.environ.get("KERNEL_LSP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kernel-lsp")
    return os.path.join(base, "compile")


def kernel_resources(doc: Document, results: list[CompileResult], arch: str) -> dict[str, ResourceUsage]:
    """ptxas' report per kernel name, with occupancy for the block size the source implies."""
    kernels = {t.name: t for t in doc.targets if t.kind == TargetKind.CUDA_KERNEL}
    # ptxas knows nothing of launch sites: __launch_bounds__ (resolved by the toolchain) first,
    # else the block size the source reader resolved at a launch of the kernel.
    launch_blocks = {launch.kernel: launch.block_threads for launch in doc.launches if launch.block_threads}
    usage: dict[str, ResourceUsage] = {}
    for result in results:
        for res in result.resources:
            threads = res.threads_per_block or (
                launch_blocks.get(res.kernel, DEFAULT_THREADS) if res.kernel in kernels else None)
            if threads:
                occ, limiter = occupancy(arch, threads, res.registers, res.shared_bytes)
                res = dataclasses.replace(res, threads_per_block=threads, occupancy=occ,
                                          occupancy_limiter=limiter)
            usage.setdefault(res.kernel, res)
    return usage


def resource_warnings(doc: Document, usage: dict[str, ResourceUsage], settings: Settings) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for target in doc.targets:
        if target.kind != TargetKind.CUDA_KERNEL or target.name not in usage:
            continue
        res = usage[target.name]
        span: Span = target.name_span
        if res.spill_stores or res.spill_loads:
            out.append(Diagnostic(span, "warning", (
                f"{target.name} spills registers to local memory: {res.spill_stores} bytes stored, "
                f"{res.spill_loads} bytes loaded ({res.registers} registers, {res.arch}). "
                "Fewer live values, smaller per-thread arrays or looser __launch_bounds__ help."),
                source="kernel-lsp", code="spill"))
        if res.occupancy is not None and res.occupancy < settings.occupancy_threshold:
            out.append(Diagnostic(span, "warning", (
                f"{target.name}: theoretical occupancy {res.occupancy:.0%} at {res.threads_per_block} "
                f"threads per block, limited by {res.occupancy_limiter} ({res.registers} registers, "
                f"{res.shared_bytes} B shared; threshold {settings.occupancy_threshold:.0%})."),
                source="kernel-lsp", code="occupancy"))
    return out


def describe(res: ResourceUsage) -> str:
    """One line for hovers and the CLI table."""
    parts = [f"{res.registers} registers", f"{res.shared_bytes} B shared", f"{res.stack_bytes} B stack"]
    parts.append(f"spills {res.spill_stores}/{res.spill_loads} B" if (res.spill_stores or res.spill_loads)
                 else "no spills")
    if res.occupancy is not None:
        parts.append(f"occupancy {res.occupancy:.0%} at {res.threads_per_block} threads"
                     + (f" (limited by {res.occupancy_limiter})" if res.occupancy_limiter else ""))
    return " · ".join(parts) + f" · {res.arch}"
