"""The caller side of the engine: runs in the process that asks for work (server, CLI, agent,
Ray actor). It starts Workers and talks to them over ``kernel_lsp.engine.protocol``; it never
imports torch or ``kernel_lsp.engine.worker`` at import time, and never runs candidate code."""
