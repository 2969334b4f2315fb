"""The kernel-lsp language server (pygls 2.x): one state per document, one dispatcher.

One direction: document events become jobs, job results become editor
features. The server keeps a `DocumentState` per open document and hands every event
to its features (compile, evaluation, optimize, navigation), which own their part of that
state. Nothing here blocks the event loop: compiles are asyncio subprocesses, GPU work
lives in engine Workers, and no handler uses `@server.thread()` (pygls reads stdin on
that pool).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from kernel_lsp import __version__
from kernel_lsp.config import Settings, SettingsError, load_settings
from kernel_lsp.model import Diagnostic
from kernel_lsp.server.build_cache import BuildCachePreparation
from kernel_lsp.server.commands import CommandError
from kernel_lsp.server.compile import CompileFeature
from kernel_lsp.server.engine_host import EngineHost
from kernel_lsp.server.evaluation import EvaluationFeature, status_entry
from kernel_lsp.server.feature import LanguageFeature
from kernel_lsp.server.jobs import Jobs
from kernel_lsp.server.navigation import NavigationFeature
from kernel_lsp.server.optimize import OptimizeFeature
from kernel_lsp.server.positions import Positions
from kernel_lsp.server.state import DocumentState
from kernel_lsp.server.watch import Watcher
from kernel_lsp.server.worker_warmup import WorkerWarmUp
from kernel_lsp.source import Document, parse_document

log = logging.getLogger(__name__)

CONFIG_SECTION = "kernelLsp"
STATUS_NOTIFICATION = "kernel-lsp/status"


class KernelLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("kernel-lsp", __version__)
        self.settings = Settings()
        self.init_options: dict[str, Any] = {}
        self.states: dict[str, DocumentState] = {}
        self.jobs = Jobs(on_change=self.send_status)
        self.host = EngineHost(self)
        self.watcher = Watcher(self)
        self.compile = CompileFeature(self)
        self.evaluation = EvaluationFeature(self)
        self.optimize = OptimizeFeature(self)
        self.navigation = NavigationFeature(self)
        self.build_cache = BuildCachePreparation(self)
        self.worker_warmup = WorkerWarmUp(self)
        self.features: list[LanguageFeature] = [self.navigation, self.compile, self.evaluation, self.optimize]

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
            self.show(f"kernel-lsp: {exc}", types.MessageType.Error)
        self.host.settings_changed()  # executor / ray_address changed: (re)connect, no restart

    # -- documents --------------------------------------------------------------------------

    def state(self, uri: str) -> DocumentState:
        """The state of a document; one the client did not open is read from the workspace."""
        state = self.states.get(uri)
        if state is None:
            doc = self.workspace.get_text_document(uri)
            state = self.states[uri] = DocumentState(uri=uri, path=to_fs_path(uri) or uri,
                                                     version=doc.version, text=doc.source)
        return state

    def sync(self, state: DocumentState) -> None:
        """Take the workspace's current text and version into the state."""
        doc = self.workspace.get_text_document(state.uri)
        state.text, state.version = doc.source, doc.version

    def document(self, state: DocumentState) -> Document:
        """The parse, at once: the latest one, which may trail the text by one re-parse
        running in a thread (a 5,000-line file takes ~150 ms to read, and hovers must not
        wait for it). Use `document_async` where the newest text matters."""
        if state.parse is None:
            state.parse = parse_document(state.path, state.text)
        elif state.parse.text != state.text:
            self._reparse(state)
        return state.parse

    async def document_async(self, state: DocumentState) -> Document:
        while True:
            doc = self.document(state)
            if doc.text == state.text:
                return doc
            await self._reparse(state)

    def _reparse(self, state: DocumentState) -> asyncio.Future[None]:
        if state._parsing is not None and not state._parsing.done():
            return state._parsing
        text, old = state.text, state.parse

        async def parse() -> None:
            doc = await asyncio.to_thread(parse_document, state.path, text, old)
            if self.states.get(state.uri) is state:  # not closed meanwhile
                state.parse = doc

        state._parsing = asyncio.get_running_loop().create_task(parse())
        return state._parsing

    def positions(self, state: DocumentState) -> Positions:
        return state.positions(self.workspace.position_encoding or types.PositionEncodingKind.Utf16)

    # -- the dispatcher ---------------------------------------------------------------------

    def dispatch(self, event: str, state: DocumentState, *args: Any) -> None:
        """Hand a document event to every feature; one feature's fault never stops the others."""
        for feature in self.features:
            try:
                getattr(feature, event)(state, *args)
            except Exception:  # noqa: BLE001
                log.exception("%s.%s failed for %s", feature.name, event, state.uri)

    def collect(self, method: str, state: DocumentState, *args: Any) -> list[Any]:
        out: list[Any] = []
        for feature in self.features:
            try:
                out.extend(getattr(feature, method)(state, *args))
            except Exception:  # noqa: BLE001
                log.exception("%s.%s failed for %s", feature.name, method, state.uri)
        return out

    # -- diagnostics ------------------------------------------------------------------------

    def publish(self, state: DocumentState, owned: dict[str, list[types.Diagnostic]],
                version: int | None = None) -> None:
        """Replace the named owners' diagnostics and publish the document's set once, with
        the version of the text they describe."""
        state.diagnostics.update(owned)
        merged = [d for items in state.diagnostics.values() for d in items]
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
            uri=state.uri, diagnostics=merged, version=version))

    def lsp_diagnostic(self, state: DocumentState, diag: Diagnostic) -> types.Diagnostic:
        positions = self.positions(state)
        span = diag.span
        if span.start_line == span.end_line and span.start_col == span.end_col:
            span = positions.line_span(span.start_line)
        return types.Diagnostic(range=positions.range(span), severity=SEVERITY[diag.severity],
                                message=diag.message, source=diag.source, code=diag.code)

    # -- messages, refreshes, status ---------------------------------------------------------

    def show(self, message: str, kind: types.MessageType = types.MessageType.Info) -> None:
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def refresh_lenses(self) -> None:
        workspace = self.client_capabilities.workspace
        lens = workspace.code_lens if workspace else None
        if lens and lens.refresh_support:  # Neovim has no handler: its plugin listens to status
            self.workspace_code_lens_refresh(None)

    def refresh_inlay_hints(self) -> None:
        workspace = self.client_capabilities.workspace
        inlay = workspace.inlay_hint if workspace else None
        if inlay and inlay.refresh_support:
            self.workspace_inlay_hint_refresh(None)

    def send_status(self) -> None:
        """Running jobs (with their unconfirmed best) and each open document's measurement,
        in the words the lens uses, so a statusline never keeps a number the lens dropped."""
        documents = [entry for state in self.states.values()
                     if (entry := status_entry(state)) is not None]
        try:
            self.protocol.notify(STATUS_NOTIFICATION, {
                "jobs": [j.status() for j in self.jobs.running()], "documents": documents,
                "cluster": self.host.cluster.status()})
        except Exception:  # no client yet (tests construct the server bare)
            log.debug("status not sent", exc_info=True)

    async def aclose(self) -> None:
        self.watcher.stop()
        await self.jobs.aclose()  # the build cache's preparation and the Worker's start among them
        for feature in self.features:
            await feature.aclose()
        await self.host.aclose()


