"""Handing a Search's result back: a diff preview first, then a versioned edit.

Only the guard's winner (verified correct and faster than the file) is ever offered. If the
document changed since the Search started, the edit is refused and the result stays in the
store for later. Clients whose editor plugin shows the preview and asks itself declare
`experimental.kernelLsp.candidatePreview`; others are asked with window/showMessageRequest.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from lsprotocol import types

if TYPE_CHECKING:
    from kernel_lsp.server.app import KernelLanguageServer
    from kernel_lsp.server.optimize import SearchRun

log = logging.getLogger(__name__)

APPLY, PREVIEW, KEEP = "Apply", "Show diff", "Keep for later"
CANDIDATE_NOTIFICATION = "kernel-lsp/candidate"  # {uri, search, candidate, gain, message}


def candidate_path(ls: "KernelLanguageServer", run: "SearchRun", candidate) -> str:
    ext = ".cu" if candidate.kind == "cuda" else ".py"
    stem = os.path.splitext(os.path.basename(ls.state(run.uri).path))[0]
    return os.path.join(ls.host.root, ".kernel-lsp", "candidates", f"{stem}-{candidate.id}{ext}")


def preview(ls: "KernelLanguageServer", run: "SearchRun", candidate) -> str:
    """Write the candidate where the editor can open it beside the file, and show it."""
    path = candidate_path(ls, run, candidate)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(candidate.source)
    uri = "file://" + path
    window = ls.client_capabilities.window
    if window and window.show_document and window.show_document.support:
        ls.window_show_document(types.ShowDocumentParams(uri=uri, take_focus=False))
    return uri


async def ask(ls: "KernelLanguageServer", run: "SearchRun", message: str) -> bool:
    """Show the preview; ask Apply / Keep for later where the editor plugin does not ask itself.
    True when the user chose Apply here."""
    # Editor plugins that ask themselves put the gain (both baselines) in their prompt.
    try:
        ls.protocol.notify(CANDIDATE_NOTIFICATION, {
            "uri": run.uri, "search": run.search_id, "candidate": run.best.id if run.best else None,
            "gain": run.gain, "message": message, **({"target": "file://" + run.target} if run.target else {})})
    except Exception:  # noqa: BLE001 - a client that ignores it loses nothing
        log.debug("candidate notification not sent", exc_info=True)
    preview(ls, run, run.best)
    if previews_itself(ls):
        return False  # the editor plugin shows the diff and calls kernel-lsp.applyCandidate itself
    try:
        choice = await ls.window_show_message_request_async(types.ShowMessageRequestParams(
            type=types.MessageType.Info, message=message,
            actions=[types.MessageActionItem(title=APPLY), types.MessageActionItem(title=KEEP)]))
    except Exception as exc:  # no answer: the result waits for kernel-lsp.applyCandidate
        log.info("showMessageRequest failed: %s", exc)
        return False
    return choice is not None and choice.title == APPLY


def previews_itself(ls: "KernelLanguageServer") -> bool:
    """The editor plugin shows the candidate's diff and asks Apply itself."""
    experimental = ls.client_capabilities.experimental
    return bool(isinstance(experimental, dict) and experimental.get("kernelLsp", {}).get("candidatePreview"))


async def apply(ls: "KernelLanguageServer", run: "SearchRun") -> dict[str, Any]:
    """A versioned edit from the Search's start text to its winner; refused if the text moved."""
    candidate = run.best
    if run.target is not None:
        return await create_file(ls, run)
    state = ls.state(run.uri)
    if state.version != run.version or state.text != run.text:
        message = ("kernel-lsp: the file changed while the Search ran, so its result was not applied; "
                   f"it is kept in the store (Search {run.search_id}): run Optimize again to start "
                   "from your current text, or `kernel-lsp report` to see it.")
        ls.show(message, types.MessageType.Warning)
        return {"applied": False, "reason": "the file changed since the Search started"}
    start, end, new = minimal_change(run.text, candidate.source)
    positions = ls.positions(state)
    edit_range = types.Range(start=positions.position(*_line_col(run.text, start)),
                             end=positions.position(*_line_col(run.text, end)))
    support = _annotations_supported(ls)
    label = f"kernel-lsp: verified faster version (Search {run.search_id})"
    text_edit: types.TextEdit | types.AnnotatedTextEdit = (
        types.AnnotatedTextEdit(range=edit_range, new_text=new, annotation_id="kernel-lsp-candidate")
        if support else types.TextEdit(range=edit_range, new_text=new))
    edit = types.WorkspaceEdit(
        document_changes=[types.TextDocumentEdit(
            text_document=types.OptionalVersionedTextDocumentIdentifier(uri=run.uri, version=run.version),
            edits=[text_edit])],
        # A plugin that showed the diff had the user review it already: a second review
        # (VS Code's Refactor Preview) would ask for Apply twice.
        change_annotations={"kernel-lsp-candidate": types.ChangeAnnotation(
            label=label, needs_confirmation=not previews_itself(ls),
            description="Review the diff before applying")} if support else None,
    )
    result = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=label))
    out: dict[str, Any] = {"applied": bool(result.applied)}
    if not result.applied:
        out["reason"] = result.failure_reason or "the editor did not apply the edit"
    return out


