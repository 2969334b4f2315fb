"""Correct, but memoizes by input values: slow (10 ms) on new inputs, instant on repeats."""
import time

import torch
import torch.nn as nn

_SEEN: dict = {}


class ModelNew(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (x.shape, float(x.sum()), float(x.reshape(-1)[0]), float(x.reshape(-1)[-1]))
        if key not in _SEEN:
            time.sleep(0.01)
            y = torch.einsum("bi,oi->bo", x, self.linear.weight) + self.linear.bias
            y = y.clamp(min=0)
            _SEEN[key] = y + y
        return _SEEN[key].clone()
