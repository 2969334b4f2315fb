"""`python -m kernel_lsp.cli`: what editors run when they start the server from an interpreter."""

import sys

from kernel_lsp.cli import main

sys.exit(main())
