"""A matrix-vector product that sums its 131,072 terms strictly in order, one fp32 FMA-free add
per term: a one-thread-per-row kernel (Triton, fused multiply-add off) on a GPU; PyTorch's own sums
are blocked. Without a GPU (or Triton) the same arithmetic as a PyTorch loop: each product rounded
to fp32, then added to the row's sum and rounded (the kernel's, term for term). The loop was the
whole candidate before: 262,144 launches a call, which no GPU run of the suite finished in 200 s.
EXPECTED: correct (tens of times PyTorch's error, about 1e-5 of the output's scale)."""
import torch
import torch.nn as nn

try:
    import triton
    import triton.language as tl
except ImportError:  # a machine without Triton runs the loop below
    triton = None

EXPECTED = "correct"
K = 131072

if triton is not None:
    @triton.jit
    def inorder_rows(a_ptr, b_ptr, out_ptr, K: tl.constexpr):
        row = tl.program_id(0)
        acc = tl.load(a_ptr + row * K) * tl.load(b_ptr)
        for k in range(1, K):  # in order; the launch turns fused multiply-add off
            acc = acc + tl.load(a_ptr + row * K + k) * tl.load(b_ptr + k)
        tl.store(out_ptr + row, acc)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        if triton is not None and A.is_cuda:
            A = A.contiguous()
            b = B.reshape(-1).contiguous()
            out = torch.empty(A.shape[0], dtype=A.dtype, device=A.device)
            inorder_rows[(A.shape[0],)](A, b, out, K=A.shape[1], num_warps=1, enable_fp_fusion=False)
            return out.unsqueeze(1)
        cols = A.t().contiguous()            # (K, M): one column of A per step
        b = B.reshape(-1)
        acc = cols[0] * b[0]
        for k in range(1, cols.shape[0]):    # in order, like the kernel's loop
            acc.add_(cols[k] * b[k])
        return acc.unsqueeze(1)


def get_inputs():
    return [torch.randn(8, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
