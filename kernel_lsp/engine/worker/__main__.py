"""``python -m kernel_lsp.engine.worker``: the Worker process (main.py)."""

from kernel_lsp.engine.worker.main import main

raise SystemExit(main())
