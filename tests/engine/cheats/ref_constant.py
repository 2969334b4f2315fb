"""A weak reference: its output hardly depends on the input (softmax over a dim of size 1)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(16, 1)]


def get_init_inputs():
    return []
