"""A CPU test Task (KernelBench format): row sums, one row at a time in a Python loop,
so that the reference is slow on the CPU and plain-PyTorch candidates can beat it."""

import torch
import torch.nn as nn

ROWS, COLS = 384, 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty(x.shape[0], dtype=x.dtype)
        for i in range(x.shape[0]):
            out[i] = x[i].sum()
        return out


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
