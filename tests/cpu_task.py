"""The CPU task the editor tests share: a KernelBench file whose ModelNew is a slow row loop,
and the faster whole file (one torch.mv) that a scripted LLM answers with."""

TASK = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.sum(dim=1)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        ones = torch.ones(x.shape[1], dtype=x.dtype)
        out = torch.empty(x.shape[0], dtype=x.dtype)
        for i in range(x.shape[0]):
            out[i] = torch.dot(x[i], ones)
        return out


def get_inputs():
    return [torch.randn(384, 256)]


def get_init_inputs():
    return []
'''
LOOP = ("        out = torch.empty(x.shape[0], dtype=x.dtype)\n"
        "        for i in range(x.shape[0]):\n"
        "            out[i] = torch.dot(x[i], ones)\n")
FASTER = TASK.replace(LOOP, "        out = torch.mv(x, ones)\n")
assert FASTER != TASK


def fenced(note: str, source: str) -> str:
    """An LLM answer holding a whole file."""
    return f"{note}\n\n```python\n{source}```\n"
