// gather_attention, step 2 on sm_90a (SPARGE_GATHER_PATH=wgmma): the same tile walk as
// attention.cuh -- BM rows of one group over the group's union, 64 union positions per step, each
// row masked by its own mask word -- with warpgroup MMA. A CTA is WG warpgroups of 64 rows each
// (BM = 64 WG). Every thread gathers K/V rows with 16-byte cp.async straight into the 128-byte
// swizzled layout wgmma reads (cuda/attention/sm90/wgmma.cuh: row r's chunk c of a 64-column slab
// at r * 128 + (c ^ (r % 8)) * 16), kStages = 3 buffers: steps blk + 1 and blk + 2 are in flight
// while step blk computes. Per step and warpgroup: S = Q K^T (wgmma ss, m64n64k16, Q and K K-major in shared
// memory), the online softmax of attention.cuh on the accumulators (per warp the m16n8 layout),
// then O += P V (wgmma rs: P from registers, V MN-major in shared memory).
//
// The tile invariant is attention.cuh's: one K/V load serves all BM rows because they read the
// same kv head; each row keeps its own mask, so the rows are interchangeable for the loads only.
//
// Ordering: cp.async writes are generic-proxy writes and wgmma reads shared memory through the
// async proxy, so every thread fences (fence.proxy.async.shared::cta) after its copies have landed
// and before the CTA barrier that hands the buffer to the wgmmas. A buffer is refilled only after
// the barrier that follows the wgmma_wait<0> of every warpgroup that read it (the barrier at the
// top of the next step).
#pragma once

#include "cuda/attention/sm90/wgmma.cuh"
#include "cuda/gather/attention.cuh"

