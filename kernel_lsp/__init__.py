"""kernel-lsp: GPU kernel work inside the edit loop."""

__version__ = "0.1.0"