SEVERITY = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "information": types.DiagnosticSeverity.Information,
    "hint": types.DiagnosticSeverity.Hint,
}


def create_server() -> KernelLanguageServer:
    """The server with its LSP handlers: each hands the event to the dispatcher."""
    ls = KernelLanguageServer()

    @ls.feature(types.INITIALIZE)
    def initialize(params: types.InitializeParams) -> None:
        options = params.initialization_options
        ls.init_options = dict(options) if isinstance(options, dict) else {}
        ls.reload_settings()

    @ls.feature(types.INITIALIZED)
    async def initialized(params: types.InitializedParams) -> None:
        await pull_configuration(ls)
        if ls.root:
            ls.watcher.start(ls.root)
        ls.build_cache.start()  # the precompiled torch headers, before the first save needs them
        ls.worker_warmup.start()  # the GPU Worker, before the first save needs it

    @ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(params: types.DidChangeConfigurationParams) -> None:
        pushed = params.settings.get(CONFIG_SECTION) if isinstance(params.settings, dict) else None
        if isinstance(pushed, dict):
            ls.reload_settings(pushed)
        else:
            await pull_configuration(ls)

    @ls.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: types.DidOpenTextDocumentParams) -> None:
        state = ls.state(params.text_document.uri)
        ls.sync(state)
        ls.document(state)
        ls.dispatch("did_open", state)

    @ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: types.DidChangeTextDocumentParams) -> None:
        state = ls.state(params.text_document.uri)
        ls.sync(state)
        ls.document(state)  # parse now (incremental) so symbols and hovers follow typing
        ls.dispatch("did_change", state)

    @ls.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(params: types.DidSaveTextDocumentParams) -> None:
        state = ls.state(params.text_document.uri)
        ls.sync(state)
        ls.dispatch("did_save", state)

    @ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: types.DidCloseTextDocumentParams) -> None:
        state = ls.states.pop(params.text_document.uri, None)
        if state is not None:
            ls.dispatch("did_close", state)
            ls.send_status()

    @ls.feature(types.TEXT_DOCUMENT_CODE_LENS)
    def code_lens(params: types.CodeLensParams) -> list[types.CodeLens]:
        return ls.collect("code_lenses", ls.state(params.text_document.uri))

    @ls.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(
        code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.RefactorRewrite,
                           types.CodeActionKind.Source], resolve_provider=False))
    def code_action(params: types.CodeActionParams) -> list[types.CodeAction]:
        return ls.collect("code_actions", ls.state(params.text_document.uri), params)

    ls.navigation.register(ls)

    @ls.feature(types.SHUTDOWN)
    async def shutdown(params: None) -> None:
        await ls.aclose()

    for feature in ls.features:
        for name, handler in feature.commands().items():
            _register_command(ls, name, handler)
    return ls


def _register_command(ls: KernelLanguageServer, name: str, handler: Any) -> None:
    async def run(*args):  # no annotation: pygls inspects the first parameter for the server
        try:
            result = handler(*args)
            return await result if inspect.isawaitable(result) else result
        except CommandError as exc:  # bad arguments or nothing to act on: one message, no traceback
            ls.show(f"kernel-lsp: {exc}", types.MessageType.Error)
            return {"error": str(exc)}
    ls.command(name)(run)


async def pull_configuration(ls: KernelLanguageServer) -> None:
    """Ask the client for the `kernelLsp` section when it can answer."""
    workspace = ls.client_capabilities.workspace
    if not (workspace and workspace.configuration):
        return
    try:
        result = await ls.workspace_configuration_async(
            types.ConfigurationParams(items=[types.ConfigurationItem(section=CONFIG_SECTION)]))
    except Exception as exc:  # a client that errors here still gets the defaults
        log.warning("workspace/configuration failed: %s", exc)
        return
    section = result[0] if result else None
    ls.reload_settings(section if isinstance(section, dict) else None)
