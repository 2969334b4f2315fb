"""Rich output for the command line."""

from __future__ import annotations

import sys


def console(stderr: bool = False, **kwargs):
    """A rich Console for tables: its own width on a terminal, 160 columns when piped."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160, highlight=False, **kwargs)