async def create_file(ls: "KernelLanguageServer", run: "SearchRun") -> dict[str, Any]:
    """The hot-op action's integrated model as a new file beside the model (it imports the model,
    so it cannot replace it): one edit that creates or overwrites `run.target` (only ever a file
    kernel-lsp wrote: op_action.optimized_path checked), with its text."""
    state = ls.state(run.uri)
    if state.text != run.text:  # the integrated model was verified against the model as it was
        message = (f"kernel-lsp: {os.path.basename(state.path)} changed since the op was optimized, so "
                   f"{os.path.basename(run.target)} was not created; the run is kept in the store (record "
                   f"{run.search_id}): run the action again on your current text.")
        ls.show(message, types.MessageType.Warning)
        return {"applied": False, "reason": "the model changed since the op was optimized"}
    uri = "file://" + run.target
    text = run.best.source
    support = _annotations_supported(ls)
    label = f"kernel-lsp: verified faster model (record {run.search_id}) as {os.path.basename(run.target)}"
    whole = types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=0))
    # (CreateFile with overwrite leaves an empty file: the text goes in at its start)
    text_edit: types.TextEdit | types.AnnotatedTextEdit = (
        types.AnnotatedTextEdit(range=whole, new_text=text, annotation_id="kernel-lsp-candidate")
        if support else types.TextEdit(range=whole, new_text=text))
    workspace = ls.client_capabilities.workspace
    ops = (workspace.workspace_edit.resource_operations or []) if workspace and workspace.workspace_edit else []
    if types.ResourceOperationKind.Create not in ops:  # no file creation in this editor: write it ourselves
        with open(run.target, "w", encoding="utf-8") as handle:
            handle.write(text)
        window = ls.client_capabilities.window
        if window and window.show_document and window.show_document.support:
            ls.window_show_document(types.ShowDocumentParams(uri=uri, take_focus=False))
        return {"applied": True, "written": run.target}
    edit = types.WorkspaceEdit(
        document_changes=[
            types.CreateFile(uri=uri, options=types.CreateFileOptions(overwrite=True),
                             annotation_id="kernel-lsp-candidate" if support else None),
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=None),
                edits=[text_edit])],
        change_annotations={"kernel-lsp-candidate": types.ChangeAnnotation(
            label=label, needs_confirmation=not previews_itself(ls),
            description="Review the new model before creating it")}
        if support else None)
    result = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit, label=label))
    out: dict[str, Any] = {"applied": bool(result.applied), "target": run.target}
    if not result.applied:
        out["reason"] = result.failure_reason or "the editor did not apply the edit"
    return out


def minimal_change(old: str, new: str) -> tuple[int, int, str]:
    """(start, end, replacement) in `old`'s code points: the one span that differs.

    Keeping the edit small keeps the user's cursor, folds and marks; for CUDA embedded in
    a Python string, a candidate that only changes the string edits only inside it.
    """
    prefix = 0
    limit = min(len(old), len(new))
    while prefix < limit and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < limit - prefix and old[len(old) - 1 - suffix] == new[len(new) - 1 - suffix]:
        suffix += 1
    return prefix, len(old) - suffix, new[prefix:len(new) - suffix]


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset)
    return line, offset - (text.rfind("\n", 0, offset) + 1)


def _annotations_supported(ls: "KernelLanguageServer") -> bool:
    workspace = ls.client_capabilities.workspace
    edit = workspace.workspace_edit if workspace else None
    return bool(edit and edit.change_annotation_support and edit.document_changes)
