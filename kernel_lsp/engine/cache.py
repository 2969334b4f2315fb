"""Where the build cache lives (the Worker's builds, the precompiled torch header, cluster builds)."""

from __future__ import annotations

import os
from pathlib import Path


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
