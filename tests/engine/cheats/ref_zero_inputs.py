"""A weak reference: times and checks on all-zero inputs."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1.0


def get_inputs():
    return [torch.zeros(8, 8)]


def get_init_inputs():
    return []


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clamp(min=0) + 1.0
