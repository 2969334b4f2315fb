"""The tanh approximation of GELU where the reference uses erf (a common fused-kernel shortcut).
EXPECTED: less_accurate (an approximation: hundreds of times PyTorch's error, within 1e-2)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECTED = "less_accurate"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.gelu(x)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def get_inputs():
    return [torch.randn(128, 2048)]


def get_init_inputs():
    return []
