import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A @ B with K = 32 (KernelBench level 1 problem 7's shape, smaller): memory-bound."""

    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(4096, 32, device="cuda"), torch.randn(32, 4096, device="cuda")]


def get_init_inputs():
    return []
