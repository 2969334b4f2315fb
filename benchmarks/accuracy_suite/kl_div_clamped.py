"""KL divergence whose "safe" log clamps the predictions at 1.8e-5: off by about 0.7 % on these
inputs (a bug that a fixed 1e-2 tolerance accepts). EXPECTED: mismatch."""
import torch
import torch.nn as nn

EXPECTED = "mismatch"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.nn.functional.kl_div(torch.log(predictions), targets, reduction="batchmean")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        logp = torch.log(predictions.clamp_min(1.8e-5))
        return (targets * (torch.log(targets) - logp)).sum() / predictions.shape[0]


def get_inputs():
    return [torch.randn(128, 4096).softmax(dim=-1), torch.randn(128, 4096).softmax(dim=-1)]


def get_init_inputs():
    return []
