"""A small model whose submodules are called in the ways an extracted Task must reproduce:
token ids (integer inputs in a range), a keyword constant, a module built from a config object,
non-negative inputs, and a torch.nn module with keyword constructor arguments."""

import torch
import torch.nn as nn


class Config:
    def __init__(self, dim):
        self.dim = dim


class Scale(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(config.dim))

    def forward(self, x):
        return x * self.weight


class Pow(nn.Module):
    def forward(self, x, exponent=1.0):
        return x.pow(exponent)


class Model(nn.Module):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.scale = Scale(Config(dim))
        self.relu = nn.ReLU()
        self.pow = Pow()
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, ids):
        h = self.relu(self.scale(self.embed(ids)))
        return self.norm(self.pow(h, exponent=0.5))


def get_inputs():
    return [torch.randint(0, 50, (4, 16))]


def get_init_inputs():
    return [50, 32]
