"""Files changed outside the editor (watchdog): a harness or header that changes re-runs the
checks of the open documents that depend on it."""

from __future__ import annotations

import asyncio
import logging
import os
import re

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernel_lsp.server.app import KernelLanguageServer

log = logging.getLogger(__name__)

WATCHED = (".py", ".cu", ".cuh", ".h", ".hpp")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def dependents(ls: "KernelLanguageServer", changed: str) -> list[str]:
    """Open documents whose checks depend on `changed` (not the file itself)."""
    changed = os.path.abspath(changed)
    out = []
    for uri, state in list(ls.states.items()):
        path = os.path.abspath(state.path)
        if path == changed:
            continue
        stem = os.path.splitext(path)[0]
        harness = stem + ".py" if path.endswith(".cu") else None
        includes = {os.path.abspath(os.path.join(os.path.dirname(path), inc))
                    for inc in INCLUDE.findall(state.text)}
        if changed == harness or changed in includes or changed == stem + ".cu":
            out.append(uri)
    return out


class Watcher:
    def __init__(self, ls: "KernelLanguageServer") -> None:
        self.ls = ls
        self.observer = None

    def start(self, root: str) -> None:
        try:
            from watchdog.events import FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:  # watching is a convenience; the editor's own events still work
            log.warning("watchdog is not installed: files changed outside the editor are not seen")
            return
        loop = asyncio.get_running_loop()
        ls = self.ls

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:  # watchdog's thread: hand over to the loop
                if event.is_directory or event.event_type not in ("modified", "created", "moved"):
                    return
                path = getattr(event, "dest_path", None) or event.src_path
                if isinstance(path, bytes):
                    path = path.decode(errors="replace")
                if path.endswith(WATCHED) and "/.kernel-lsp/" not in path:
                    loop.call_soon_threadsafe(changed_on_disk, ls, path)

        self.observer = Observer()
        self.observer.schedule(Handler(), root, recursive=True)
        self.observer.daemon = True
        self.observer.start()

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer = None


def changed_on_disk(ls: "KernelLanguageServer", path: str) -> None:
    for uri in dependents(ls, path):
        state = ls.states.get(uri)
        if state is not None:
            log.info("%s changed: re-checking %s", path, uri)
            ls.dispatch("dependency_changed", state, path)
