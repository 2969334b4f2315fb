// LayerNorm over the last dim (float32) with weight and bias: one block per row,
// two-pass mean / variance with warp-shuffle block reductions.
// Tunable: BLOCK_SIZE (threads per block, a multiple of 32, <= 1024).
#include <cuda_runtime.h>

#ifndef BLOCK_SIZE
#define BLOCK_SIZE 32  // correct but slow: 256 or 512 is better on wide rows
#endif

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = (lane < BLOCK_SIZE / 32) ? scratch[lane] : 0.0f;
  r = warp_sum(r);
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

__global__ void __launch_bounds__(BLOCK_SIZE) layernorm_kernel(
    const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
    float* __restrict__ y, int cols, float eps) {
  __shared__ float scratch[32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float* out = y + (size_t)blockIdx.x * cols;

  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) s += row[c];
  const float mean = block_sum(s, scratch) / cols;

  float v = 0.0f;
  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) {
    const float d = row[c] - mean;
    v += d * d;
  }
  const float rstd = rsqrtf(block_sum(v, scratch) / cols + eps);

  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE)
    out[c] = (row[c] - mean) * rstd * weight[c] + bias[c];
}

extern "C" int layernorm_forward(const float* x, const float* weight, const float* bias, float* y,
                                 int rows, int cols, float eps, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return (int)cudaErrorInvalidValue;
  layernorm_kernel<<<rows, BLOCK_SIZE, 0, stream>>>(x, weight, bias, y, cols, eps);
  return (int)cudaGetLastError();
}
