"""The Worker side of the engine: everything that runs inside the sandboxed Worker process,
where a Candidate is built, imported and run (``python -m kernel_lsp.engine.worker``). It
imports torch, the toolchain, the records of ``kernel_lsp.model`` and the wire protocol; never
the caller side, the server, the agent or the CLI.

Grouped by stage. ``build/`` builds and loads a Candidate, ``judge/`` says whether it is
correct, ``timing/`` says how fast it is (each subpackage's docstring lists its modules). At the
top stays what runs the stages or stands beside them: main.py (the process and its ops),
__main__.py, run.py (``evaluate``: the stages in order, the tamper check), harness.py (a Task
and a Candidate as callables and input sets), options.py, notify.py (partial answers and turn
points), early.py (the overlapped start), fences.py (the sandbox from inside), and the ops of
their own: extract.py (where a model's time goes, per submodule) and inductor_code.py (what
torch.compile writes, for the no-LLM writer)."""
