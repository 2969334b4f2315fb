"""CPU reference Task for the cheat tests: relu(linear(x)) * 2 on float32."""
import torch
import torch.nn as nn

N = 64


class Model(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * 2.0


def get_inputs():
    return [torch.randn(32, N)]


def get_init_inputs():
    return [N]
