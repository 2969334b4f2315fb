"""A part of the server that owns its state and reacts to document events.

The server's one dispatcher calls every feature for each event (open, change, save, close)
and asks each for its share of a request (lenses, code actions, hover sections). A feature
keeps what it needs in the `DocumentState` (or in itself, for state that is not per
document) and never reaches into another feature's part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lsprotocol import types

if TYPE_CHECKING:
    from kernel_lsp.model import Target
    from kernel_lsp.server.app import KernelLanguageServer
    from kernel_lsp.server.state import DocumentState


class LanguageFeature:
    """Override what the feature needs; every hook has a do-nothing default."""

    name = "feature"

    def __init__(self, server: "KernelLanguageServer") -> None:
        self.server = server

    # -- document events --------------------------------------------------------------------
    def did_open(self, state: "DocumentState") -> None: ...
    def did_change(self, state: "DocumentState") -> None: ...
    def did_save(self, state: "DocumentState") -> None: ...
    def did_close(self, state: "DocumentState") -> None: ...
    def dependency_changed(self, state: "DocumentState", path: str) -> None:
        """A file the document's checks read (its harness, a header) changed on disk."""

    # -- request shares ---------------------------------------------------------------------
    def code_lenses(self, state: "DocumentState") -> list[types.CodeLens]:
        return []

    def code_actions(self, state: "DocumentState", params: types.CodeActionParams) -> list[types.CodeAction]:
        return []

    def hover(self, state: "DocumentState", target: "Target") -> list[str]:
        return []

    def commands(self) -> dict[str, Any]:
        """Command name -> handler(args) (sync or async) with typed arguments (commands.py)."""
        return {}

    async def aclose(self) -> None: ...
