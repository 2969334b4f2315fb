"""A small CPU Task for the command-line tests: row sums in a short Python loop (slow next to
one matrix-vector product, and quick for torch.compile to trace: 16 rows)."""

import torch
import torch.nn as nn

ROWS, COLS = 16, 512


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
