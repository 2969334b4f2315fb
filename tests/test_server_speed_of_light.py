"""Speed of light and the verdicts of round two in the editor, through a real LSP client
(`kernel-lsp serve` over stdio, pytest-lsp with VS Code's capabilities): a stored H200 measurement
of the document's own text (a custom kernel at 8.8 % of its memory floor, an algebraic shortcut)
shows in the hover and the lens tooltip, and as a hint-level "far from the hardware" diagnostic
with an Information one for the shortcut (not a warning: it is counted)."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.cpu_task import TASK
from tests.lsp_client import EditorClient, config, wait_for

pytest.importorskip("torch")


@pytest_lsp.fixture(config=config())
async def client(lsp_client: EditorClient, tmp_path: Path):
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=tmp_path.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=tmp_path.as_uri(), name="ws")],
        initialization_options={"onSave": [], "sandbox": "off"}))
    lsp_client.workspace_root = tmp_path
    yield
    await lsp_client.shutdown_session()


def _store_h200_measurement(root: Path, path: Path) -> None:
    """What an H200 evaluation of this text recorded (the numbers of bias_gelu's default kernel in
    benchmarks/results/speed_of_light.json)."""
    import dataclasses

    from kernel_lsp.engine import find_task
    from kernel_lsp.engine.worker.timing import roofline
    from kernel_lsp.model import Evaluation, Timing
    from kernel_lsp.store import Store

    task, cand = find_task(str(path), path.read_text())
    task = dataclasses.replace(task, name=path.name)   # the server names a Task by its workspace path
    sol = roofline.speed_of_light(0.4762, 192 << 20, None, roofline.for_device("NVIDIA H200"), "NVIDIA H200")
    ev = Evaluation(task=task.name, candidate=cand.id, verdict="correct", correct=True,
                    message="matches the reference on 5 input sets; does less arithmetic than the reference: "
                            "an algebraic shortcut, checked on 5 fresh input sets",
                    flags=["algebraic_shortcut"], custom_kernel=True, device={"name": "NVIDIA H200"},
                    time=Timing(0.4762, 0.47, 0.48, 0.5, 20), eager=Timing(0.9, 0.9, 0.9, 1.0, 20),
                    evidence={"speed_of_light": sol})
    store = Store.for_workspace(root)
    store.record(task, cand, ev)
    store.close()


async def test_hover_tooltip_and_hint_show_the_distance_to_the_hardware(client: EditorClient):
    path = client.workspace_root / "rowsum.py"
    path.write_text(TASK)
    _store_h200_measurement(client.workspace_root, path)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=TASK)))

    def diagnostics():
        got = [d for d in client.diagnostics.get(uri, []) if d.code in ("far-from-hardware", "algebraic_shortcut")]
        return got if len(got) == 2 else None

    found = {d.code: d for d in await wait_for(diagnostics, timeout=60, what="the stored measurement's diagnostics")}
    far = found["far-from-hardware"]
    assert far.severity == types.DiagnosticSeverity.Hint
    assert far.message.startswith("far from the hardware: 8.8 % of the H200's memory floor (41.9 us to move its "
                                  "bytes once)"), far.message
    assert found["algebraic_shortcut"].severity == types.DiagnosticSeverity.Information

    line = next(i for i, text in enumerate(TASK.splitlines()) if text.startswith("class ModelNew"))
    hover = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=8)))
    text = hover.contents.value if hover else ""
    assert "Speed of light: 8.8 % of the H200's memory floor (41.9 us to move its bytes once)" in text, text
    assert "Algebraic shortcut: does less arithmetic than the reference" in text, text

    lenses = await client.text_document_code_lens_async(types.CodeLensParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))
    tip = lenses[0].command.tooltip or ""
    assert "speed of light: 8.8 % of the H200's memory floor" in tip, tip
    assert "algebraic shortcut" in lenses[0].command.title
