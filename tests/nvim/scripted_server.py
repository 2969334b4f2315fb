"""A scripted language server that plays kernel-lsp's side of the optimize flow as
kernel_lsp/server (optimize.py, handback.py) does it: progress, `kernel-lsp/status`, the
winner written to `.kernel-lsp/candidates/<stem>-<candidate id><ext>` and shown with
`window/showDocument` *before* the command answers `{search, best, improved, speedup}`,
then `workspace/applyEdit` on `kernel-lsp.applyCandidate`.

It lets tests/test_nvim.py pin the plugin's side of the diff-before-apply UI exactly
(the ids it sends, the order of preview and answer) for a CUDA file, in seconds; the whole
flow against the real server runs on the CPU in test_real_optimize_*. Every request it
received is appended to the JSON-lines file named by KLSP_SCRIPT_LOG.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

FASTER = "    // candidate: vectorized\n"
server = LanguageServer("kernel-lsp-scripted", "0")
LOG = os.environ.get("KLSP_SCRIPT_LOG")


def record(kind: str, **data) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, **data}) + "\n")


def candidate_text(original: str) -> str:
    lines = original.splitlines(keepends=True)
    return "".join(lines[:3] + [FASTER] + lines[3:])


@server.feature(types.INITIALIZED)
def initialized(ls: LanguageServer, params: types.InitializedParams) -> None:
    record("initialized", experimental=ls.client_capabilities.experimental)


@server.feature(types.TEXT_DOCUMENT_CODE_ACTION)
def code_action(ls: LanguageServer, params: types.CodeActionParams):
    uri = params.text_document.uri
    return [types.CodeAction(
        title="Optimize scale_kernel (kernel-lsp)",
        kind=types.CodeActionKind.Source + ".kernelLsp.optimize",
        command=types.Command(title="Optimize", command="kernel-lsp.optimize",
                              arguments=[{"uri": uri}]),
    )]


@server.feature(types.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
def document_symbol(ls: LanguageServer, params: types.DocumentSymbolParams):
    # scale_kernel of tests/test_nvim.py's KERNEL spans lines 2-5.
    whole = types.Range(start=types.Position(2, 0), end=types.Position(5, 1))
    return [types.DocumentSymbol(name="scale_kernel", kind=types.SymbolKind.Function,
                                 range=whole, selection_range=whole)]


@server.command("kernel-lsp.optimize")
async def optimize(ls: LanguageServer, args: dict):
    record("optimize", args=args)
    uri = args["uri"]
    token = "kernel-lsp-search-1"
    await ls.work_done_progress.create_async(token)
    ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(
        title="optimize scale_kernel", cancellable=True, percentage=0))
    ls.protocol.notify("kernel-lsp/status", {"jobs": [{
        "id": "job-1", "title": "optimize scale_kernel", "uri": uri,
        "message": "candidate 1/2", "bestSpeedup": 1.5}]})
    ls.work_done_progress.report(token, types.WorkDoneProgressReport(message="candidate 1/2: 1.50x", percentage=50))
    path = Path(to_fs_path(uri))
    cand = path.parent / ".kernel-lsp" / "candidates" / f"{path.stem}-c2{path.suffix}"
    cand.parent.mkdir(parents=True, exist_ok=True)
    cand.write_text(candidate_text(path.read_text()))
    ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message="1.50x faster: preview opened"))
    ls.protocol.notify("kernel-lsp/status", {"jobs": []})
    shown = await ls.window_show_document_async(types.ShowDocumentParams(uri=cand.as_uri(), take_focus=False))
    record("showDocument", success=shown.success)
    return {"search": 1, "best": "c2", "improved": True, "speedup": 1.5}


@server.command("kernel-lsp.applyCandidate")
async def apply_candidate(ls: LanguageServer, args: dict):
    record("applyCandidate", args=args)
    if args.get("search", 1) != 1 or args.get("candidate", "c2") != "c2":
        raise ValueError(f"no such search/candidate: {args}")
    (uri, doc), = [(u, d) for u, d in ls.workspace.text_documents.items()]
    new = candidate_text(doc.source)
    end = len(doc.lines)
    edit = types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(
        text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=doc.version),
        edits=[types.TextEdit(range=types.Range(start=types.Position(0, 0), end=types.Position(end, 0)),
                              new_text=new)])])
    result = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label="kernel-lsp"))
    record("applyEdit", applied=result.applied)
    return {"applied": result.applied, "message": "applied candidate c2 (1.50x)"}


if __name__ == "__main__":
    server.start_io(sys.stdin.buffer, sys.stdout.buffer)
