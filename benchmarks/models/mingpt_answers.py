"""What the scripted endpoint answers for the minGPT block's ops (benchmarks/whole_model.py and
the GPU test): a fused CUDA kernel for NewGELU (load_inline; one pass instead of seven
elementwise kernels), and a PyTorch rewrite of the attention with scaled_dot_product_attention
(labelled as such, never counted as a kernel)."""

GELU_KERNEL = r'''"""NewGELU as one fused CUDA kernel: one read and one write per element."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

__device__ __forceinline__ float new_gelu(float v) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
}

__global__ void new_gelu_kernel(const float4* __restrict__ x, float4* __restrict__ y, long n4,
                                const float* __restrict__ xs, float* __restrict__ ys, long n) {
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = x[i];
        v.x = new_gelu(v.x); v.y = new_gelu(v.y); v.z = new_gelu(v.z); v.w = new_gelu(v.w);
        y[i] = v;
    }
    for (long i = 4 * n4 + (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        ys[i] = new_gelu(xs[i]);
    }
}

torch::Tensor new_gelu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "new_gelu: a float32 CUDA tensor");
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    long n = xc.numel();
    long n4 = n / 4;
    int threads = 256;
    long want = (n4 + threads - 1) / threads;
    int blocks = (int)(want < 1 ? 1 : (want > 65535 ? 65535 : want));
    new_gelu_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const float4*>(xc.data_ptr<float>()), reinterpret_cast<float4*>(y.data_ptr<float>()), n4,
        xc.data_ptr<float>(), y.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

_ext = load_inline(name="klsp_mingpt_new_gelu", cpp_sources="torch::Tensor new_gelu_forward(torch::Tensor x);",
                   cuda_sources=CUDA_SRC, functions=["new_gelu_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x0):
        return _ext.new_gelu_forward(x0)
'''

ATTENTION_SDPA = '''"""The causal attention through scaled_dot_product_attention (a PyTorch rewrite)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class _Attention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.n_embd = n_embd


class ModelNew(nn.Module):
    def __init__(self, n_embd, n_head, attn_pdrop, resid_pdrop, max_seqlen):
        super().__init__()
        self.op = _Attention(n_embd, n_head)

    def forward(self, x0):
        B, T, C = x0.size()
        q, k, v = self.op.c_attn(x0).split(self.op.n_embd, dim=2)
        q = q.view(B, T, self.op.n_head, C // self.op.n_head).transpose(1, 2)
        k = k.view(B, T, self.op.n_head, C // self.op.n_head).transpose(1, 2)
        v = v.view(B, T, self.op.n_head, C // self.op.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.op.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
'''

# op name in the model -> the answers its Search gets, in order
ANSWERS = {
    "mlp.act": [("One fused CUDA kernel for the tanh GELU (float4 loads).", GELU_KERNEL)],
    "attn": [("Causal attention through scaled_dot_product_attention.", ATTENTION_SDPA)],
}


def fenced(note: str, source: str) -> str:
    return f"{note}\n```python\n{source}```\n"
