"""A tree (pairwise) reduction over rows of 65,536 elements: halve, add, repeat.
EXPECTED: correct."""
import torch
import torch.nn as nn

EXPECTED = "correct"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x, dim=1)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        while x.shape[1] > 1:
            half = x.shape[1] // 2
            x = x[:, :half] + x[:, half:]
        return x[:, 0]


def get_inputs():
    return [torch.randn(64, 65536)]


def get_init_inputs():
    return []
