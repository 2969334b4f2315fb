"""A bf16 GELU computed in fp32 and rounded once (more accurate than bf16 PyTorch on CPU).
EXPECTED: correct (bf16 variant)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

EXPECTED = "correct"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.gelu(x) * 1.5 + x


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = x.float()
        return (F.gelu(y) * 1.5 + y).to(x.dtype)


def get_inputs():
    return [torch.randn(256, 4096, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
