"""`make gpu-test` runs this first: the interpreter must have pytest and a CUDA build of torch
that sees a GPU, or the gpu tests would all be skipped and the run would look like a pass."""

import sys

try:
    import pytest  # noqa: F401
    import torch
except ImportError as exc:
    sys.exit(f"gpu-test: {sys.executable} cannot run the gpu tests: {exc} (set GPU_PY=/path/to/python)")

if torch.version.cuda is None:
    sys.exit(f"gpu-test: {sys.executable} has torch {torch.__version__}, a CPU-only build (set GPU_PY)")
if not torch.cuda.is_available():
    sys.exit(f"gpu-test: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
print(f"gpu-test: {sys.executable}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
