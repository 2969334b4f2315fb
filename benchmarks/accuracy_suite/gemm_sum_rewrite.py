"""More accurate than PyTorch: a GEMM followed by a sum over its output features, rewritten
algebraically (sum the weight's rows first, then one matrix-vector product). The fp32 reference
rounds a 4096-wide GEMM and then sums its outputs; the rewrite never forms them.
EXPECTED: correct (about the reference's own error), flagged algebraic_shortcut: it counts a GEMV's
FLOPs where the reference counts a GEMM's (counted, labelled; 27x eager on an H200 in its KernelBench
form)."""
import torch
import torch.nn as nn

EXPECTED = "correct"
EXPECTED_FLAGS = ["algebraic_shortcut"]


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.linear(x).sum(dim=1, keepdim=True)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        w = self.linear.weight.sum(dim=0)          # (in,)
        return (x @ w + self.linear.bias.sum()).unsqueeze(1)


def get_inputs():
    return [torch.randn(128, 1024)]


def get_init_inputs():
    return [1024, 4096]
