"""Initialization, settings and document sync: each open or save schedules the checks."""

from __future__ import annotations

import logging

from lsprotocol import types

from kernel_lsp.server import compiling, evaluations
from kernel_lsp.server.app import CONFIG_SECTION, KernelLanguageServer

log = logging.getLogger(__name__)


def register(server: KernelLanguageServer) -> None:
    @server.feature(types.INITIALIZE)
    def initialize(ls: KernelLanguageServer, params: types.InitializeParams) -> None:
        options = params.initialization_options
        ls.init_options = dict(options) if isinstance(options, dict) else {}
        ls.reload_settings()

    @server.feature(types.INITIALIZED)
    async def initialized(ls: KernelLanguageServer, params: types.InitializedParams) -> None:
        await pull_configuration(ls)
        if ls.root:
            ls.watcher.start(ls.root)

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: KernelLanguageServer,
                                       params: types.DidChangeConfigurationParams) -> None:
        pushed = params.settings.get(CONFIG_SECTION) if isinstance(params.settings, dict) else None
        if pushed is not None:
            ls.reload_settings(pushed)
        else:
            await pull_configuration(ls)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: KernelLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.document(uri)
        compiling.schedule(ls, uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: KernelLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        # Parse now (incremental, fast) so symbols and hovers follow typing; compile on save.
        ls.document(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: KernelLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.document(uri)
        compiling.schedule(ls, uri)
        evaluations.on_save(ls, uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: KernelLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        job = ls.jobs.get(("compile", uri))
        if job is not None:
            job.task.cancel()
        ls.forget(uri)

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: KernelLanguageServer, params: None) -> None:
        await ls.aclose()


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
