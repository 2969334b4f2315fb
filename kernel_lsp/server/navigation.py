"""Document symbols for Targets, hovers over kernels, inlay hints after kernel names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsprotocol import types

from kernel_lsp.analysis import describe
from kernel_lsp.model import Target, TargetKind
from kernel_lsp.server.feature import LanguageFeature
from kernel_lsp.server.state import DocumentState

if TYPE_CHECKING:
    from kernel_lsp.server.app import KernelLanguageServer

_SYMBOL_KIND = {
    TargetKind.CUDA_KERNEL: types.SymbolKind.Function,
    TargetKind.HOST_EXPORT: types.SymbolKind.Function,
    TargetKind.TASK_MODEL: types.SymbolKind.Class,
    TargetKind.CANDIDATE_MODEL: types.SymbolKind.Class,
    TargetKind.NN_MODULE: types.SymbolKind.Class,
    TargetKind.TRITON_KERNEL: types.SymbolKind.Function,
    TargetKind.EMBEDDED_CUDA: types.SymbolKind.String,
}

_KIND_WORD = {
    TargetKind.CUDA_KERNEL: "CUDA kernel",
    TargetKind.HOST_EXPORT: "exported host function",
    TargetKind.TASK_MODEL: "reference Model",
    TargetKind.CANDIDATE_MODEL: "candidate ModelNew",
    TargetKind.NN_MODULE: "nn.Module",
    TargetKind.TRITON_KERNEL: "Triton kernel",
    TargetKind.EMBEDDED_CUDA: "embedded CUDA source",
}


class NavigationFeature(LanguageFeature):
    """Symbols, hover and inlay hints: answered from the parse and the last compile, at once."""

    name = "navigation"

    def register(self, ls: "KernelLanguageServer") -> None:
        @ls.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
        def document_symbol(params: types.DocumentSymbolParams):
            return self.symbols(ls.state(params.text_document.uri))

        @ls.feature(types.TEXT_DOCUMENT_HOVER)
        def hover(params: types.HoverParams) -> types.Hover | None:
            return self.hover_at(ls.state(params.text_document.uri), params.position)

        @ls.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions(resolve_provider=False))
        def inlay_hint(params: types.InlayHintParams) -> list[types.InlayHint]:
            return self.inlay_hints(ls.state(params.text_document.uri), params.range)

    def symbols(self, state: DocumentState) -> list[dict]:
        ls = self.server
        doc = ls.document(state)
        if state._symbols is not None and state._symbols[0] is doc:
            return state._symbols[1]
        # Plain JSON, not lsprotocol objects: unstructuring hundreds of attrs records costs
        # tens of milliseconds on the event loop, and a parse is immutable, so cache it.
        positions = ls.positions(state)
        symbols = [
            {
                "name": t.name,
                "detail": t.detail or _KIND_WORD.get(t.kind, ""),
                "kind": int(_SYMBOL_KIND.get(t.kind, types.SymbolKind.Function)),
                "range": _json_range(positions, t.span),
                "selectionRange": _json_range(positions, t.name_span),
            }
            for t in doc.targets
        ]
        state._symbols = (doc, symbols)
        return symbols

    def hover_at(self, state: DocumentState, position: types.Position) -> types.Hover | None:
        ls = self.server
        doc = ls.document(state)
        positions = ls.positions(state)
        line, col = positions.point(position)
        target = doc.target_at(line, col)
        if target is None:
            return None
        sections = ls.collect("hover", state, target)  # navigation's own part comes first
        return types.Hover(
            contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value="\n\n".join(sections)),
            range=positions.range(target.name_span),
        )

    def hover(self, state: DocumentState, target: Target) -> list[str]:
        lines = [f"**{target.name}**: {_KIND_WORD.get(target.kind, target.kind.value)}"]
        if target.detail:
            lines.append(f"```\n{target.detail}\n```")
        if target.kind != TargetKind.CUDA_KERNEL:
            return lines
        compiled = state.compiled
        res = compiled.resources.get(target.name) if compiled else None
        if res is not None:
            when = f"version {compiled.version}" if compiled.version is not None else "the saved text"
            if state.compile_stale:
                when += ", edited since: save to compile again"
            lines.append(f"**Resources** ({res.arch}, compiled from {when}): {res.registers} registers · "
                         f"{res.shared_bytes} B shared · {res.stack_bytes} B stack · "
                         f"spill stores {res.spill_stores} B · spill loads {res.spill_loads} B")
            if res.occupancy is not None:
                lines.append(f"**Occupancy** (theoretical): {res.occupancy:.0%} at "
                             f"{res.threads_per_block} threads per block"
                             + (f", limited by {res.occupancy_limiter}" if res.occupancy_limiter else ""))
        elif self.server.jobs.get(("compile", state.uri)) is not None:
            lines.append("_nvcc is compiling this file…_")
        else:
            lines.append("_No resource report yet: save the file to compile it._")
        return lines

    def inlay_hints(self, state: DocumentState, rng: types.Range) -> list[types.InlayHint]:
        ls = self.server
        doc = ls.document(state)
        usage = state.compiled.resources if state.compiled else {}
        stale = state.compile_stale
        positions = ls.positions(state)
        hints = []
        for t in doc.targets:
            res = usage.get(t.name)
            if t.kind != TargetKind.CUDA_KERNEL or res is None:
                continue
            if not (rng.start.line <= t.name_span.end_line <= rng.end.line):
                continue
            label = f"{res.registers} regs"
            if res.spill_stores or res.spill_loads:
                label += f" · spills {res.spill_stores} B"
            if res.occupancy is not None:
                label += f" · {res.occupancy:.0%} occ"
            if stale:
                label += " (edited since compiled)"
            hints.append(types.InlayHint(
                position=positions.position(t.name_span.end_line, t.name_span.end_col),
                label=label, kind=types.InlayHintKind.Type, padding_left=True, padding_right=True,
                tooltip=describe(res),
            ))
        return hints


def _json_range(positions, span) -> dict:
    start = positions.position(span.start_line, span.start_col)
    end = positions.position(span.end_line, span.end_col)
    return {"start": {"line": start.line, "character": start.character},
            "end": {"line": end.line, "character": end.character}}
