// How many cycles per warp instruction MUFU.EX2 (and FFMA) take on this GPU: each warp runs N independent
// chains of ex2 for `iters` rounds; clock64 around the loop; blocks of W warps, one block per SM.
#include <cstdio>
#include <cuda_runtime.h>
template <int N, int OP>
__global__ void k(float* out, long long* cyc, int iters) {
  float v[N];
  for (int i = 0; i < N; ++i) v[i] = -0.001f * (threadIdx.x + i);
  __syncthreads();
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (OP == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(v[i]));
      else asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFFF, 0f00000000;" : "+f"(v[i]));
    }
  }
  long long t1 = clock64();
  float s = 0; for (int i = 0; i < N; ++i) s += v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x % 32 == 0) cyc[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
}
template <int N, int OP> void run(int warps, const char* what) {
  float* out; long long* cyc; cudaMalloc(&out, 132 * 1024 * 4); cudaMalloc(&cyc, 132 * 32 * 8);
  const int iters = 2000;
  k<N, OP><<<132, warps * 32>>>(out, cyc, iters); cudaDeviceSynchronize();
  k<N, OP><<<132, warps * 32>>>(out, cyc, iters); cudaDeviceSynchronize();
  long long h[32]; cudaMemcpy(h, cyc, warps * 8, cudaMemcpyDeviceToHost);
  double c = 0; for (int w = 0; w < warps; ++w) c += h[w]; c /= warps;
  printf("%-6s N=%2d warps/SM=%2d (per SMSP %d): %.2f cycles per warp instruction per warp, %.2f per SMSP\n", what, N, warps,
         (warps + 3) / 4, c / (double(iters) * N), c / (double(iters) * N) / ((warps + 3) / 4));
  cudaFree(out); cudaFree(cyc);
}
int main() {
  for (int w : {4, 8, 16}) { run<16, 0>(w, "ex2"); run<32, 0>(w, "ex2"); }
  for (int w : {4, 8}) run<16, 1>(w, "ffma");
  return 0;
}
