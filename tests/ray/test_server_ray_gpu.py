"""On the GPU machine: the language server measures a CUDA example through a local Ray cluster
whose head owns the real GPU (a laptop's set-up, on one box, on 127.0.0.1). The lens, hover and
status say the numbers came from the Ray node and its GPU. Skipped without CUDA.

    python -m pytest -q -m gpu tests/ray/test_server_ray_gpu.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest_lsp = pytest.importorskip("pytest_lsp", reason="the server test needs the LSP packages")
from lsprotocol import types  # noqa: E402
from pytest_lsp import client_capabilities  # noqa: E402

from tests.lsp_client import EditorClient, config, wait_for  # noqa: E402

from .cluster import LocalCluster  # noqa: E402
from .conftest import TOKEN  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def gpu_cluster():
    c = LocalCluster(token=TOKEN)
    try:
        c.start_head(num_cpus=2, num_gpus=1)
        yield c
    finally:
        c.stop()


@pytest_lsp.fixture(config=config(env={**os.environ, "KERNEL_LSP_RAY_CONNECT_TIMEOUT": "150"}))
async def client(lsp_client: EditorClient, gpu_cluster, tmp_path: Path):
    for name in ("softmax.cu", "softmax.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=tmp_path.as_uri(),
        initialization_options={"onSave": ["compile", "verify", "bench"], "timeout": 300, "executor": "ray",
                                "rayAddress": f"ray://127.0.0.1:{gpu_cluster.client_port}"}))
    lsp_client.workspace_root = tmp_path
    yield
    await lsp_client.shutdown_session()


async def test_softmax_is_measured_on_the_ray_gpu(client: EditorClient):
    def settled() -> dict | None:
        # The first state past "connecting": "connected", or "unreachable" with the server's
        # reason, which fails the test at once instead of after the whole wait.
        for s in reversed(client.statuses):
            c = s.get("cluster") or {}
            if c.get("state") not in (None, "connecting"):
                return c
        return None

    up = await wait_for(settled, timeout=170, what="the cluster connected or refused")
    print("cluster:", up)
    assert up.get("state") == "connected", f"the server did not connect to the Ray cluster: {up}"
    assert up["gpus"] == 1, up
    path = client.workspace_root / "softmax.cu"
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="cuda", version=1, text=path.read_text())))
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))

    async def measured() -> types.CodeLens | None:
        lenses = await client.text_document_code_lens_async(types.CodeLensParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        return next((l for l in lenses or [] if l.command and l.command.title.startswith("correct ·")), None)

    lens = await wait_for(measured, timeout=200, interval=1.0, what="a measured lens")
    print("lens:", lens.command.title, "|", lens.command.tooltip)
    assert "x eager" in lens.command.title and "torch.compile" in lens.command.title
    assert lens.command.tooltip.startswith("ran on the Ray cluster, node 127.0.0.1"), lens.command.tooltip
    assert "GPU 0" in lens.command.tooltip and "NVIDIA" in lens.command.tooltip, lens.command.tooltip
    hover = await client.text_document_hover_async(types.HoverParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=lens.range.start))
    text = hover.contents.value if hover else ""
    print("hover:", text)
    assert "ran on the Ray cluster, node 127.0.0.1" in text and "on NVIDIA" in text, text
