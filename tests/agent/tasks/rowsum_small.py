"""A CPU test Task whose torch.compile baseline is quick to build (32 rows, not 384): both
baselines of a Search's result are measured for real on the CPU."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty(x.shape[0], dtype=x.dtype)
        for i in range(x.shape[0]):
            out[i] = x[i].sum()
        return out


def get_inputs():
    return [torch.randn(32, 4096)]


def get_init_inputs():
    return []
