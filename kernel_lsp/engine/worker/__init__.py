"""The Worker side of the engine: everything that runs inside the sandboxed Worker process,
where a Candidate is built, imported and run (``python -m kernel_lsp.engine.worker``). It
imports torch, the toolchain, the records of ``kernel_lsp.model`` and the wire protocol; never
the caller side, the server, the agent or the CLI."""
