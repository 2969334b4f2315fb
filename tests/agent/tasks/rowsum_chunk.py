"""A Candidate for rowsum with a tunable constant: rows are summed CHUNK at a time, so a
larger CHUNK means fewer Python iterations (the tuner should find that)."""

import torch
import torch.nn as nn

REFERENCE = "rowsum.py"
CHUNK = 1


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        ones = torch.ones(x.shape[1], dtype=x.dtype)
        out = torch.empty(x.shape[0], dtype=x.dtype)
        for i in range(0, x.shape[0], CHUNK):
            out[i:i + CHUNK] = torch.mv(x[i:i + CHUNK], ones)
        return out
