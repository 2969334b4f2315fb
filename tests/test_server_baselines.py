"""The editor sees kept baselines with their spreads: `kernel-lsp serve` over stdio (pytest-lsp,
as VS Code drives it), on-save compile+verify+bench of a CPU task through the real Engine and a
real store. The first save measures the baselines interleaved with the code; a comment-only
save reuses them (the lens tooltip and the hover say so, with both spreads); the "Re-measure
baselines" lens's command times them again."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.cpu_task import TASK
from tests.lsp_client import EditorClient, config, wait_for

pytest.importorskip("torch")

# A busy 2-core machine times noisily: keep what it measured (tests/engine/test_baselines.py
# shows the spread rule itself).
ENV = {**os.environ, "KERNEL_LSP_BASELINE_KEEP_SPREAD": "1000"}


@pytest_lsp.fixture(config=config(env=ENV))
async def client(lsp_client: EditorClient, tmp_path: Path):
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=tmp_path.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=tmp_path.as_uri(), name="ws")],
        initialization_options={"onSave": ["compile", "verify", "bench"], "timeout": 300, "sandbox": "off"}))
    lsp_client.workspace_root = tmp_path
    yield
    await lsp_client.shutdown_session()


def _save(client: EditorClient, uri: str, path: Path, text: str, version: int) -> None:
    path.write_text(text)
    if version > 1:
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))


async def _lenses(client: EditorClient, uri: str) -> list[types.CodeLens]:
    return await client.text_document_code_lens_async(types.CodeLensParams(
        text_document=types.TextDocumentIdentifier(uri=uri))) or []


def _measured(client: EditorClient, uri: str, version: int):
    async def lens():
        lenses = await _lenses(client, uri)
        first = lenses[0].command if lenses and lenses[0].command else None
        if first is None or first.title in ("measuring…", "not measured yet") or "edited since" in first.title:
            return None
        if f"measured on version {version}" not in (first.tooltip or ""):
            return None
        return lenses
    return lens


SPREADS = re.compile(r"eager [\d.]+ [mu]s ±[\d.]+% · torch\.compile [\d.]+ [mu]s ±[\d.]+%")


@pytest.mark.slow
async def test_a_comment_only_save_shows_kept_baselines_with_their_spreads(client: EditorClient):
    path = client.workspace_root / "rowsum.py"
    uri = path.as_uri()
    path.write_text(TASK)
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=TASK)))
    _save(client, uri, path, TASK, 1)
    first = await wait_for(_measured(client, uri, 1), timeout=240, interval=0.5, what="the first save's lens")
    tip = first[0].command.tooltip
    assert SPREADS.search(tip), tip
    assert "baselines measured now, interleaved with this code" in tip, tip
    assert "Re-measure baselines" not in [lens.command.title for lens in first]  # nothing to re-measure

    edited = TASK.replace("class ModelNew(nn.Module):", "# a comment only\nclass ModelNew(nn.Module):")
    _save(client, uri, path, edited, 2)
    second = await wait_for(_measured(client, uri, 2), timeout=240, interval=0.5, what="the comment save's lens")
    tip = second[0].command.tooltip
    assert SPREADS.search(tip) and "baselines kept from" in tip, tip
    titles = [lens.command.title for lens in second]
    assert "Re-measure baselines" in titles, titles
    model_new = edited.splitlines().index("class ModelNew(nn.Module):")
    hover = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=model_new, character=8)))
    text = hover.contents.value if hover else ""
    assert "Baselines kept from" in text, text
    assert re.search(r"\| PyTorch eager \| [\d.]+ [mu]s \| ±[\d.]+% \|", text), text
    assert re.search(r"\| torch\.compile \| [\d.]+ [mu]s \| ±[\d.]+% \|", text), text

    lens = next(lens for lens in second if lens.command.title == "Re-measure baselines")
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=lens.command.command, arguments=lens.command.arguments))
    assert result["verdict"] == "correct" and result["baselines_cached"] is False, result
    assert result["eager_spread_pct"] is not None and result["compile_spread_pct"] is not None
    after = await wait_for(_measured(client, uri, 2), timeout=60, interval=0.3, what="the re-measured lens")
    assert "baselines measured now" in after[0].command.tooltip
    assert "Re-measure baselines" not in [lens.command.title for lens in after]
