"""A softmax whose fast exp doubles its value for arguments below -8 (a range-reduction slip):
twice the right value on the small entries, right on the large ones. A fixed 1e-2 accepts it.
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
        e = torch.where(shifted < -8.0, 2.0 * e, e)
        return e / e.sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(64, 16384) * 3.0]


def get_init_inputs():
    return []
