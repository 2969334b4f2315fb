"""Linear -> Dropout(0.2): dropout is random in training mode, so only eval mode can be
verified (the Evaluation says so). The candidate is the eval-mode computation.
EXPECTED: correct."""
import torch
import torch.nn as nn

EXPECTED = "correct"


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.linear(x))


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x):
        return torch.addmm(self.linear.bias, x, self.linear.weight.t())


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
