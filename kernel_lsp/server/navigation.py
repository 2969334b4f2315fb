"""Document symbols for Targets, hovers over kernels, inlay hints after kernel names."""

from __future__ import annotations

from lsprotocol import types

from kernel_lsp.model import Target, TargetKind
from kernel_lsp.server.app import KernelLanguageServer
from kernel_lsp.analysis import describe
from kernel_lsp.server import evaluations

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


def register(server: KernelLanguageServer) -> None:
    @server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
    def document_symbol(ls: KernelLanguageServer, params: types.DocumentSymbolParams):
        uri = params.text_document.uri
        doc = ls.document(uri)
        cached = ls.symbols.get(uri)
        if cached is not None and cached[0] is doc:
            return cached[1]
        # Plain JSON, not lsprotocol objects: unstructuring hundreds of attrs records costs
        # tens of milliseconds on the event loop, and a parse is immutable, so cache it.
        positions = ls.positions(uri)
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
        ls.symbols[uri] = (doc, symbols)
        return symbols

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(ls: KernelLanguageServer, params: types.HoverParams) -> types.Hover | None:
        uri = params.text_document.uri
        doc = ls.document(uri)
        positions = ls.positions(uri)
        line, col = positions.point(params.position)
        target = doc.target_at(line, col)
        if target is None:
            return None
        return types.Hover(
            contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=hover_text(ls, uri, target)),
            range=positions.range(target.name_span),
        )

    @server.feature(types.TEXT_DOCUMENT_INLAY_HINT,
                    types.InlayHintOptions(resolve_provider=False))
    def inlay_hint(ls: KernelLanguageServer, params: types.InlayHintParams) -> list[types.InlayHint]:
        uri = params.text_document.uri
        doc = ls.document(uri)
        usage = ls.resources.get(uri, {})
        positions = ls.positions(uri)
        hints = []
        for t in doc.targets:
            res = usage.get(t.name)
            if t.kind != TargetKind.CUDA_KERNEL or res is None:
                continue
            if not (params.range.start.line <= t.name_span.end_line <= params.range.end.line):
                continue
            label = f"{res.registers} regs"
            if res.spill_stores or res.spill_loads:
                label += f" · spills {res.spill_stores} B"
            if res.occupancy is not None:
                label += f" · {res.occupancy:.0%} occ"
            hints.append(types.InlayHint(
                position=positions.position(t.name_span.end_line, t.name_span.end_col),
                label=label, kind=types.InlayHintKind.Type, padding_left=True,
                tooltip=describe(res),
            ))
        return hints


def _json_range(positions, span) -> dict:
    start = positions.position(span.start_line, span.start_col)
    end = positions.position(span.end_line, span.end_col)
    return {"start": {"line": start.line, "character": start.character},
            "end": {"line": end.line, "character": end.character}}


def hover_text(ls: KernelLanguageServer, uri: str, target: Target) -> str:
    lines = [f"**{target.name}**: {_KIND_WORD.get(target.kind, target.kind.value)}"]
    if target.detail:
        lines.append(f"```\n{target.detail}\n```")
    res = ls.resources.get(uri, {}).get(target.name)
    if target.kind == TargetKind.CUDA_KERNEL:
        if res is not None:
            lines.append(f"**Resources** ({res.arch}): {res.registers} registers · "
                         f"{res.shared_bytes} B shared · {res.stack_bytes} B stack · "
                         f"spill stores {res.spill_stores} B · spill loads {res.spill_loads} B")
            if res.occupancy is not None:
                lines.append(f"**Occupancy** (theoretical): {res.occupancy:.0%} at "
                             f"{res.threads_per_block} threads per block"
                             + (f", limited by {res.occupancy_limiter}" if res.occupancy_limiter else ""))
        elif ("compile", uri) in {j.key for j in ls.jobs.running(visible_only=False)}:
            lines.append("_nvcc is compiling this file…_")
        else:
            lines.append("_No resource report yet: save the file to compile it._")
    anchor = evaluations.anchor_target(ls, uri)
    if anchor is not None and anchor.name == target.name:
        history = evaluations.history_markdown(ls, uri)
        if history:
            lines.append(history)
    return "\n\n".join(lines)
