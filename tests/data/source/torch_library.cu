#include <torch/library.h>
#include <torch/extension.h>

__global__ void gelu_kernel(const float* x, float* y, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 0.5f * x[i] * (1.f + erff(x[i] * 0.70710678f));
}

at::Tensor gelu_cuda(const at::Tensor& x) {
  auto y = at::empty_like(x);
  gelu_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}

TORCH_LIBRARY(kernel_ops, m) {
  m.def("gelu(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(kernel_ops, CUDA, m) {
  m.impl("gelu", &gelu_cuda);
}
