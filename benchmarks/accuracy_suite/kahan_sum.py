"""A compensated (Kahan) sum over rows, 256 columns at a time: more accurate than PyTorch's.
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
        blocks = x.reshape(x.shape[0], -1, 256).sum(dim=2)   # partial sums of 256 terms
        total = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        comp = torch.zeros_like(total)
        for j in range(blocks.shape[1]):
            y = blocks[:, j] - comp
            t = total + y
            comp = (t - total) - y
            total = t
        return total


def get_inputs():
    return [torch.randn(64, 65536) + 1.0]


def get_init_inputs():
    return []
