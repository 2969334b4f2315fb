"""End-to-end: `kernel-lsp serve` over stdio, driven as VS Code and Neovim drive it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import client_capabilities

from tests.lsp_client import EditorClient, config, wait_for

SOFTMAX = """\
#include <cuda_runtime.h>

__global__ void __launch_bounds__(256) softmax_kernel(const float* x, float* y, int cols) {
    int row = blockIdx.x;
    float m = -1e30f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[row * cols + c]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[row * cols + c] = __expf(x[row * cols + c] - m);
}

extern "C" void softmax(const float* x, float* y, int rows, int cols) {
    softmax_kernel<<<rows, 256>>>(x, y, cols);
}
"""

BROKEN = SOFTMAX.replace("float m = -1e30f;", "float m = -1e30f;\n    int oops = undefined_name;")
ERROR_LINE = BROKEN.splitlines().index("    int oops = undefined_name;")


@pytest_lsp.fixture(config=config(), params=["visual-studio-code", "neovim"])
async def client(lsp_client: EditorClient, request: pytest.FixtureRequest, tmp_path: Path):
    params = types.InitializeParams(
        capabilities=client_capabilities(request.param),
        root_uri=tmp_path.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=tmp_path.as_uri(), name="ws")],
        initialization_options={"arch": "sm_90"},
    )
    await lsp_client.initialize_session(params)
    lsp_client.workspace_root = tmp_path
    yield
    await lsp_client.shutdown_session()


def open_doc(client: EditorClient, path: Path, text: str, language: str = "cuda") -> str:
    path.write_text(text)
    uri = path.as_uri()
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)))
    return uri


def save_doc(client: EditorClient, uri: str, path: Path, text: str, version: int) -> None:
    path.write_text(text)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
    client.text_document_did_save(types.DidSaveTextDocumentParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))


def errors(client: EditorClient, uri: str) -> list[types.Diagnostic]:
    return [d for d in client.diagnostics.get(uri, []) if d.severity == types.DiagnosticSeverity.Error]


async def test_planted_error_lands_on_its_line_and_follows_edits(client: EditorClient):
    path = client.workspace_root / "softmax.cu"
    uri = open_doc(client, path, BROKEN)
    found = await wait_for(lambda: errors(client, uri), what="nvcc error diagnostics")
    assert any(d.range.start.line == ERROR_LINE and "undefined_name" in d.message for d in found), found
    assert all(d.source == "nvcc" for d in found)

    # Fix it, save: the error goes away and the resource report arrives.
    save_doc(client, uri, path, SOFTMAX, version=2)
    await wait_for(lambda: uri in client.diagnostics and not errors(client, uri), what="errors cleared")


async def test_hover_shows_registers_and_occupancy(client: EditorClient):
    path = client.workspace_root / "softmax.cu"
    uri = open_doc(client, path, SOFTMAX)
    line = SOFTMAX.splitlines().index(next(l for l in SOFTMAX.splitlines() if "softmax_kernel(" in l))
    col = SOFTMAX.splitlines()[line].index("softmax_kernel") + 3

    async def hover_text() -> str:
        result = await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=col)))
        return result.contents.value if result else ""

    async def registers_shown() -> str:
        text = await hover_text()
        return text if "registers" in text else ""

    text = await wait_for(registers_shown, interval=0.2, what="a hover with registers")
    assert "softmax_kernel" in text and "registers" in text and "Occupancy" in text, text

    hints = await client.text_document_inlay_hint_async(types.InlayHintParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=20, character=0))))
    assert hints and "regs" in str(hints[0].label)


async def test_document_symbols_list_kernels_and_exports(client: EditorClient):
    path = client.workspace_root / "softmax.cu"
    uri = open_doc(client, path, SOFTMAX)
    symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))
    names = {s.name for s in symbols}
    assert {"softmax_kernel", "softmax"} <= names, names


async def test_bad_input_gives_messages_and_the_server_keeps_serving(client: EditorClient):
    root = client.workspace_root
    empty = open_doc(client, root / "empty.cu", "")
    garbage = open_doc(client, root / "garbage.cu", "\x00\x01\x02 not cuda \ufffd{{{")
    await wait_for(lambda: errors(client, garbage), what="diagnostics for a garbage file")
    # The server still answers requests on every document.
    for uri in (empty, garbage):
        symbols = await client.text_document_document_symbol_async(types.DocumentSymbolParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        assert symbols == [] or symbols is None


@pytest_lsp.fixture(config=config(env={**os.environ, "PATH": "/nonexistent"}))
async def client_without_nvcc(lsp_client: EditorClient, tmp_path: Path):
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"), root_uri=tmp_path.as_uri(),
        initialization_options={"nvcc": str(tmp_path / "no-such-nvcc")}))
    lsp_client.workspace_root = tmp_path
    yield
    await lsp_client.shutdown_session()


async def test_missing_nvcc_is_one_clear_diagnostic(client_without_nvcc: EditorClient):
    client = client_without_nvcc
    uri = open_doc(client, client.workspace_root / "k.cu", SOFTMAX)
    found = await wait_for(lambda: errors(client, uri), what="missing-nvcc diagnostic")
    assert len(found) == 1 and "nvcc" in found[0].message.lower(), found


async def test_one_publish_per_save_with_its_version(client: EditorClient):
    path = client.workspace_root / "softmax.cu"
    uri = open_doc(client, path, SOFTMAX)
    await wait_for(lambda: [p for p in client.publishes if p.uri == uri], what="the first publish")
    save_doc(client, uri, path, BROKEN, version=2)
    await wait_for(lambda: errors(client, uri), what="the planted error")
    await asyncio.sleep(1.0)  # a second publish for the same save would arrive meanwhile
    mine = [p for p in client.publishes if p.uri == uri]
    assert [p.version for p in mine] == [1, 2], [(p.version, len(p.diagnostics)) for p in mine]


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


async def measured_cu_session(client: EditorClient, editor: str, tmp_path: Path, **options) -> None:
    """A workspace with a .cu and its harness, whose saves are measured."""
    for name in ("softmax.cu", "softmax.py"):
        (tmp_path / name).write_text((EXAMPLES / name).read_text())
    await client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities(editor), root_uri=tmp_path.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=tmp_path.as_uri(), name="ws")],
        initialization_options={"arch": "sm_90", "onSave": ["compile", "verify", "bench"], "timeout": 120,
                                **options}))
    client.workspace_root = tmp_path


@pytest_lsp.fixture(config=config(env=dict(os.environ)), params=["visual-studio-code", "neovim"])
async def bench_client(lsp_client: EditorClient, request: pytest.FixtureRequest, tmp_path: Path):
    await measured_cu_session(lsp_client, request.param, tmp_path)
    yield
    await lsp_client.shutdown_session()


def _measured(client: EditorClient, uri: str):
    async def lens() -> str:
        lenses = await client.text_document_code_lens_async(types.CodeLensParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        titles = [l.command.title for l in lenses or [] if l.command]
        return "" if "measuring…" in titles or "not measured yet" in titles else " | ".join(titles)
    return lens


async def test_a_measured_cu_save_publishes_once_with_its_version(bench_client: EditorClient):
    """A .cu whose saves are measured: the compile's diagnostics and the measurement's (on the
    CPU: a measurement that says why it did not run) come in one publish per save."""
    client = bench_client
    path = client.workspace_root / "softmax.cu"
    text = path.read_text()
    uri = open_doc(client, path, text)
    client.text_document_did_save(types.DidSaveTextDocumentParams(  # as an editor's open-and-save
        text_document=types.TextDocumentIdentifier(uri=uri)))
    await wait_for(_measured(client, uri), timeout=180, interval=0.3, what="the first save's measurement")
    await asyncio.sleep(1.5)
    first = [p for p in client.publishes if p.uri == uri]
    assert [p.version for p in first] == [1], [(p.version, [d.message for d in p.diagnostics]) for p in first]
    edited = text + "\n// an edit\n"
    save_doc(client, uri, path, edited, version=2)
    lens = await wait_for(_measured(client, uri), timeout=180, interval=0.3, what="the save's measurement")
    await asyncio.sleep(1.5)  # a second publish for the save would arrive meanwhile
    saved = [p for p in client.publishes if p.uri == uri and p.version == 2]
    assert len(saved) == 1, [(p.version, [d.message for d in p.diagnostics]) for p in client.publishes]
    assert all(p.version is not None for p in client.publishes if p.uri == uri)
    print("lens:", lens)

    # A save that does not compile: its error shows, once, and no measurement follows it.
    broken = edited.replace("__global__", "__global__ int oops = undefined_name;\n__global__", 1)
    save_doc(client, uri, path, broken, version=3)
    await wait_for(lambda: errors(client, uri), timeout=60, what="the planted error")
    await asyncio.sleep(2.0)
    saved = [p for p in client.publishes if p.uri == uri and p.version == 3]
    assert len(saved) == 1 and any("undefined_name" in d.message for d in saved[0].diagnostics), saved


async def _open_measured(client: EditorClient) -> tuple[Path, str, str]:
    """softmax.cu opened and saved once: measured (on the CPU: a measurement that says why not)."""
    path = client.workspace_root / "softmax.cu"
    text = path.read_text()
    uri = open_doc(client, path, text)
    client.text_document_did_save(types.DidSaveTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri)))
    await wait_for(_measured(client, uri), timeout=180, interval=0.3, what="the first save's measurement")
    return path, text, uri


def _built_ahead(client: EditorClient, uri: str, version: int):
    def found() -> dict | None:
        for status in reversed(client.statuses):
            doc = next((d for d in status.get("documents", []) if d["uri"] == uri), None)
            got = (doc or {}).get("builtAhead")
            if got and got.get("version") == version:
                return got
        return None
    return found


async def test_edits_of_a_measured_file_are_built_while_typing(bench_client: EditorClient):
    """After a pause in typing, a measured file's new text is built in the background (the status
    says so, per version); a text that does not build says failed; the save that follows is
    measured as before."""
    client = bench_client
    path, text, uri = await _open_measured(client)
    assert _built_ahead(client, uri, 1)() is None  # the save built it, nothing ahead

    edited = text.replace("__global__", "// typed, not saved\n__global__", 1)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=edited)]))
    got = await wait_for(_built_ahead(client, uri, 2), timeout=120, interval=0.2, what="the build ahead of version 2")
    assert got["state"] == "built" and got["seconds"] > 0, got

    broken = edited.replace("__global__", "__global__ int oops = undefined_name;\n__global__", 1)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=3),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=broken)]))
    got = await wait_for(_built_ahead(client, uri, 3), timeout=120, interval=0.2, what="the build ahead of version 3")
    assert got["state"] == "failed", got

    # Saving the built text: measured as any save is (the build is the one made ahead).
    save_doc(client, uri, path, edited, version=4)
    lens = await wait_for(_measured(client, uri), timeout=180, interval=0.3, what="the save's measurement")
    assert lens


@pytest_lsp.fixture(config=config(env=dict(os.environ)))
async def quiet_client(lsp_client: EditorClient, tmp_path: Path):
    await measured_cu_session(lsp_client, "visual-studio-code", tmp_path, buildWhileTyping=False)
    yield
    await lsp_client.shutdown_session()


async def test_build_while_typing_off_builds_nothing_ahead(quiet_client: EditorClient):
    client = quiet_client
    _, text, uri = await _open_measured(client)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text + "\n// typed\n")]))
    await asyncio.sleep(3.0)  # the pause (0.4 s) and a build (about 1-2 s here) would be over
    assert _built_ahead(client, uri, 2)() is None
