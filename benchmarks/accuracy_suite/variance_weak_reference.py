"""A numerically weak reference: the textbook one-pass variance E[x^2] - E[x]^2 in fp32 on rows whose
mean (1000) is 1000x their spread: the subtraction cancels six digits and the reference is about
0.27 of scale off float64. The candidate computes the variance exactly (two passes: about 1e-7 off).
Run twice on one input the reference agrees with itself: it is deterministic, not random.
EXPECTED: correct, flagged weak_reference (judged against float64; the fixed tolerance against the
reference called it a mismatch, and so did the previous rule, which dropped the oracle here)."""
import torch
import torch.nn as nn

EXPECTED = "correct"
EXPECTED_FLAGS = ["weak_reference"]


class Model(nn.Module):
    def forward(self, x):
        return (x * x).mean(dim=-1) - x.mean(dim=-1) ** 2


class ModelNew(nn.Module):
    def forward(self, x):
        centred = x - x.mean(dim=-1, keepdim=True)
        return (centred * centred).mean(dim=-1)


def get_inputs():
    return [torch.randn(256, 4096) + 1000.0]


def get_init_inputs():
    return []
