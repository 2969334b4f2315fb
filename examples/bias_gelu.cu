// y = gelu(x + bias), exact (erf) GELU, bias broadcast over the last dim, float32.
// Tunable: BLOCK_SIZE (threads per block) and ITEMS_PER_THREAD (elements each thread handles).
#include <cuda_runtime.h>
#include <math.h>

#ifndef BLOCK_SIZE
#define BLOCK_SIZE 32  // correct but slow: 256 fills the SM
#endif
#ifndef ITEMS_PER_THREAD
#define ITEMS_PER_THREAD 1  // 4 amortizes index math and keeps more loads in flight
#endif

__device__ __forceinline__ float gelu(float v) {
  return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
}

__global__ void __launch_bounds__(BLOCK_SIZE) bias_gelu_kernel(const float* __restrict__ x,
                                                               const float* __restrict__ bias,
                                                               float* __restrict__ y, long long n,
                                                               int cols) {
  const long long base = (long long)blockIdx.x * BLOCK_SIZE * ITEMS_PER_THREAD + threadIdx.x;
#pragma unroll
  for (int i = 0; i < ITEMS_PER_THREAD; ++i) {
    const long long idx = base + (long long)i * BLOCK_SIZE;  // strided: loads stay coalesced
    if (idx < n) y[idx] = gelu(x[idx] + bias[idx % cols]);
  }
}

extern "C" int bias_gelu_forward(const float* x, const float* bias, float* y, long long n, int cols,
                                 cudaStream_t stream) {
  if (n <= 0 || cols <= 0) return (int)cudaErrorInvalidValue;
  const long long per_block = (long long)BLOCK_SIZE * ITEMS_PER_THREAD;
  const long long blocks = (n + per_block - 1) / per_block;
  if (blocks > 2147483647LL) return (int)cudaErrorInvalidConfiguration;
  bias_gelu_kernel<<<(unsigned)blocks, BLOCK_SIZE, 0, stream>>>(x, bias, y, n, cols);
  return (int)cudaGetLastError();
}
