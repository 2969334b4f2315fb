"""A pytest-lsp client that behaves like a real editor for our end-to-end tests.

- lsprotocol 2025.0.0 reads a CodeAction that carries a `command` as a bare Command on
  the client side: the converter below tells them apart by their fields (a known lsprotocol 2025.0.0 quirk).
- pytest-lsp's client has no `workspace/applyEdit` handler: this one applies edits to its
  own copy of the documents and records them.
- `wait_for` bounds every wait, as `wait_for_notification` has no timeout.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, Union

from lsprotocol import types
from lsprotocol.converters import get_converter
from pytest_lsp import ClientServerConfig, LanguageClient
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

SERVER = [sys.executable, "-m", "kernel_lsp.cli", "serve"]


def _converter():
    converter = get_converter()

    def structure_action(obj: Any, _: Any):
        if isinstance(obj, dict) and ("title" in obj) and ("kind" in obj or "edit" in obj
                                                            or "diagnostics" in obj or "isPreferred" in obj
                                                            or isinstance(obj.get("command"), dict)):
            return converter.structure(obj, types.CodeAction)
        return converter.structure(obj, types.Command)

    converter.register_structure_hook(Union[types.Command, types.CodeAction], structure_action)
    return converter


class EditorClient(LanguageClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, converter_factory=_converter, **kwargs)
        self.applied_edits: list[types.ApplyWorkspaceEditParams] = []
        self.apply_result = True
        self.statuses: list[dict[str, Any]] = []
        self.message_requests: list[types.ShowMessageRequestParams] = []
        self.show_message_answer: str | None = None  # the action title to pick, None: dismiss
        self.publishes: list[types.PublishDiagnosticsParams] = []  # every publish, in order
        self.lens_refreshes = 0


def _publish_diagnostics(client: EditorClient, params: types.PublishDiagnosticsParams) -> None:
    client.publishes.append(params)
    client.diagnostics[params.uri] = params.diagnostics


def make_client() -> EditorClient:
    client = EditorClient()
    register_lsp_features(client, {**DEFAULT_CLIENT_FEATURES,
                                   types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: _publish_diagnostics})

    @client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(ls: EditorClient, params: types.ApplyWorkspaceEditParams):
        ls.applied_edits.append(params)
        return types.ApplyWorkspaceEditResult(applied=ls.apply_result)

    @client.feature(types.WINDOW_SHOW_MESSAGE_REQUEST)
    def show_message_request(ls: EditorClient, params: types.ShowMessageRequestParams):
        ls.message_requests.append(params)
        return next((a for a in params.actions or [] if a.title == ls.show_message_answer), None)

    @client.feature("kernel-lsp/status")
    def status(ls: EditorClient, params: Any):
        ls.statuses.append(params)

    @client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)
    def inlay_refresh(ls: EditorClient, params: None):
        return None

    @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def lens_refresh(ls: EditorClient, params: None):
        ls.lens_refreshes += 1
        return None

    return client


def config(env: dict[str, str] | None = None) -> ClientServerConfig:
    return ClientServerConfig(server_command=SERVER, client_factory=make_client, server_env=env)


async def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05,
                   what: str = "condition") -> Any:
    """Poll `predicate` (plain or async) until it gives something truthy; fail after `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
