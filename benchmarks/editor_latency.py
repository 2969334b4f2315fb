"""Hover and code lens latency while a Search runs on the same file (issue 5's target).

Starts a real `kernel-lsp serve`, opens a CPU task (a row-sum with a tunable CHUNK), starts
"Tune" on it (the built-in tuner: compiles, verifies and times candidates in a Worker), and
while that Search runs sends 200 hovers and 200 code lens requests on the same document.

Run: `python benchmarks/editor_latency.py` (prints a table, writes
benchmarks/results/editor_latency.json and .md). Target: p95 <= 50 ms for both.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

TASK = '''\
import torch
import torch.nn as nn

CHUNK = 1


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=1)


class ModelNew(nn.Module):
    def forward(self, x):
        ones = torch.ones(x.shape[1], dtype=x.dtype)
        out = torch.empty(x.shape[0], dtype=x.dtype)
        for i in range(0, x.shape[0], CHUNK):
            out[i:i + CHUNK] = torch.mv(x[i:i + CHUNK], ones)
        return out


def get_inputs():
    return [torch.randn(512, 256)]


def get_init_inputs():
    return []
'''


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def main(requests: int = 200) -> dict:
    work = Path(tempfile.mkdtemp(prefix="kernel-lsp-editor-bench-"))
    path = work / "rowsum.py"
    path.write_text(TASK)
    uri = path.as_uri()
    client = LanguageClient("bench", "1")
    status: list[dict] = []

    @client.feature("kernel-lsp/status")
    def on_status(ls, params):
        status.append(params)

    # A silent editor: no answer to "Apply?", so the result is kept, not applied.
    for method in (types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS, types.WINDOW_LOG_MESSAGE, types.WINDOW_SHOW_MESSAGE,
                   types.WINDOW_SHOW_MESSAGE_REQUEST):
        client.feature(method)(lambda ls, params: None)

    await client.start_io(sys.executable, "-m", "kernel_lsp.cli", "serve")
    await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=work.as_uri(),
        initialization_options={"agentBudget": 12, "proposer": "tuner"}))
    client.initialized(types.InitializedParams())
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=TASK)))

    search = asyncio.ensure_future(client.workspace_execute_command_async(types.ExecuteCommandParams(
        command="kernel-lsp.tune", arguments=[{"uri": uri}])))
    while not any(getattr(s, "jobs", None) for s in status):  # the Search is running
        await asyncio.sleep(0.05)

    line = TASK.splitlines().index("class ModelNew(nn.Module):")
    hover_ms, lens_ms, during = [], [], 0
    for _ in range(requests):
        start = time.perf_counter()
        await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=8)))
        hover_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        await client.text_document_code_lens_async(types.CodeLensParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        lens_ms.append((time.perf_counter() - start) * 1000)
        during += 0 if search.done() else 1
        await asyncio.sleep(0.02)
    result = await search
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {
        "machine": f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()})",
        "requests": requests, "requests_while_search_ran": during,
        "hover_p50_ms": percentile(hover_ms, 50), "hover_p95_ms": percentile(hover_ms, 95),
        "lens_p50_ms": percentile(lens_ms, 50), "lens_p95_ms": percentile(lens_ms, 95),
        "search": {k: result.get(k) for k in ("improved", "speedup", "candidates_evaluated", "reason")},
    }


def render(r: dict) -> str:
    return "\n".join([
        f"# Editor latency while a Search runs ({r['machine']})", "",
        f"{r['requests_while_search_ran']} of {r['requests']} request pairs were answered while the tuner's "
        f"Search ran (it evaluated {r['search']['candidates_evaluated']} candidates; "
        f"improved: {r['search']['improved']}, speedup {r['search']['speedup']}).", "",
        "| request | p50 (ms) | p95 (ms) | target |", "| --- | --- | --- | --- |",
        f"| hover | {r['hover_p50_ms']:.1f} | {r['hover_p95_ms']:.1f} | p95 <= 50 |",
        f"| codeLens | {r['lens_p50_ms']:.1f} | {r['lens_p95_ms']:.1f} | p95 <= 50 |",
    ]) + "\n"


if __name__ == "__main__":
    result = asyncio.run(main())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "editor_latency.json").write_text(json.dumps(result, indent=2) + "\n")
    table = render(result)
    (RESULTS / "editor_latency.md").write_text(table)
    print(table)
