"""The no-LLM path for module Targets: own the kernels torch.compile writes, then tune them.

writer.py   Inductor's output module -> a standalone, readable ModelNew file (Triton + torch)
sweep.py    launch-configuration variants of a generated file (the tuner's candidates)
proposer.py the Proposer: the generated file first, then the sweep, with eager as the floor

The Worker side (worker/inductor_code.py in the engine) records Inductor's code on the GPU;
everything here is plain text work and runs anywhere (CPU tests use recorded modules).
"""

from .writer import NotConvertible, write_model_new

__all__ = ["NotConvertible", "write_model_new"]
