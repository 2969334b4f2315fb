"""On open and save: real nvcc diagnostics and ptxas resources (kernel_lsp.analysis), for
.cu files and for CUDA embedded in Python strings, placed on the user's lines; spill and
occupancy warnings. One publish per compile, carrying the version that was compiled; when
the save is also measured (on_save verify/bench), one publish for the compile and the
measurement together (`DocumentState.settle`)."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from kernel_lsp.analysis import compile_document, kernel_resources, resource_warnings
from kernel_lsp.model import CompileResult
from kernel_lsp.server.commands import DocumentArgs, parse_args
from kernel_lsp.server.feature import LanguageFeature
from kernel_lsp.server.state import Compiled, DocumentState

if TYPE_CHECKING:
    from kernel_lsp.server.jobs import Job


class CompileFeature(LanguageFeature):
    name = "compile"

    def did_open(self, state: DocumentState) -> None:
        self.schedule(state)

    def did_save(self, state: DocumentState) -> None:
        self.schedule(state)

    def dependency_changed(self, state: DocumentState, path: str) -> None:
        self.schedule(state)

    def did_close(self, state: DocumentState) -> None:
        job = self.server.jobs.get(("compile", state.uri))
        if job is not None:
            job.task.cancel()

    def commands(self) -> dict[str, Any]:
        return {"kernel-lsp.check": self.check_command}

    async def check_command(self, *args: Any) -> dict[str, Any]:
        uri = parse_args("kernel-lsp.check", DocumentArgs, args).uri
        state = self.server.state(uri)
        job = self.schedule(state)
        if job is None:
            return {"ok": True, "results": 0, "reason": "not a CUDA or Python file"}
        results = await self.server.jobs.wait(job) or []
        out: dict[str, Any] = {"ok": all(r.ok for r in results), "results": len(results),
                               "version": state.compiled.version if state.compiled else None}
        if not results:
            out["reason"] = "no CUDA source in this file"
        return out

    def schedule(self, state: DocumentState) -> "Job | None":
        """Start the compile of the current text; a running one for the same document is cancelled."""
        if not (state.is_cuda or state.is_python):
            return None
        return self.server.jobs.start(("compile", state.uri), f"nvcc {os.path.basename(state.path)}",
                                      self.run(state, state.text, state.version), uri=state.uri,
                                      visible=False)

    async def run(self, state: DocumentState, text: str, version: int | None) -> list[CompileResult]:
        try:
            return await self._run(state, text, version)
        except BaseException:
            # Cancelled or failed: a measurement of this save that waits for us must still
            # publish, unless a newer compile took our place (it settles the save instead).
            job = self.server.jobs.get(("compile", state.uri))
            replaced = job is not None and job.task is not asyncio.current_task()
            if not replaced and state.settle("compile", version) == "publish":
                self.server.publish(state, {}, version=version)
            raise

    async def _run(self, state: DocumentState, text: str, version: int | None) -> list[CompileResult]:
        ls = self.server
        doc = await ls.document_async(state)
        if doc.text != text:  # typing went on: compile the text this save was for
            from kernel_lsp.source import parse_document

            doc = parse_document(state.path, text, doc)
        if not (state.is_cuda or any(e.kind == "cuda" for e in doc.embedded)):
            if state.settle("compile", version) == "publish":  # the measurement came first
                ls.publish(state, {}, version=version)
            return []
        settings = ls.settings
        # Published even if the user typed on meanwhile: these are the saved text's messages,
        # marked with its version, and the next save replaces them.
        results = await compile_document(doc, settings)
        usage = kernel_resources(doc, results, settings.effective_arch)
        state.compiled = Compiled(version=version, text=text, results=results, resources=usage)
        owned = {
            "compile": [ls.lsp_diagnostic(state, d) for r in results for d in r.diagnostics
                        if d.path in (None, doc.path)],
            "resources": [ls.lsp_diagnostic(state, d) for d in resource_warnings(doc, usage, settings)],
        }
        how = state.settle("compile", version)
        if how == "wait" and not all(r.ok for r in results):
            how = self._measurement_cannot_follow(state)
        if how == "wait":
            state.diagnostics.update(owned)  # published with this save's measurement, once
        else:
            ls.publish(state, owned, version=version)
        ls.refresh_inlay_hints()
        return results

    def _measurement_cannot_follow(self, state: DocumentState) -> str:
        """The saved text does not compile: its errors show now, and the save's measurement
        (which would build the same source) is cancelled rather than published a second time."""
        state.save_publish = None
        job = self.server.jobs.get(("evaluate", state.uri))
        if job is not None and not job.visible:  # only the save's own; a Benchmark the user asked for runs on
            job.reason = "the saved text does not compile"
            job.task.cancel()
        return "publish"
