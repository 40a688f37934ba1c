// Shared pieces of the CUDA block map (docs/block_map_gpu.md): the geometry every kernel indexes
// with, the sequence / visibility rules of docs/semantics.md (Stage 1) in device form, the input
// loaders, and the launchers the host entry (block_map.cu) calls in order:
//   pooling (K chunk sums, K mean, Q and K pooling; pool.cu has the orders), then scores
//   (pooled QK) and select (top-k / cdf, LUT).
// Every kernel walks a 1-D grid-stride loop over 64-bit work indices, so batch * heads may exceed
// 65535 (and any count fits) without relying on gridDim.y / z.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: the maps are encoded through the runtime's driver entry point)
#include <cuda_runtime.h>

#include <cstdint>

namespace sparge::cuda::block_map {

// Threads of the pooling kernels' CTAs (8 warps, one work item per warp).
constexpr int kPoolThreads = 256;
// Rows of K summed by one warp of the K-mean pass: fixed, so the summation order (and therefore
// the mean, bit for bit) depends only on the shape.
constexpr int kKSumRows = 256;
// The largest number of key blocks one selection CTA can rank (1024 threads x 16 keys).
constexpr int kMaxKeyBlocks = 16384;

// Sizes as the LUT sees them (varlen: sequences and max lengths) and where sequences live.
struct Geometry {
  std::int64_t nseq = 0, hq = 0, hk = 0, d = 0;
  std::int64_t sq = 0, sk = 0;  // rows per sequence; with varlen the max_seqlen values
  std::int64_t nq = 0, nk = 0;  // blocks per sequence row of the LUT
  int blkq = 64, blkk = 64;  // 64 or 128 (the callers validate it): the device code divides by shifts
  bool causal = false;
  const std::int32_t* cu_q = nullptr;  // device memory; null without varlen
  const std::int32_t* cu_k = nullptr;
  std::int64_t rows_q = 0, rows_k = 0;  // dimension 1 of q and k (varlen clamps to them)
};

// A [B, S, H, D] tensor of 16-bit floats (f16 or bf16, said by the kernel's template type).
struct Rows {
  const std::uint16_t* data = nullptr;
  std::int64_t stride[4] = {0, 0, 0, 0};
  bool vec = false;  // stride[3] == 1 and every row start 16-byte aligned: 16-byte loads
};

// A strided f32 / i32 output of up to 4 dimensions (the optional ones have data == nullptr).
template <class T>
struct Out {
  T* data = nullptr;
  std::int64_t stride[4] = {0, 0, 0, 0};
};

// One value per query head: inline for up to kInlineHeads heads (no copy to the device needed),
// else in device memory.
constexpr int kInlineHeads = 128;
struct HeadValues {
  const float* dev = nullptr;
  float inl[kInlineHeads] = {};
#ifdef __CUDACC__
  __device__ __forceinline__ float operator[](std::int64_t h) const { return dev != nullptr ? dev[h] : inl[h]; }
#endif
};

// Scratch, all fp32, carved from one allocation by the host entry.
struct Scratch {
  float* k_part = nullptr;  // [nseq, hk, nchunks, D]  K sums of kKSumRows-row chunks (16-byte aligned rows)
  float* k_mean = nullptr;  // [nseq, hk, D]
  float* pk = nullptr;      // [nseq, hk, NK, D]  pooled (smoothed) K
  float* k_sim = nullptr;   // [nseq, hk, NK]
  float* pq = nullptr;      // [nseq, hq, NQ, D]  pooled Q
  float* q_sim = nullptr;   // [nseq, hq, NQ]
  float* scores = nullptr;  // [nseq, hq, NQ, NK] scale * pq . pk (only tiles that a row can see)
  std::int64_t nchunks = 0;
  // [nseq * hk] chunk sums finished per (sequence, kv head), zeroed by launch_pooling, for the K
  // mean folded into pass 1; null: the mean is its own launch.
  std::uint32_t* k_done = nullptr;
  // [2] item tickets of pass 1 and pass 2 (SPARGE_BLOCKMAP_TICKET=1; zeroed by launch_pooling), or
  // null (then the passes take their items by the grid stride).
  unsigned long long* tickets = nullptr;
};

struct SelectRule {
  bool use_topk = true;
  bool sink = false;
  bool has_threshold = false;
  HeadValues value;      // topk or cdfthreshd of each query head
  HeadValues threshold;  // simthreshd1 of each query head (when has_threshold)
};

// Timing marks between launches (SPARGE_BLOCKMAP_PROFILE=1, block_map.cu): called with the name of
// the stage that a launch just queued. Empty: no marks.
struct Marks {
  void (*fn)(void* ctx, const char* stage) = nullptr;
  void* ctx = nullptr;
  void operator()(const char* stage) const {
    if (fn != nullptr) fn(ctx, stage);
  }
};

// The fp8 recipe's Q and K bytes that the pooling writes on the way (BlockMapParams::maybe_fp8_qk,
// contiguous, 16-byte aligned; docs/quantized.md): q8 [nseq, hq, sq, D] and q_scale [nseq, hq, sq]
// per Q row, k8 [nseq, hk, sk, D] and k_scale [nseq, hk, nk] per K block after the K-mean shift.
// All null: not written.
struct Fp8Out {
  std::uint8_t* q8 = nullptr;
  float* q_scale = nullptr;
  std::uint8_t* k8 = nullptr;
  float* k_scale = nullptr;
};

// Launchers (each checks its launch with cudaGetLastError and returns the error).
// dtype_bf16 picks the element type of q / k.
// Pools Q (heads = hq, blocks of blkq) and K (heads = hk, blocks of blkk, shifted by the K mean
// when smooth; the mean is computed first, into s.k_part / s.k_mean), writing pooled rows,
// similarities and the optional diagnostic outputs: one launch without smooth, else three (the K
// sums, the mean, then Q and K pooled in one pass; or Q + K sums, the mean, K: pool.cu), or two
// (K mean folded into the first, after a memset of s.k_done).
// With fp8.q8 set, pass 1's Q items also write the fp8 recipe's Q, and the K pooling items (pass
// 2, or pass 1 without smooth) its K (the K mean is s.k_mean: the caller points it at its output).
// The TMA maps of q and k for the TMA pooling ring (boxes of whole rows, pool_tma_rows(d) rows),
// encoded by the host entry when the ring is asked for (the default), no fp8 outputs are, and the
// device and layout allow it; launch_pooling runs the cp.async ring without them.
struct TmaMaps {
  CUtensorMap q, k;
};
// Rows per TMA box of the pooling ring at head dim d: one batch of the ring (kBatch steps of 32 / LANES
// rows), for power-of-two d from 8 to 256; 0 where the TMA ring does not apply.
int pool_tma_rows(std::int64_t d);
// Whether the TMA pooling ring is asked for (the default; SPARGE_BLOCKMAP_POOL=async3 / base3 turn it off).
bool pool_tma_asked();
cudaError_t launch_pooling(const Geometry& g, const Rows& q, const Rows& k, bool bf16, bool smooth, const Scratch& s,
                           const Out<float>& maybe_q_sim, const Out<float>& maybe_k_sim, cudaStream_t st,
                           const Marks& marks = {}, const Fp8Out& fp8 = {}, const TmaMaps* tma = nullptr);
// The steps of launch_pooling one at a time (same items, same arithmetic, so the same bits), for
// context parallelism (src/dist/), which all-gathers the K chunk sums and the pooled K between
// them: the chunk sums of g's K rows into s.k_part (s.nchunks chunks); the mean from s.k_part into
// s.k_mean; the pooling of Q (is_k = false) or of K shifted by `shift` ([nseq, hk, D], or null).
// Which pooling kernel variant ran (names it in profiles; SPARGE_BLOCKMAP_POOL); tma_ran: the
// launch had TMA maps (else the TMA variant ran as async3).
const char* pool_variant_name(bool tma_ran);
cudaError_t launch_k_chunk_sums(const Geometry& g, const Rows& k, bool bf16, const Scratch& s, cudaStream_t st);
// pdl: launched as a programmatic dependent of pass 1, and letting pass 2 start early (the PDL chain).
cudaError_t launch_k_mean(const Geometry& g, const Scratch& s, cudaStream_t st, bool pdl = false);
cudaError_t launch_pool_one(const Geometry& g, const Rows& x, bool bf16, bool is_k, const float* shift, const Scratch& s,
                            cudaStream_t st);
cudaError_t launch_scores(const Geometry& g, float scale, const Scratch& s, cudaStream_t st);
// Which scores kernel the geometry takes (names the variant in profiles).
const char* scores_variant(const Geometry& g);
// Bytes of dynamic shared memory the selection kernel for nk key blocks needs (0: nk too large).
std::size_t select_smem_bytes(std::int64_t nk);
// Which selection kernel rows of nk key blocks take (names the variant in profiles).
const char* select_variant(std::int64_t nk);
cudaError_t launch_select(const Geometry& g, const SelectRule& rule, const Scratch& s, const Out<std::int32_t>& lut,
                          const Out<std::int32_t>& counts, const Out<float>& maybe_scores, cudaStream_t st);

#ifdef __CUDACC__

// Where one sequence's rows live (docs/semantics.md, varlen): the tensor batch index and the row
// ranges of q and k. The host cannot read cu_seqlens, so the ranges are clamped to the tensor and
// to max_seqlen here; for valid inputs the clamps change nothing.
struct Seq {
  std::int64_t batch, q_begin, q_len, k_begin, k_len;
};

__device__ __forceinline__ std::int64_t clamp64(std::int64_t v, std::int64_t lo, std::int64_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

__device__ __forceinline__ Seq sequence(const Geometry& g, std::int64_t s) {
  if (g.cu_q == nullptr) return {s, 0, g.sq, 0, g.sk};
  const std::int64_t qb = clamp64(g.cu_q[s], 0, g.rows_q), qe = clamp64(g.cu_q[s + 1], qb, g.rows_q);
  const std::int64_t kb = clamp64(g.cu_k[s], 0, g.rows_k), ke = clamp64(g.cu_k[s + 1], kb, g.rows_k);
  return {0, qb, clamp64(qe - qb, 0, g.sq), kb, clamp64(ke - kb, 0, g.sk)};
}

// Key blocks [0, NV) are visible to query block qb (a prefix); 0 past the sequence's end. Causal
// masking is bottom-right aligned: the block's last row i sees keys j <= i + Sk - Sq.
// The block sizes are powers of two (64 or 128, checked on the host), so the divisions are shifts.
__device__ __forceinline__ std::int64_t visible_blocks(const Geometry& g, const Seq& seq, std::int64_t qb) {
  const std::int64_t q0 = qb * g.blkq;
  if (q0 >= seq.q_len) return 0;
  const int shift_k = __ffs(g.blkk) - 1;
  const std::int64_t nk = (seq.k_len + g.blkk - 1) >> shift_k;
  if (!g.causal) return nk;
  const std::int64_t last_row = (q0 + g.blkq < seq.q_len ? q0 + g.blkq : seq.q_len) - 1;
  const std::int64_t last_key = last_row + seq.k_len - seq.q_len;
  if (last_key < 0) return 0;
  const std::int64_t v = (last_key >> shift_k) + 1;
  return v < nk ? v : nk;
}

#endif  // __CUDACC__

}  // namespace sparge::cuda::block_map
