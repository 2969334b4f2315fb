// Sum over the last dim: x[rows, cols] -> y[rows], float32. One block per row; each thread
// accumulates a strided slice with UNROLL independent partial sums, then a warp-shuffle
// block reduction.
// Tunable: BLOCK_SIZE (a multiple of 32, <= 1024) and UNROLL (independent accumulators).
#include <cuda_runtime.h>

#ifndef BLOCK_SIZE
#define BLOCK_SIZE 32  // correct but slow: 256 or 512 hides memory latency far better
#endif
#ifndef UNROLL
#define UNROLL 1  // 4 gives each thread several loads in flight
#endif

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

__global__ void __launch_bounds__(BLOCK_SIZE) reduce_sum_kernel(const float* __restrict__ x,
                                                                float* __restrict__ y, int cols) {
  __shared__ float scratch[32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float acc[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) acc[u] = 0.0f;
  int c = threadIdx.x;
  for (; c + (UNROLL - 1) * BLOCK_SIZE < cols; c += UNROLL * BLOCK_SIZE) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc[u] += row[c + u * BLOCK_SIZE];
  }
  for (; c < cols; c += BLOCK_SIZE) acc[0] += row[c];  // the tail
  float s = 0.0f;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) s += acc[u];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  s = warp_sum(s);
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  if (warp == 0) {
    float r = (lane < BLOCK_SIZE / 32) ? scratch[lane] : 0.0f;
    r = warp_sum(r);
    if (lane == 0) y[blockIdx.x] = r;
  }
}

extern "C" int reduce_sum_forward(const float* x, float* y, int rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return (int)cudaErrorInvalidValue;
  reduce_sum_kernel<<<rows, BLOCK_SIZE, 0, stream>>>(x, y, cols);
  return (int)cudaGetLastError();
}
