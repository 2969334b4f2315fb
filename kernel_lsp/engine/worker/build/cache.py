"""Where the build cache lives (the Worker's builds, the precompiled torch header, cluster builds)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path
from typing import Iterator


def cache_root() -> Path:
    """$KERNEL_LSP_CACHE, else $XDG_CACHE_HOME/kernel-lsp, else ~/.cache/kernel-lsp."""
    env = os.environ.get("KERNEL_LSP_CACHE")
    if env:
        root = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = Path(base) / "kernel-lsp"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (build pool Workers, several editors) on one entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def tool_id(tool: str) -> str:
    """A compiler's identity in a cache key (its real path, size and time): an upgraded compiler
    rebuilds."""
    path = shutil.which(tool) or tool
    try:
        st = os.stat(path)
        return f"{os.path.realpath(path)}:{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        return path
