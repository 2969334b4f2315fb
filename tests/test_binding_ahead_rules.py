"""When the server compiles a new file's main.cpp ahead (server/build_ahead.py, BuildAhead.binding):
the rules, each with the reason it gives. The work itself runs through a real LSP client in
tests/engine/test_build_cache_prepare_lsp.py."""

from __future__ import annotations

import types

from kernel_lsp.config import Settings
from kernel_lsp.server.build_ahead import BuildAhead
from kernel_lsp.server.state import DocumentState

PY = "from torch.utils.cpp_extension import load_inline\next = load_inline(name='e', cpp_sources='')\n"


def why(text: str = PY, path: str = "/w/new.py", measured: bool = False, **settings) -> str | None:
    ahead = BuildAhead(types.SimpleNamespace(settings=Settings(**settings)))
    state = DocumentState(uri="file://" + path, path=path, version=1, text=text)
    if measured:
        state.measurement = object()  # type: ignore[assignment]
    return ahead.binding_why_not(state)


def test_a_new_load_inline_file_is_compiled_ahead_by_default() -> None:
    assert why() is None  # on_save's default, compile, builds


def test_what_keeps_it_from_being_compiled_ahead() -> None:
    assert why(build_while_typing=False) == "build_while_typing is off"
    assert why(execution_enabled=False) == "running code is off"
    assert why(on_save=[]) == "saves build nothing (on_save)"
    assert why(executor="ray") == "builds run on the ray executor"
    assert why(text="import torch\n") == "no load_inline call"
    assert why(path="/w/kernel.cu") == "no load_inline call"
    assert why(measured=True) == "the file is measured: its edits are built whole"
