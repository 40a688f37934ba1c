// gather_attention, step 2: flash attention of BM rows of one group over the group's key union
// (gather_common.cuh), 64 union positions per step. K/V rows are gathered with cp.async into
// double-buffered shared memory while the previous step computes; S = Q K^T and O += P V use
// mma.sync m16n8k16 (fp16/bf16 in, fp32 accumulation); online softmax in the log2 domain.
// Deterministic: the walk order, the warp's fragment layout and the quad reductions are fixed.
//
// The tile invariant (seed 003: "a tile resolves one row for all its rows, so the gate has to
// encode the invariant that makes the rows interchangeable"): this tile resolves ONE key set for
// all its rows -- the group's union -- and that is only correct because (a) every row of the
// group reads the same kv head (rows = the G heads of one kv head, gr = pos * G + head), so one
// K/V load serves them all, and (b) every row is masked to its own list by its membership mask
// word, so a key in the union that a row did not list contributes exactly nothing (p = 0). The
// rows are interchangeable for the loads, never for the mask.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/gather/gather_common.cuh"

namespace sparge::cuda::gather {

// A tile is W warps x 16 rows (W = 4 or 8: 64- or 128-row tiles, AttnShape); each step gathers 64
// union positions (one 64-bit mask word per row).
constexpr int kBN = 64;
template <int W>
struct AttnShape {
  static constexpr int kWarps = W;
  static constexpr int kThreads = W * 32;
  static constexpr int kBM = 16 * W;
  static constexpr int smem_bytes(int d) { return (kBM + 4 * kBN) * d * 2; }
};

struct AttnArgs {
  Geometry geo;
  const void* q;
  const void* k;
  const void* v;
  std::int64_t q0, q1, q2;  // element strides (dim 3 is contiguous)
  std::int64_t k0, k1, k2;
  std::int64_t v0, v1, v2;
  void* o;
  bool o_f32;
  std::int64_t o0, o1, o2, o3;
  float* lse;  // nullptr when absent
  std::int64_t l0, l1, l2;
  float scale_log2;  // scale * log2(e), computed once on the host
  std::int64_t first_group;
  Scratch scratch;
  // The warp-specialized kernel only (attention_ws.cuh; set by the host from its switches):
  int ws_stages = 0;        // K/V stages of the ring (2 .. kWsMaxStages, within the shared memory)
  int ws_arrive_wait = 0;   // 1: producer threads wait for their copies, fence, then arrive (else noinc)
  int ws_pingpong = 1;      // two consumer warpgroups take turns issuing their wgmmas
  int ws_prefetch = 0;      // 1: union keys and mask words through shared memory (noinc mode only)
  int o_vec16 = 0;          // 1: O has Q's dtype, contiguous 16-byte aligned rows (the staged epilogue)
  // The persistent walk (kPersist): the wave's tiles, row tiles per group.
  std::int64_t ws_tiles = 0;
  int ws_row_tiles = 0;
  // The prefetching wgmma kernels only (SPARGE_GATHER_L2PF=256): K/V gathers carry the .L2::256B
  // prefetch-size hint (a 256-byte row at hd128 is fetched from DRAM as one unit).
  int l2_256 = 0;
};

template <class T>
struct Mma;
template <>
struct Mma<__half> {
  __device__ static void run(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static std::uint32_t pack(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);  // x in the low half: the lower column
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
  __device__ static void store2(__half* p, std::int64_t stride, float x, float y) {
    p[0] = __float2half_rn(x);
    p[stride] = __float2half_rn(y);
  }
};
template <>
struct Mma<__nv_bfloat16> {
  __device__ static void run(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static std::uint32_t pack(float x, float y) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<std::uint32_t*>(&h);
  }
  __device__ static void store2(__nv_bfloat16* p, std::int64_t stride, float x, float y) {
    p[0] = __float2bfloat16_rn(x);
    p[stride] = __float2bfloat16_rn(y);
  }
};

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte cp.async; src_bytes = 0 fills the destination with zeros (rows past the end), so the
// masked-out tail never multiplies garbage (0 * NaN) into O.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
// cp_async16 of a source that is always read (no src-size operand, no zero-fill test).
__device__ __forceinline__ void cp_async16_full(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// cp_async16 with the .L2::256B prefetch-size hint (the L2 may fetch the whole aligned 256-byte
// block around the source).
__device__ __forceinline__ void cp_async16_l2_256(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Shared-memory tiles are [rows][D] with the 16-byte chunks of a row XOR-swizzled by (row & 7):
// the 8 rows an ldmatrix reads at one logical chunk land in 8 distinct bank groups.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// ex2.approx.ftz: 2^x in one MUFU.EX2 (exp2f adds a range test and two predicated multiplies per
// call for results below 2^-126, which the softmax flushes to zero anyway; as the block-sparse
// kernels do, cuda/attention/softmax.cuh).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One step of the online softmax for the thread's two rows (accumulator layout of m16n8 / wgmma
// m64nN per warp: s[n][0..1] row lo, s[n][2..3] row hi, columns 8 n + 2 tq, +1): each row masked
// to its own keys by its mask word (all 64 kept when `full`), the running max m (log2 domain) and
// partial sum l updated, s replaced by the probabilities P, and alpha set to the factor O must be
// rescaled by (rescale_o). Split from softmax_step so that the warp-specialized kernel
// (attention_ws.cuh) can run it while the previous step's O += P V is still accumulating into O.
// The arithmetic of the block-sparse kernels (since session 11): the row max is taken on the raw
// scores and scaled once (scale > 0, validated, and rounding is monotonic, so m is the max of the
// scaled scores bit for bit), and every probability is ex2(fma(s, scale*log2e, -m)): one FFMA and
// one MUFU per element (it was an FMUL, an FADD and exp2f's range test).
// t[0] = op over t[0 .. 2 W) as a pairwise tree: t[i] = op(t[i], t[i + W]) for i < W, then W / 2,
// ... (compile-time widths, so t stays in registers).
template <int W, class Op>
__device__ __forceinline__ void tree_fold(float* t, Op op) {
#pragma unroll
  for (int i = 0; i < W; ++i) t[i] = op(t[i], t[i + W]);
  if constexpr (W > 1) tree_fold<W / 2>(t, op);
}

// `mask[hrow][w]`: row hrow's mask word of the w-th 64 columns (kNT / 8 words: one per 64-key
// step, two for the ws kernel's paired steps).
template <int kNT, bool kFast = false>
__device__ __forceinline__ void softmax_probs(float (&s)[kNT][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                              const unsigned long long (&mask)[2][kNT / 8], bool full, float scale_log2,
                                              int tq) {
  static_assert(kNT % 8 == 0, "whole 64-column mask words");
#pragma unroll
  for (int hrow = 0; hrow < 2; ++hrow) {
    float mx;
    // kFast (the warp-specialized kernel): `full` is warp-uniform (every mask word of the warp's
    // rows all ones: kv-head lists, or a union that every row of the group listed whole), and its
    // branch has no per-element mask test (H200 ncu, session 10: the test was ~4 instructions per
    // element in the wgmma kernel's step). Same arithmetic on every kept element either way. The
    // other kernels keep the select per element: with the branch the wgmma kernel's step took
    // 0.136 ms against 0.132, the mma.sync BM 64 one 2.43 against 2.23 (s10r9).
    if (!(kFast && full)) {
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = (n % 8) * 8 + tq * 2 + e;
          float& x = s[n][hrow * 2 + e];
          x = (full || ((mask[hrow][n / 8] >> col) & 1ull)) ? x : -INFINITY;
        }
      }
    }
    // The row's max as a tree (depth log2(2 kNT) instead of a chain of 2 kNT dependent FMNMX;
    // max is exact, so any order gives the same value).
    {
      float t[2 * kNT];
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        t[2 * n] = s[n][hrow * 2];
        t[2 * n + 1] = s[n][hrow * 2 + 1];
      }
      tree_fold<kNT>(t, [](float x, float y) { return fmaxf(x, y); });
      mx = t[0];
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[hrow], mx * scale_log2);
    // A row that has seen no key yet keeps m = -inf; subtracting 0 instead keeps exp2 at 0
    // rather than NaN (-inf - -inf). Masked scores are -inf: fma(-inf, scale, -m) = -inf, P = 0.
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;
    const float neg = -m_use;
    alpha[hrow] = ex2_ftz(m[hrow] - m_use);
    // The probabilities, and their sum as a pairwise tree (the same order on every path).
    float t[2 * kNT];
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      float& x0 = s[n][hrow * 2];
      float& x1 = s[n][hrow * 2 + 1];
      x0 = ex2_ftz(fmaf(x0, scale_log2, neg));
      x1 = ex2_ftz(fmaf(x1, scale_log2, neg));
      t[2 * n] = x0;
      t[2 * n + 1] = x1;
    }
    tree_fold<kNT>(t, [](float x, float y) { return x + y; });
    l[hrow] = l[hrow] * alpha[hrow] + t[0];
    m[hrow] = m_new;
  }
}

// The one-word form (64-key steps): row lo's word and row hi's word.
template <int kNT, bool kFast = false>
__device__ __forceinline__ void softmax_probs(float (&s)[kNT][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                              unsigned long long mask_lo, unsigned long long mask_hi, bool full,
                                              float scale_log2, int tq) {
  static_assert(kNT == 8, "one mask word per row");
  const unsigned long long mask[2][1] = {{mask_lo}, {mask_hi}};
  softmax_probs<kNT, kFast>(s, m, l, alpha, mask, full, scale_log2, tq);
}

// O *= alpha, row lo by alpha[0], row hi by alpha[1]. kSkip (the warp-specialized kernel): skipped
// when no row of the warp changed its maximum (alpha = exp2(0) = 1 exactly, and x * 1 == x: the
// same bits), as the dense sm90 kernel does; called by whole warps.
template <int kDT, bool kSkip = false>
__device__ __forceinline__ void rescale_o(float (&o)[kDT][4], const float (&alpha)[2]) {
  if (kSkip && !__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int d = 0; d < kDT; ++d) {
    o[d][0] *= alpha[0];
    o[d][1] *= alpha[0];
    o[d][2] *= alpha[1];
    o[d][3] *= alpha[1];
  }
}

// softmax_probs, then O rescaled (the portable and the non-specialized wgmma kernels).
template <int kNT, int kDT>
__device__ __forceinline__ void softmax_step(float (&s)[kNT][4], float (&o)[kDT][4], float (&m)[2], float (&l)[2],
                                             unsigned long long mask_lo, unsigned long long mask_hi, bool full,
                                             float scale_log2, int tq) {
  float alpha[2];
  softmax_probs<kNT>(s, m, l, alpha, mask_lo, mask_hi, full, scale_log2, tq);
  rescale_o<kDT>(o, alpha);
}

// Full row sums across the quad, normalise, write O and LSE of the thread's rows gr_lo and
// gr_lo + 8 (rows past the group's end are skipped).
// P of the 16-key step kk as an A fragment (mma m16n8k16 / wgmma m64nNk16): the fp32 score tiles
// 2 kk and 2 kk + 1 (the accumulator layout) packed into T pairs.
template <class T, int kNT>
__device__ __forceinline__ void pack_p(const float (&s)[kNT][4], int kk, std::uint32_t (&p)[4]) {
  p[0] = Mma<T>::pack(s[2 * kk][0], s[2 * kk][1]);
  p[1] = Mma<T>::pack(s[2 * kk][2], s[2 * kk][3]);
  p[2] = Mma<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  p[3] = Mma<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// The pieces of a row's epilogue that every gather kernel shares (epilogue below, the ws kernel's
// staged one): the row's full sum from the quad of lanes holding it (accumulator layout), the
// (position, query head) of group row gr (gr = pos * G + head, gather_common.cuh), and its LSE.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
struct RowPos {
  std::int64_t i, h;
};
__device__ __forceinline__ RowPos row_pos(const Geometry& geo, const GroupPos& gp, int gr) {
  return {gp.i0 + gr / geo.g, gp.hk * geo.g + gr % geo.g};
}
// sum == 0: the row attended nothing (empty list or fully masked): LSE = -inf (and O = 0).
__device__ __forceinline__ void store_lse(const AttnArgs& a, const GroupPos& gp, const RowPos& rp, float m, float sum) {
  const float m_use = m == -INFINITY ? 0.0f : m;
  a.lse[gp.b * a.l0 + rp.h * a.l1 + rp.i * a.l2] = sum > 0.0f ? m_use * 0.69314718055994531f + logf(sum) : -INFINITY;
}

template <class T, int kDT>
__device__ __forceinline__ void epilogue(const AttnArgs& a, const GroupPos& gp, const float (&o)[kDT][4],
                                         const float (&m)[2], const float (&l)[2], int gr_lo, int tq) {
#pragma unroll
  for (int hrow = 0; hrow < 2; ++hrow) {
    const float sum = quad_sum(l[hrow]);
    const int gr = gr_lo + 8 * hrow;
    if (gr >= gp.rows) continue;
    const RowPos rp = row_pos(a.geo, gp, gr);
    // l == 0: the row attended nothing (empty list or fully masked): O = 0, LSE = -inf.
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const std::int64_t obase = gp.b * a.o0 + rp.i * a.o1 + rp.h * a.o2;
#pragma unroll
    for (int d = 0; d < kDT; ++d) {
      const std::int64_t col = d * 8 + tq * 2;
      const float x = o[d][hrow * 2] * inv, y = o[d][hrow * 2 + 1] * inv;
      if (a.o_f32) {
        float* op = static_cast<float*>(a.o) + obase + col * a.o3;
        op[0] = x;
        op[a.o3] = y;
      } else {
        Mma<T>::store2(static_cast<T*>(a.o) + obase + col * a.o3, a.o3, x, y);
      }
    }
    if (a.lse != nullptr && tq == 0) store_lse(a, gp, rp, m[hrow], sum);
  }
}

template <class T, int D, int kThreads>
__device__ __forceinline__ void load_kv(const AttnArgs& a, const GroupPos& gp, const std::int32_t* keys, int U,
                                        int blk, T* sk, T* sv) {
  constexpr int kChunks = D / 8;
  const T* kb = static_cast<const T*>(a.k) + gp.b * a.k0 + gp.hk * a.k2;
  const T* vb = static_cast<const T*>(a.v) + gp.b * a.v0 + gp.hk * a.v2;
#pragma unroll
  for (int it = 0; it < kBN * kChunks / kThreads; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads;
    const int row = idx / kChunks, chunk = idx % kChunks;
    const int u = blk * kBN + row;
    const bool valid = u < U;
    const std::int64_t j = valid ? keys[u] : 0;
    cp_async16(sk + swz<D>(row, chunk), kb + j * a.k1 + chunk * 8, valid);
    cp_async16(sv + swz<D>(row, chunk), vb + j * a.v1 + chunk * 8, valid);
  }
}

template <class T, int D, int W>
__global__ void __launch_bounds__(W * 32) attention_kernel(const AttnArgs a) {
  constexpr int kThreads = AttnShape<W>::kThreads;
  constexpr int kBM = AttnShape<W>::kBM;
  static_assert(D % 64 == 0, "the swizzle needs at least 8 chunks of 16 bytes per row");
  constexpr int kChunks = D / 8;
  constexpr int kNT = kBN / 8;  // n-tiles of S
  constexpr int kDT = D / 8;    // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sq = reinterpret_cast<T*>(smem_raw);
  T* sk = sq + kBM * D;        // [2][kBN][D]
  T* sv = sk + 2 * kBN * D;    // [2][kBN][D]

  const Geometry& geo = a.geo;
  const int w = static_cast<int>(blockIdx.y);
  const GroupPos gp = group_pos(geo, a.first_group + w);
  const int row0 = static_cast<int>(blockIdx.x) * kBM;
  if (row0 >= gp.rows) return;  // the group's last positions were cut off by Sq
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int U = a.scratch.union_size[w];
  const std::int32_t* keys = a.scratch.union_keys + w * a.scratch.ucap;
  const unsigned long long* masks = a.scratch.masks + w * a.scratch.words_cap * geo.rows;
  const int nblk = (U + kBN - 1) / kBN;

  // Q rows of the tile (zero past the group's rows).
  {
    const T* qb = static_cast<const T*>(a.q) + gp.b * a.q0;
#pragma unroll
    for (int it = 0; it < kBM * kChunks / kThreads; ++it) {
      const int idx = tid + it * kThreads;
      const int r = idx / kChunks, chunk = idx % kChunks;
      const int gr = row0 + r;
      const bool valid = gr < gp.rows;
      const std::int64_t i = valid ? gp.i0 + gr / geo.g : 0;
      const std::int64_t h = valid ? gp.hk * geo.g + gr % geo.g : 0;
      cp_async16(sq + swz<D>(r, chunk), qb + i * a.q1 + h * a.q2 + chunk * 8, valid);
    }
  }
  cp_async_commit();
  if (nblk > 0) load_kv<T, D, kThreads>(a, gp, keys, U, 0, sk, sv);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  // Q fragments (A operand) stay in registers for the whole walk.
  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    ldmatrix_x4(qf[ks], sq + swz<D>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
  }

  // This thread's two rows of the warp's 16: r = lane / 4 and r + 8 (mma accumulator layout).
  const int gr_lo = row0 + warp * 16 + (lane >> 2);
  const int gr_hi = gr_lo + 8;
  const int tq = lane & 3;
  float o[kDT][4];
#pragma unroll
  for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of the scaled logits (log2 domain)
  float l[2] = {0.0f, 0.0f};            // this thread's partial row sums

  // The mask words of step blk + 1 are loaded one step ahead (they come from L2).
  auto mask_word = [&](int blk, int gr) {
    return blk < nblk && gr < gp.rows ? masks[static_cast<std::int64_t>(blk) * geo.rows + gr] : 0ull;
  };
  unsigned long long next_lo = mask_word(0, gr_lo), next_hi = mask_word(0, gr_hi);
#pragma unroll 1
  for (int blk = 0; blk < nblk; ++blk) {
    const unsigned long long mask_lo = next_lo, mask_hi = next_hi;
    next_lo = mask_word(blk + 1, gr_lo);
    next_hi = mask_word(blk + 1, gr_hi);
    // Warp-uniform: all 16 rows of the warp list all 64 positions (the common case of a group
    // whose rows share their keys) -- no per-element select needed. Rows past the group's end
    // have mask 0, so a warp holding such rows always takes the masked path.
    const bool full = __all_sync(0xffffffffu, (mask_lo & mask_hi) == ~0ull);
    const bool prefetch = blk + 1 < nblk;
    if (prefetch) load_kv<T, D, kThreads>(a, gp, keys, U, blk + 1, sk + ((blk + 1) & 1) * kBN * D, sv + ((blk + 1) & 1) * kBN * D);
    cp_async_commit();
    const T* ck = sk + (blk & 1) * kBN * D;
    const T* cv = sv + (blk & 1) * kBN * D;

    // S = Q K^T for the warp's 16 rows x 64 keys.
    float s[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        std::uint32_t b[4];
        ldmatrix_x4(b, ck + swz<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
        Mma<T>::run(s[2 * np], qf[ks], b[0], b[1]);
        Mma<T>::run(s[2 * np + 1], qf[ks], b[2], b[3]);
      }
    }

    // Mask each row to its own keys, then the online softmax update.
    softmax_step<kNT, kDT>(s, o, m, l, mask_lo, mask_hi, full, a.scale_log2, tq);

    // O += P V: P comes straight from the S accumulators (same fragment layout as an A operand).
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      std::uint32_t p[4];
      pack_p<T>(s, kk, p);
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        std::uint32_t b[4];
        ldmatrix_x4_trans(b, cv + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
        Mma<T>::run(o[2 * dp], p, b[0], b[1]);
        Mma<T>::run(o[2 * dp + 1], p, b[2], b[3]);
      }
    }

    // The next step's K/V must have landed, and every warp must be done with this buffer before
    // the step after next overwrites it.
    cp_async_wait_all();
    __syncthreads();
  }

  epilogue<T, kDT>(a, gp, o, m, l, gr_lo, tq);
}

}  // namespace sparge::cuda::gather
