// C = A @ B for row-major float32 matrices, tiled through shared memory: each block computes
// a TILE x TILE tile of C, one element per thread, stepping over K one TILE-wide slab at a time.
// Tunable: TILE (block is TILE x TILE threads; TILE*TILE <= 1024).
#include <cuda_runtime.h>

#ifndef TILE
#define TILE 8  // correct but slow: 16 or 32 reuses each loaded element far more
#endif

__global__ void __launch_bounds__(TILE * TILE) matmul_kernel(const float* __restrict__ A,
                                                             const float* __restrict__ B,
                                                             float* __restrict__ C, int M, int N, int K) {
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE + 1];  // +1: no bank conflicts on the column reads
  const int row = blockIdx.y * TILE + threadIdx.y;
  const int col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += TILE) {
    const int ak = k0 + threadIdx.x, bk = k0 + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ak < K) ? A[(size_t)row * K + ak] : 0.0f;
    Bs[threadIdx.y][threadIdx.x] = (bk < K && col < N) ? B[(size_t)bk * N + col] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) C[(size_t)row * N + col] = acc;
}

extern "C" int matmul_forward(const float* A, const float* B, float* C, int M, int N, int K,
                              cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0) return (int)cudaErrorInvalidValue;
  dim3 block(TILE, TILE);
  dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
  matmul_kernel<<<grid, block, 0, stream>>>(A, B, C, M, N, K);
  return (int)cudaGetLastError();
}
