"""The editor side of the no-LLM path through a real LSP client (pytest-lsp), VS Code's and
Neovim's capabilities, with no model configured and no GPU visible (hidden, so the test means
the same on the device machine): the code action is offered at once, and both it and Optimize
say why they cannot run instead of saying a module needs an LLM; nothing is written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.lsp_client import EditorClient, config

from .test_cli import PLAIN

pytest.importorskip("torch")

ENV = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNEL_LSP_MODEL")}
ENV.update(CUDA_VISIBLE_DEVICES="", KERNEL_LSP_CACHE=os.path.join(os.environ.get("TMPDIR", "/tmp"), "kernel-lsp-test-cache"))


@pytest_lsp.fixture(config=config(env=ENV), params=["visual-studio-code", "neovim"])
async def client(lsp_client: EditorClient, request: pytest.FixtureRequest, tmp_path: Path):
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities(request.param), root_uri=tmp_path.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=tmp_path.as_uri(), name="ws")],
        initialization_options={"onSave": [], "timeout": 120}))
    lsp_client.workspace_root = tmp_path
    yield
    await lsp_client.shutdown_session()


async def test_write_kernels_and_optimize_say_why_without_a_gpu(client: EditorClient):
    path = client.workspace_root / "plain.py"
    path.write_text(PLAIN)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=PLAIN)))
    line = PLAIN.splitlines().index("class Model(nn.Module):")
    actions = await client.text_document_code_action_async(types.CodeActionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=types.Range(start=types.Position(line=line, character=0), end=types.Position(line=line, character=0)),
        context=types.CodeActionContext(diagnostics=[])))
    titles = {a.title: a for a in actions or []}
    assert "Write this module's kernels (no LLM)" in titles, list(titles)
    action = titles["Write this module's kernels (no LLM)"]
    assert not action.is_preferred and action.command.command == "kernel-lsp.writeKernels"

    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.writeKernels", arguments=[{"uri": uri}]))
    assert result["written"] is False
    assert "needs a CUDA GPU" in result["reason"], result
    assert any("needs a CUDA GPU" in m.message for m in client.messages)
    assert sorted(p.name for p in client.workspace_root.iterdir() if p.suffix == ".py") == ["plain.py"]
    assert not client.applied_edits

    # Optimize on the module with no model: the no-LLM path, which says why it cannot run here.
    optimize = next(t for t in titles if t.startswith("Optimize this module"))
    assert optimize == "Optimize this module (tuner)"
    result = await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.optimize", arguments=[{"uri": uri}]))
    assert result["improved"] is False
    assert "needs a CUDA GPU" in result["reason"] and "needs an LLM" not in result["reason"], result
    assert path.read_text() == PLAIN and not client.applied_edits
