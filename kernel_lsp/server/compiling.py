"""On open and save: real nvcc diagnostics and ptxas resources, for .cu files and for CUDA
embedded in Python strings, placed on the user's lines; spill and occupancy warnings."""

from __future__ import annotations

import os

from kernel_lsp.analysis import compile_document, kernel_resources, resource_warnings
from kernel_lsp.model import CompileResult
from kernel_lsp.server.app import KernelLanguageServer, is_cuda


def register(server: KernelLanguageServer) -> None:
    @server.command("kernel-lsp.check")
    async def check_command(ls: KernelLanguageServer, args: dict | None = None) -> dict:
        from kernel_lsp.server.evaluations import uri_arg

        job = schedule(ls, uri_arg(args, "kernel-lsp.check"))
        results = (await ls.jobs.wait(job) or []) if job else []
        return {"ok": all(r.ok for r in results), "results": len(results)}


def schedule(ls: KernelLanguageServer, uri: str):
    """Start the compile job of `uri`; a running one for the same document is cancelled."""
    if not (is_cuda(uri) or uri.endswith(".py")):
        return None
    return ls.jobs.start(("compile", uri), f"nvcc {os.path.basename(ls.path(uri))}",
                         run_compile(ls, uri), uri=uri, visible=False)


async def run_compile(ls: KernelLanguageServer, uri: str) -> list[CompileResult]:
    doc = await ls.document_async(uri)
    if not (is_cuda(uri) or any(e.kind == "cuda" for e in doc.embedded)):
        return []
    # Published even if the user typed on meanwhile: these are the saved text's messages,
    # and the next save replaces them.
    results = await compile_document(doc, ls.settings)
    usage = kernel_resources(doc, results, ls.settings.effective_arch)
    ls.resources[uri] = usage
    ls.set_diagnostics(uri, "compile", [
        ls.lsp_diagnostic(uri, d) for r in results for d in r.diagnostics
        if d.path in (None, doc.path)
    ])
    ls.set_diagnostics(uri, "resources", [
        ls.lsp_diagnostic(uri, d) for d in resource_warnings(doc, usage, ls.settings)
    ])
    refresh_inlay_hints(ls)
    return results


def refresh_inlay_hints(ls: KernelLanguageServer) -> None:
    workspace = ls.client_capabilities.workspace
    inlay = workspace.inlay_hint if workspace else None
    if inlay and inlay.refresh_support:
        ls.workspace_inlay_hint_refresh(None)
