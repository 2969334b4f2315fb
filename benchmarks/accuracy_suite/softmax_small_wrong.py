"""A softmax whose store of the small entries (below e^-8 of the row's largest) scales them twice:
twice the right value there, right on the large ones and in the sum. A fixed 1e-2 accepts it.
EXPECTED: mismatch."""
import torch
import torch.nn as nn

EXPECTED = "mismatch"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        shifted = x - x.max(dim=1, keepdim=True).values
        e = torch.exp(shifted)
        out = e / e.sum(dim=1, keepdim=True)
        return torch.where(shifted < -8.0, 2.0 * out, out)


def get_inputs():
    return [torch.randn(64, 16384) * 3.0]


def get_init_inputs():
    return []
