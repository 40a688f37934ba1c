// Warp-level primitives of the portable attention kernel (sm_80 .. sm_90): cp.async, ldmatrix and
// mma.sync m16n8k16 with fp32 accumulation. Each wrapper names the PTX instruction it emits; the
// fragment layouts they rely on are those of the PTX ISA ("Matrix Fragments for mma.m16n8k16").
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sparge::cuda::attn {

// ---- element types -----------------------------------------------------------------------------
// Elem<T> packs two fp32 values into one .b32 register of T (the lower column in the low half, as
// the mma fragments expect) and names the mma's type suffix.
template <class T>
struct Elem;

template <>
struct Elem<__half> {
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};

template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

// ---- cp.async ------------------------------------------------------------------------------------
__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes global -> shared, bypassing L1 (.cg). With valid == false nothing is read
// (src-size 0) and the 16 destination bytes are zero-filled: this is how tails are predicated, so a
// row past the sequence contributes exact zeros and `src` only has to be some mapped address.
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix ------------------------------------------------------------------------------------
// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i of every
// lane receives matrix i's elements (row lane/4, columns 2*(lane%4), +1).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Same, transposed: register i of a lane receives elements (2*(lane%4), lane/4) and
// (2*(lane%4)+1, lane/4) of matrix i as stored (row, column).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- mma.sync ------------------------------------------------------------------------------------
// d = a (16x16, row) * b (16x8, col) + d, fp32 accumulate.
// a: {row g, k 2t..}, {row g+8, k 2t..}, {row g, k 2t+8..}, {row g+8, k 2t+8..}
// b: {k 2t.., n g}, {k 2t+8.., n g}
// d: {row g, n 2t}, {row g, n 2t+1}, {row g+8, n 2t}, {row g+8, n 2t+1}    (g = lane/4, t = lane%4)
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const std::uint32_t (&a)[4],
                                                  std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const std::uint32_t (&a)[4],
                                                         std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- quad reductions ---------------------------------------------------------------------------
// The four lanes of a quad (same g) hold the columns of one accumulator row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace sparge::cuda::attn
