"""The same candidate as bn_train_dropped.py, for a Task that declares itself an inference Task
(MODE = "eval"): only eval mode is verified, and it is right there.
EXPECTED: correct."""
import torch
import torch.nn as nn

EXPECTED = "correct"
MODE = "eval"  # an inference Task: training mode is not asked for


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)
        self.bn = nn.BatchNorm1d(n)

    def forward(self, x):
        return torch.tanh(self.bn(self.linear(x)))


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)
        self.bn = nn.BatchNorm1d(n)

    def forward(self, x):
        y = self.linear(x)
        if self.training:
            return y
        scale = self.bn.weight * torch.rsqrt(self.bn.running_var + self.bn.eps)
        return torch.tanh((y - self.bn.running_mean) * scale + self.bn.bias)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
