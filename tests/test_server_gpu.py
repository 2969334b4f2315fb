"""The editor loop with a CUDA example on a real GPU (run on the device machine with the
LSP packages carried as wheels): save shows a measured lens, "Tune launch parameters" finds
a verified, faster version, the preview comes first, and the edit applies."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

pytest_lsp = pytest.importorskip("pytest_lsp", reason="the server test needs the LSP packages")
from lsprotocol import types  # noqa: E402
from pytest_lsp import client_capabilities  # noqa: E402

from tests.lsp_client import EditorClient, config, wait_for  # noqa: E402

pytestmark = pytest.mark.gpu
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest_lsp.fixture(config=config(env=dict(os.environ)), params=["visual-studio-code"])
async def client(lsp_client: EditorClient, request: pytest.FixtureRequest, tmp_path: Path):
    for name in ("softmax.cu", "softmax.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities(request.param), root_uri=tmp_path.as_uri(),
        initialization_options={"onSave": ["compile", "verify", "bench"], "proposer": "tuner",
                                "agentBudget": 6, "timeout": 300}))
    lsp_client.workspace_root = tmp_path
    yield
    await lsp_client.shutdown_session()


async def test_tune_softmax_then_apply(client: EditorClient):
    path = client.workspace_root / "softmax.cu"
    text = path.read_text()
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="cuda", version=1, text=text)))
    client.text_document_did_save(types.DidSaveTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))

    async def measured() -> str:
        lenses = await client.text_document_code_lens_async(types.CodeLensParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        titles = [l.command.title for l in lenses or [] if l.command]
        return next((t for t in titles if t.startswith("correct ·")), "")

    lens = await wait_for(measured, timeout=300, interval=1.0, what="a measured lens")
    print("lens:", lens)
    assert "x eager" in lens and "torch.compile" in lens
    # The save's compile and its measurement: one publish, with the version.
    await asyncio.sleep(1.5)
    mine = [p for p in client.publishes if p.uri == uri]
    assert [p.version for p in mine] == [1], [(p.version, [d.message for d in p.diagnostics]) for p in mine]

    client.show_message_answer = "Apply"
    result = await asyncio.wait_for(client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.tune", arguments=[{"uri": uri}])), timeout=500)
    print("tune:", {k: result.get(k) for k in ("improved", "speedup", "best_note", "candidates_evaluated")})
    assert result["improved"] and result["speedup"] > 1.1, result
    assert any(".kernel-lsp/candidates/" in d.uri for d in client.shown_documents)
    edit = await wait_for(lambda: client.applied_edits, what="applyEdit")
    change = edit[0].edit.document_changes[0]
    assert change.text_document.uri == uri and len(change.edits) == 1, edit
    new_text = change.edits[0].new_text
    print("edit:", repr(new_text))
    # The edit writes the verified best, whole: the file after it is the best candidate's source.
    from kernel_lsp.store import Store

    best = Store.for_workspace(client.workspace_root).candidate(result["best"])
    assert best is not None and result["best_note"] == best.note, result
    assert apply_edit(text, change.edits[0]) == best.source
    assert best.source != text


def apply_edit(text: str, edit: types.TextEdit) -> str:
    """`text` with one LSP TextEdit applied (positions in UTF-16 units: ASCII sources here)."""
    lines = text.splitlines(keepends=True)

    def offset(pos: types.Position) -> int:
        return sum(len(line) for line in lines[:pos.line]) + pos.character

    return text[:offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end):]
