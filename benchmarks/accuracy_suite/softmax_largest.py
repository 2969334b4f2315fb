"""The largest size: KernelBench level 1 problem 23's current Softmax, a 6 GiB input and a 6 GiB
output (4096 x 393216 fp32). Five input sets, their expected outputs and a float64 copy do not fit
on a 141 GB H200 at once: verify keeps the sets and expected outputs on the host, runs the float64
reference on the host CPU when the GPU has no room, checks 2 fresh sets (above 2 GiB a set), and
says so in its notes. LARGEST: GPU only (verify_accuracy.py skips it on the CPU).
EXPECTED: correct."""
import torch
import torch.nn as nn

EXPECTED = "correct"
LARGEST = True
batch_size = 4096
dim = 393216


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


class ModelNew(nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.amax(dim=1, keepdim=True))
        return e / e.sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