namespace sparge::cuda::gather {

// ST = K/V buffers: ST - 1 steps in flight while one computes (3 by default; 2 halves the K/V
// shared memory so that two 64-row CTAs share an SM at hd128 and, not being in lockstep, overlap
// one CTA's softmax with the other's MMAs).
// PF (SPARGE_GATHER_PREFETCH=1, see "Prefetch" below): the union keys and the rows' mask words
// travel through shared memory with cp.async, ahead of the steps that use them.
template <int WG, int ST = 3, bool PF = false>
struct WgShape {
  static_assert(ST == 2 || ST == 3 || (ST == 4 && PF), "2 or 3 K/V stages (4 with prefetch)");
  static constexpr int kThreads = WG * 128;
  static constexpr int kBM = WG * 64;
  static constexpr int kStages = ST;
  // Prefetch: a ring of kKeyRing steps of union keys (64 ints each) and, per K/V stage, the BM
  // rows' mask words of that stage's step.
  static constexpr int kKeyRing = 8;
  static constexpr int pf_bytes() { return PF ? kKeyRing * kBN * 4 + kStages * kBM * 8 : 0; }
  // Q (BM rows) + kStages x (K and V, 64 rows each), all rows D * 2 bytes; + 1 KB to align the
  // base to the 1024-byte swizzle atom; + the prefetch rings after the tiles.
  static constexpr int smem_bytes(int d) { return (kBM + kStages * 2 * kBN) * d * 2 + 1024 + pf_bytes(); }
};

// Byte offset of (row r < 64, 16-byte chunk c) in a 64-row tile of D columns: D / 64 slabs of
// 64 rows x 128 bytes (8 KB), 128-byte swizzle.
__device__ __forceinline__ std::uint32_t sw128(int r, int c) {
  return static_cast<std::uint32_t>((c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The tile's Q rows [row0, row0 + kBM) of the group into 64-row sw128 tiles at sq (zero past the
// group's rows), chunks t, t + kThreads, ... by thread t; kUnroll: the loop's unroll (the
// warp-specialized producer keeps it small for its register budget).
template <class T, int D, int kBM, int kThreads, int kUnroll>
__device__ __forceinline__ void load_q_sw(const AttnArgs& a, const GroupPos& gp, int row0, unsigned char* sq, int t) {
  constexpr int kChunks = D / 8;
  constexpr std::uint32_t kTile = 64 * D * 2;
  const Geometry& geo = a.geo;
  const T* qb = static_cast<const T*>(a.q) + gp.b * a.q0;
#pragma unroll kUnroll
  for (int it = 0; it < kBM * kChunks / kThreads; ++it) {
    const int idx = t + it * kThreads;
    const int r = idx / kChunks, chunk = idx % kChunks;
    const int gr = row0 + r;
    const bool valid = gr < gp.rows;
    const std::int64_t i = valid ? gp.i0 + gr / geo.g : 0;
    const std::int64_t h = valid ? gp.hk * geo.g + gr % geo.g : 0;
    cp_async16(sq + (r >> 6) * kTile + sw128(r & 63, chunk), qb + i * a.q1 + h * a.q2 + chunk * 8, valid);
  }
}

// `keys`: the group's union in global memory (indexed by union position), or with kSmemKeys the
// 64 keys of step blk in a shared-memory ring slot (indexed by position within the step).
template <class T, int D, int kThreads, bool kSmemKeys = false>
__device__ __forceinline__ void load_kv_sw(const AttnArgs& a, const GroupPos& gp, const std::int32_t* keys, int U,
                                           int blk, unsigned char* sk, unsigned char* sv) {
  constexpr int kChunks = D / 8;
  const T* kb = static_cast<const T*>(a.k) + gp.b * a.k0 + gp.hk * a.k2;
  const T* vb = static_cast<const T*>(a.v) + gp.b * a.v0 + gp.hk * a.v2;
#pragma unroll
  for (int it = 0; it < kBN * kChunks / kThreads; ++it) {
    const int idx = static_cast<int>(threadIdx.x) + it * kThreads;
    const int row = idx / kChunks, chunk = idx % kChunks;
    const int u = blk * kBN + row;
    const bool valid = u < U;
    const std::int64_t j = valid ? keys[kSmemKeys ? row : u] : 0;
    const std::uint32_t off = sw128(row, chunk);
    if (kSmemKeys && a.l2_256 != 0) {  // the prefetching kernels only (SPARGE_GATHER_L2PF)
      cp_async16_l2_256(sk + off, kb + j * a.k1 + chunk * 8, valid);
      cp_async16_l2_256(sv + off, vb + j * a.v1 + chunk * 8, valid);
    } else {
      cp_async16(sk + off, kb + j * a.k1 + chunk * 8, valid);
      cp_async16(sv + off, vb + j * a.v1 + chunk * 8, valid);
    }
  }
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
  const int n = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}

// Prefetch helpers (SPARGE_GATHER_PREFETCH=1). The union keys of step s (positions 64 s ..
// 64 s + 63) into `slot` (64 ints): threads 0..15 copy 16 bytes each; chunks at or past U are
// zero-filled without a read (their keys are never used: load_kv_sw tests u < U). A chunk that
// starts below U stays inside the group's row of union_keys because the host makes ucap (the
// row length) a multiple of 4, so rows and chunks are 16-byte aligned.
__device__ __forceinline__ void copy_step_keys(const std::int32_t* keys, int U, int s, std::int32_t* slot, int t) {
  if (t < kBN / 4) {
    const int u0 = s * kBN + t * 4;
    const bool valid = u0 < U;
    cp_async16(slot + t * 4, keys + (valid ? u0 : 0), valid);
  }
}
// The mask words of step s for the tile's rows [row0, row0 + bm): thread t < bm copies row
// row0 + t's word (8 bytes; mask rows are not 16-byte aligned in general); zero for rows past the
// group's end and steps past the union (what mask_word gives).
__device__ __forceinline__ void copy_step_masks(const unsigned long long* masks, const Geometry& geo, const GroupPos& gp, int nblk,
                                                int row0, int bm, int s, unsigned long long* dst, int t) {
  if (t < bm) {
    const int gr = row0 + t;
    const bool valid = s < nblk && gr < gp.rows;
    cp_async8(dst + t, masks + (valid ? static_cast<std::int64_t>(s) * geo.rows + gr : 0), valid);
  }
}

// Prefetch (PF): without it every thread reads the union keys of the step it gathers from global
// memory right before its cp.async (a dependent L2 round trip per step on the issue path: the
// copies wait for the key load) and the mask words one step ahead into registers. With it, the
// keys of step s ride in the commit group of the K/V copies of step s - ST + 1 (group g carries
// K/V of step g and the keys of step g + ST - 1) into a ring of kKeyRing slots, and the rows' mask
// words of step s ride in group s into the K/V stage of step s. The wait + barrier at the top of
// step blk (groups <= blk complete) then covers the keys of step blk + ST - 1 (gathered at step
// blk) and the masks of step blk. Ring reuse: the slot of step s + kKeyRing is written at step
// s + kKeyRing - 2 ST + 2 > s - ST + 1 (its last read) with a barrier between; a stage's masks
// are rewritten with the stage (step blk + 1, after the barrier). Same keys, same masks, same
// arithmetic: the output is bitwise that of the path without prefetch.
template <class T, int D, int WG, int ST = 3, bool PF = false>
__global__ void __launch_bounds__(WG * 128, 1) attention_wgmma_kernel(const AttnArgs a) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace wg = ::sparge::cuda::attn::sm90;
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  using Shape = WgShape<WG, ST, PF>;
  constexpr int kThreads = Shape::kThreads;
  constexpr int kBM = Shape::kBM;
  constexpr int kChunks = D / 8;
  constexpr int kNT = kBN / 8;                  // n-tiles of S
  constexpr int kDT = D / 8;                    // n-tiles of O
  constexpr std::uint32_t kTile = 64 * D * 2;   // bytes of a 64-row tile (Q per warpgroup, K, V)
  constexpr std::uint32_t kSlab = 8192;         // 64 rows x 128 bytes
  extern __shared__ unsigned char smem_raw[];
  // Align the shared-memory offset (what the descriptors hold) to the 1024-byte swizzle atom.
  unsigned char* base = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  unsigned char* sq = base;                     // [WG][64 rows][D]
  unsigned char* skv = sq + WG * kTile;         // stage s: K at skv + 2 s kTile, V right after
  constexpr int kStages = Shape::kStages;
  // Prefetch rings (PF only): union keys [kKeyRing][64], then mask words [kStages][kBM].
  std::int32_t* skeys = reinterpret_cast<std::int32_t*>(skv + kStages * 2 * kTile);
  unsigned long long* smask = reinterpret_cast<unsigned long long*>(skeys + Shape::kKeyRing * kBN);

  const Geometry& geo = a.geo;
  const int w = static_cast<int>(blockIdx.y);
  const GroupPos gp = group_pos(geo, a.first_group + w);
  const int row0 = static_cast<int>(blockIdx.x) * kBM;
  if (row0 >= gp.rows) return;  // the group's last positions were cut off by Sq (whole CTA)
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wgi = warp >> 2;  // warpgroup
  pdl_wait();  // the union kernel's outputs (SPARGE_GATHER_PDL)
  const int U = a.scratch.union_size[w];
  const std::int32_t* keys = a.scratch.union_keys + w * a.scratch.ucap;
  const unsigned long long* masks = a.scratch.masks + w * a.scratch.words_cap * geo.rows;
  const int nblk = (U + kBN - 1) / kBN;

  auto key_slot = [&](int s) { return skeys + (s & (Shape::kKeyRing - 1)) * kBN; };
  // The K/V copies of step s into its stage (keys from global memory, or from the ring with PF).
  auto gather_step = [&](int s) {
    unsigned char* st_k = skv + (s % kStages) * 2 * kTile;
    if constexpr (PF) {
      load_kv_sw<T, D, kThreads, true>(a, gp, key_slot(s), U, s, st_k, st_k + kTile);
    } else {
      load_kv_sw<T, D, kThreads>(a, gp, keys, U, s, st_k, st_k + kTile);
    }
  };
  if constexpr (PF) {
    // The keys the prologue gathers with (steps 0 .. kStages - 2): one round trip, then visible.
    for (int st = 0; st < kStages - 1; ++st) copy_step_keys(keys, U, st, key_slot(st), tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  // Q rows of the tile (zero past the group's rows).
  load_q_sw<T, D, kBM, kThreads, kBM * kChunks / kThreads>(a, gp, row0, sq, tid);
  // Prologue: Q with step 0 as the first commit group, then steps 1 .. kStages - 2, one group
  // each (empty groups past the end keep the count: step blk is always group blk). With PF group
  // st also carries the keys of step st + kStages - 1 and the mask words of step st.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nblk) gather_step(st);
    if constexpr (PF) {
      copy_step_keys(keys, U, st + kStages - 1, key_slot(st + kStages - 1), tid);
      copy_step_masks(a.scratch.masks + w * a.scratch.words_cap * geo.rows, geo, gp, nblk, row0, kBM, st, smask + st * kBM, tid);
    }
    cp_async_commit();
  }

  // This thread's two rows: the warp's 16 rows of its warpgroup's 64, r = lane / 4 and r + 8.
  const int gr_lo = row0 + warp * 16 + (lane >> 2);
  const int gr_hi = gr_lo + 8;
  const int tq = lane & 3;
  float o[kDT][4];
#pragma unroll
  for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
  const std::uint32_t q_addr = smem_addr(sq + wgi * kTile);

  auto mask_word = [&](int blk, int gr) {
    return blk < nblk && gr < gp.rows ? masks[static_cast<std::int64_t>(blk) * geo.rows + gr] : 0ull;
  };
  unsigned long long next_lo = PF ? 0ull : mask_word(0, gr_lo), next_hi = PF ? 0ull : mask_word(0, gr_hi);
#pragma unroll 1
  for (int blk = 0; blk < nblk; ++blk) {
    unsigned long long mask_lo = next_lo, mask_hi = next_hi;
    if constexpr (!PF) {
      next_lo = mask_word(blk + 1, gr_lo);
      next_hi = mask_word(blk + 1, gr_hi);
    }
    // Step blk's group (and, at blk = 0, Q) has landed once at most kStages - 2 newer groups are
    // pending; each thread fences its own copies for the async proxy, and the barrier hands them
    // to every warpgroup. The barrier also says that every warpgroup has finished step blk - 1
    // (its wgmma_wait<0>), so that step's buffer may be refilled with step blk + kStages - 1.
    cp_async_wait<kStages - 2>();
    fence_proxy_async_smem();
    __syncthreads();
    if constexpr (PF) {
      // Landed with group blk; read before the barrier of step blk + 1 (after which the stage is refilled).
      const unsigned long long* sm = smask + (blk % kStages) * kBM;
      mask_lo = sm[gr_lo - row0];
      mask_hi = sm[gr_hi - row0];
    }
    const bool full = __all_sync(0xffffffffu, (mask_lo & mask_hi) == ~0ull);
    if (blk + kStages - 1 < nblk) gather_step(blk + kStages - 1);
    if constexpr (PF) {
      copy_step_keys(keys, U, blk + 2 * kStages - 2, key_slot(blk + 2 * kStages - 2), tid);
      copy_step_masks(a.scratch.masks + w * a.scratch.words_cap * geo.rows, geo, gp, nblk, row0, kBM, blk + kStages - 1,
                      smask + ((blk + kStages - 1) % kStages) * kBM, tid);
    }
    cp_async_commit();
    const std::uint32_t k_addr = smem_addr(skv + (blk % kStages) * 2 * kTile);
    const std::uint32_t v_addr = k_addr + kTile;

    // S = Q K^T for the warpgroup's 64 rows x 64 union positions.
    float s[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    wg::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      wg::Wgmma<T, 64>::ss(s, wg::k_major_desc(q_addr, kSlab, ks), wg::k_major_desc(k_addr, kSlab, ks), ks > 0 ? 1 : 0);
    }
    wg::wgmma_commit();
    wg::wgmma_wait<0>();
    wg::fence_accumulator(s);

    softmax_step<kNT, kDT>(s, o, m, l, mask_lo, mask_hi, full, a.scale_log2, tq);

    // O += P V: P from the S accumulators (per warp the A-fragment layout of m64n*k16).
    // All of P is packed before the fence: registers written between wgmmas would need fences
    // of their own (ptxas injects them).
    std::uint32_t p[kBN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      pack_p<T>(s, kk, p[kk]);
    }
    wg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) wg::Wgmma<T, D>::rs(o, p[kk], wg::mn_major_desc(v_addr, kSlab, kk));
    wg::wgmma_commit();
    wg::wgmma_wait<0>();
    wg::fence_accumulator(o);
  }
  cp_async_wait<0>();  // no copy outlives the CTA (the groups past the end are empty)

  epilogue<T, kDT>(a, gp, o, m, l, gr_lo, tq);
#else
  __trap();  // the host selects this kernel on sm_90 only
#endif
}

}  // namespace sparge::cuda::gather
