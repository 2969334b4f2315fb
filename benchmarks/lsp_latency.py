"""Server responsiveness on a generated 5,000-line .cu (issue 2's targets).

Measures, against a real `kernel-lsp serve` over stdio:
- hover and documentSymbol latency, p50/p95 over 200 requests each, while compiles run;
- time from didSave to diagnostics, against bare nvcc on the same file and options;
- an unchanged source's re-check (save again, nothing changed);
- the server's RSS after opening 50 files.

Run: `python benchmarks/lsp_latency.py` (prints a table, writes benchmarks/results/lsp_latency.json
and .md). Targets: hover p95 <= 50 ms; diagnostics <= nvcc + 200 ms; re-check <= 100 ms; RSS <= 150 MB.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ARCH = "sm_90"

KERNEL = """
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK) scale_kernel_{i}(const float* __restrict__ x, float* __restrict__ y, float a, int n) {{
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) {{
        float v = x[i];
        v = v * a + 1.0f;
        v = v > 0.0f ? v : 0.01f * v;
        y[i] = v;
    }}
}}
extern "C" void scale_{i}(const float* x, float* y, float a, int n) {{
    scale_kernel_{i}<256><<<(n + 255) / 256, 256>>>(x, y, a, n);
}}
"""


def generate_cu(lines: int = 5000) -> str:
    parts = ["#include <cuda_runtime.h>\n"]
    i = 0
    while sum(p.count("\n") for p in parts) < lines:
        parts.append(KERNEL.format(i=i))
        i += 1
    return "".join(parts)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def bare_nvcc_seconds(path: Path, runs: int = 3) -> float:
    """nvcc alone, with the options the server uses for diagnostics and resources."""
    times = []
    with tempfile.TemporaryDirectory() as out:
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(["nvcc", "-cubin", f"-arch={ARCH}", "-Xptxas", "-v", "-lineinfo",
                            "-o", os.path.join(out, "k.cubin"), str(path)],
                           check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main() -> dict:
    work = Path(tempfile.mkdtemp(prefix="kernel-lsp-bench-"))
    big = work / "big.cu"
    text = generate_cu()
    big.write_text(text)
    uri = big.as_uri()

    client = LanguageClient("bench", "1")
    diagnostics_at: dict[str, float] = {}

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(ls, params: types.PublishDiagnosticsParams):
        diagnostics_at[params.uri] = time.perf_counter()

    @client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)
    def on_refresh(ls, params):
        return None

    @client.feature("kernel-lsp/status")
    def on_status(ls, params):
        return None

    await client.start_io(sys.executable, "-m", "kernel_lsp.cli", "serve")
    await client.initialize_async(types.InitializeParams(
        capabilities=types.ClientCapabilities(), root_uri=work.as_uri(),
        initialization_options={"arch": ARCH}))
    client.initialized(types.InitializedParams())

    async def wait_diagnostics(after: float, timeout: float = 300.0) -> float:
        deadline = time.perf_counter() + timeout
        while diagnostics_at.get(uri, -1.0) < after:
            if time.perf_counter() > deadline:
                raise TimeoutError("no diagnostics")
            await asyncio.sleep(0.002)
        return diagnostics_at[uri] - after

    def save() -> float:
        sent = time.perf_counter()
        client.text_document_did_save(types.DidSaveTextDocumentParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        return sent

    # didOpen compiles once (cold); then a save with a new text measures save -> diagnostics.
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="cuda", version=1, text=text)))
    await wait_diagnostics(0.0)

    save_times = []
    for version in range(2, 5):
        text = text + f"\n// edit {version}\n"
        big.write_text(text)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
        save_times.append(await wait_diagnostics(save()))
    nvcc_s = bare_nvcc_seconds(big)

    recheck = []
    for _ in range(5):
        recheck.append(await wait_diagnostics(save()))

    # Latency under load: keep compiles running (edits + saves) while hovering.
    kernel_line = next(n for n, l in enumerate(text.splitlines()) if "scale_kernel_3(" in l)
    col = text.splitlines()[kernel_line].index("scale_kernel_3") + 2
    hover_ms, symbol_ms = [], []
    version = 10

    async def keep_compiling(stop: asyncio.Event) -> None:
        nonlocal version, text
        while not stop.is_set():
            version += 1
            text = text + f"// load {version}\n"
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))
            save()
            await asyncio.sleep(0.5)

    stop = asyncio.Event()
    loader = asyncio.create_task(keep_compiling(stop))
    for _ in range(200):
        start = time.perf_counter()
        await client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=kernel_line, character=col)))
        hover_ms.append((time.perf_counter() - start) * 1000)
        await asyncio.sleep(0.01)
    for _ in range(200):
        start = time.perf_counter()
        await client.text_document_document_symbol_async(types.DocumentSymbolParams(
            text_document=types.TextDocumentIdentifier(uri=uri)))
        symbol_ms.append((time.perf_counter() - start) * 1000)
        await asyncio.sleep(0.01)
    stop.set()
    await loader

    # RSS after opening 50 files (each a different small kernel file).
    for n in range(50):
        path = work / f"k{n}.cu"
        small = KERNEL.format(i=n)
        path.write_text(small)
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=path.as_uri(), language_id="cuda", version=1, text=small)))
    await client.text_document_document_symbol_async(types.DocumentSymbolParams(
        text_document=types.TextDocumentIdentifier(uri=uri)))
    await asyncio.sleep(2.0)
    rss = rss_mb(client._server.pid)

    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()

    save_median = statistics.median(save_times)
    return {
        "machine": f"{platform.node()} ({os.cpu_count()} cores, {platform.python_version()})",
        "file_lines": text.count("\n"),
        "hover_p50_ms": percentile(hover_ms, 50), "hover_p95_ms": percentile(hover_ms, 95),
        "symbols_p50_ms": percentile(symbol_ms, 50), "symbols_p95_ms": percentile(symbol_ms, 95),
        "save_to_diagnostics_s": save_median, "bare_nvcc_s": nvcc_s,
        "overhead_ms": (save_median - nvcc_s) * 1000,
        "unchanged_recheck_ms": statistics.median(recheck) * 1000,
        "rss_after_50_files_mb": rss,
    }


def render(r: dict) -> str:
    rows = [
        ("hover p50 / p95 (ms), compiles running", f"{r['hover_p50_ms']:.1f} / {r['hover_p95_ms']:.1f}", "p95 <= 50"),
        ("documentSymbol p50 / p95 (ms)", f"{r['symbols_p50_ms']:.1f} / {r['symbols_p95_ms']:.1f}", "-"),
        ("didSave -> diagnostics (s)", f"{r['save_to_diagnostics_s']:.3f}", "<= nvcc + 0.2"),
        ("bare nvcc, same file (s)", f"{r['bare_nvcc_s']:.3f}", "-"),
        ("server overhead over nvcc (ms)", f"{r['overhead_ms']:.0f}", "<= 200"),
        ("unchanged source re-check (ms)", f"{r['unchanged_recheck_ms']:.1f}", "<= 100"),
        ("RSS after 50 files (MB)", f"{r['rss_after_50_files_mb']:.0f}", "<= 150"),
    ]
    lines = [f"# LSP latency ({r['file_lines']}-line .cu; {r['machine']})", "",
             "| measure | result | target |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    result = asyncio.run(main())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lsp_latency.json").write_text(json.dumps(result, indent=2) + "\n")
    table = render(result)
    (RESULTS / "lsp_latency.md").write_text(table)
    print(table)
