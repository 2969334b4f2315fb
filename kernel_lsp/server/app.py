"""The kernel-lsp language server (pygls 2.x).

One direction (DESIGN.md): document events become jobs, job results become editor
features. Nothing here blocks the event loop: compiles are asyncio subprocesses, GPU
work lives in engine Workers, and no handler uses `@server.thread()` (pygls reads stdin
on that pool).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from kernel_lsp import __version__
from kernel_lsp.config import Settings, SettingsError, load_settings
from kernel_lsp.model import Diagnostic, Evaluation, ResourceUsage
from kernel_lsp.server.engine_host import EngineHost
from kernel_lsp.server.jobs import Jobs
from kernel_lsp.server.watch import Watcher
from kernel_lsp.server.positions import Positions
from kernel_lsp.source import Document, parse_document

if TYPE_CHECKING:
    from kernel_lsp.server.actions import SearchRun

log = logging.getLogger(__name__)

CUDA_SUFFIXES = (".cu", ".cuh")
CONFIG_SECTION = "kernelLsp"
STATUS_NOTIFICATION = "kernel-lsp/status"


class KernelLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("kernel-lsp", __version__)
        self.settings = Settings()
        self.init_options: dict[str, Any] = {}
        self.documents: dict[str, Document] = {}
        # The last compile's resource report of each document, by kernel name.
        self.resources: dict[str, dict[str, ResourceUsage]] = {}
        # Diagnostics per document, in buckets (compile, resources, verify...) published together.
        self.diagnostic_buckets: dict[str, dict[str, list[types.Diagnostic]]] = {}
        self.jobs = Jobs(on_change=self.send_status)
        self.host = EngineHost(self)
        # The last Evaluation shown per document (read from the store on first use).
        self.evaluations: dict[str, Evaluation] = {}
        # Searches whose verified, faster result waits to be applied, by search id.
        self.search_runs: dict[int, SearchRun] = {}
        self.watcher = Watcher(self)
        self._parsing: dict[str, asyncio.Future[None]] = {}
        self._positions: dict[str, tuple[str, Positions]] = {}
        # documentSymbol answers as plain JSON, per parse (a parse is immutable).
        self.symbols: dict[str, tuple[Document, list[dict]]] = {}

    # -- settings ---------------------------------------------------------------------------

    @property
    def root(self) -> str | None:
        try:
            return self.workspace.root_path
        except RuntimeError:  # before initialize
            return None

    def reload_settings(self, *overlays: dict[str, Any] | None) -> None:
        try:
            self.settings = load_settings(self.root, self.init_options, *overlays)
        except SettingsError as exc:
            self.window_show_message(types.ShowMessageParams(
                type=types.MessageType.Error, message=f"kernel-lsp: {exc}"))

    # -- documents --------------------------------------------------------------------------

    def document(self, uri: str) -> Document:
        """The parsed document, at once: the latest parse, which may trail the text by one
        re-parse running in a thread (a 5,000-line file takes ~150 ms to read, and hovers
        must not wait for it). Use `document_async` where the newest text matters."""
        text = self.workspace.get_text_document(uri).source
        old = self.documents.get(uri)
        if old is None:
            old = self.documents[uri] = parse_document(self.path(uri), text)
        elif old.text != text:
            self._reparse(uri)
        return old

    async def document_async(self, uri: str) -> Document:
        """The parsed document of the current text."""
        while True:
            doc = self.document(uri)
            if doc.text == self.workspace.get_text_document(uri).source:
                return doc
            await self._reparse(uri)

    def _reparse(self, uri: str) -> asyncio.Future[None]:
        running = self._parsing.get(uri)
        if running is not None and not running.done():
            return running
        text = self.workspace.get_text_document(uri).source
        old = self.documents.get(uri)

        async def parse() -> None:
            doc = await asyncio.to_thread(parse_document, self.path(uri), text, old)
            if uri in self.documents:  # not closed meanwhile
                self.documents[uri] = doc

        task = self._parsing[uri] = asyncio.get_running_loop().create_task(parse())
        return task

    def path(self, uri: str) -> str:
        return to_fs_path(uri) or uri

    def positions(self, uri: str) -> Positions:
        text = self.workspace.get_text_document(uri).source
        cached = self._positions.get(uri)
        if cached is None or cached[0] is not text:
            encoding = self.workspace.position_encoding or types.PositionEncodingKind.Utf16
            cached = self._positions[uri] = (text, Positions(text, encoding))
        return cached[1]

    # -- diagnostics ------------------------------------------------------------------------

    def set_diagnostics(self, uri: str, bucket: str, diagnostics: list[types.Diagnostic]) -> None:
        buckets = self.diagnostic_buckets.setdefault(uri, {})
        buckets[bucket] = diagnostics
        merged = [d for items in buckets.values() for d in items]
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=merged))

    def lsp_diagnostic(self, uri: str, diag: Diagnostic) -> types.Diagnostic:
        positions = self.positions(uri)
        span = diag.span
        if span.start_line == span.end_line and span.start_col == span.end_col:
            span = positions.line_span(span.start_line)
        return types.Diagnostic(
            range=positions.range(span),
            severity=_SEVERITY[diag.severity],
            message=diag.message,
            source=diag.source,
            code=diag.code,
        )

    # -- status -----------------------------------------------------------------------------

    def forget(self, uri: str) -> None:
        """Drop what is kept for a closed document (its results stay in the store)."""
        for cache in (self.documents, self.symbols, self._positions, self.resources, self.evaluations):
            cache.pop(uri, None)

    async def aclose(self) -> None:
        self.watcher.stop()
        await self.jobs.aclose()
        await self.host.aclose()

    def send_status(self) -> None:
        try:
            self.protocol.notify(STATUS_NOTIFICATION, {"jobs": [j.status() for j in self.jobs.running()]})
        except Exception:  # no client yet (tests construct the server bare)
            log.debug("status not sent", exc_info=True)


_SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "information": types.DiagnosticSeverity.Information,
    "hint": types.DiagnosticSeverity.Hint,
}


def is_cuda(uri: str) -> bool:
    return Path(uri).suffix in CUDA_SUFFIXES


def create_server() -> KernelLanguageServer:
    """A server with every feature registered (each module adds its own)."""
    from kernel_lsp.server import actions, compiling, evaluations, handback, lifecycle, navigation

    server = KernelLanguageServer()
    for feature in (lifecycle, navigation, compiling, evaluations, actions, handback):
        feature.register(server)
    return server
