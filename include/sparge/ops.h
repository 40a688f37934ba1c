// sparge: one params struct per operation, passed by value, validated on the host before any launch.
// Semantics are those of docs/semantics.md (the contract, from shared/DESIGN.md); the CPU backend is
// the executable specification, the CUDA backend must match it.
//
// Logical layouts (strides may describe any storage, NHD or HND):
//   q      [B, Sq, Hq, D]          k, v  [B, Sk, Hk, D]         o like q
//   lse    [B, Hq, Sq]  f32        natural-log log-sum-exp of scale*q.k over attended keys
//   lut    [B, Hq, NQ, NK] i32     ascending selected key blocks, padded with -1
//   counts [B, Hq, NQ]     i32     number of valid entries of each lut row
// NQ = ceil(Sq / blkq), NK = ceil(Sk / blkk) (with varlen: of max_seqlen_q / max_seqlen_k).
#pragma once

#include <string>

#include "sparge/types.h"

namespace sparge {

// Ragged batches as in FlashAttention varlen. When enabled, q/k/v/o have shape[0] == 1 and their
// dimension 1 is the total token count; sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]).
// The "batch" dimension of lut/counts/lse is then the sequence index (num_seqs), and lse's
// dimension 2 is max_seqlen_q. cu_seqlens live in the backend's memory (device memory for cuda).
struct Varlen {
  const std::int32_t* cu_seqlens_q = nullptr;  // [num_seqs + 1]
  const std::int32_t* cu_seqlens_k = nullptr;  // [num_seqs + 1]
  int num_seqs = 0;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
  bool enabled() const { return cu_seqlens_q != nullptr || cu_seqlens_k != nullptr; }
};

// The fp8 recipe's quantized Q and K (docs/quantized.md): e4m3 bytes (stored as DType::u8) and
// their power-of-two scales, the buffers the recipe's quantization writes. build_block_map can
// write them while it reads Q and K anyway (BlockMapParams::maybe_fp8_qk, with K smoothed by the
// block map's own K mean), and block_sparse_attention with recipe = fp8 can take them instead of
// quantizing Q and K itself (BlockSparseAttentionParams::maybe_fp8_qk); it then quantizes V only.
// Every tensor is contiguous row-major in the shape given; no varlen.
struct QuantizedQK {
  Tensor q8;       // u8 (e4m3) [B, Hq, Sq, D]   q / q_scale
  Tensor q_scale;  // f32 [B, Hq, Sq]            per row, a power of two
  Tensor k8;       // u8 (e4m3) [B, Hk, Sk, D]   (k - k_mean) / k_scale of the row's key block
  Tensor k_scale;  // f32 [B, Hk, NK]            per key block of blkk keys, NK = ceil(Sk / blkk)
  Tensor k_mean;   // f32 [B, Hk, D]             the mean of K over the sequence (zeros without smooth_k)
  // The settings the buffers are (to be) written with: each operation requires them equal to its
  // own blkk and smooth_k.
  int blkk = 64;
  bool smooth_k = true;
  bool present() const { return q8.present(); }
};

// ---------------------------------------------------------------------------------------------
// Stage 1: the SpargeAttn block map.
struct BlockMapParams {
  Tensor q;  // [B, Sq, Hq, D]  f32 (cpu) / f16 / bf16
  Tensor k;  // [B, Sk, Hk, D]
  Varlen varlen;
  int blkq = 64;  // 64 or 128
  int blkk = 64;  // 64 or 128
  float scale = 0.0f;  // 0 = 1/sqrt(D)
  // Exactly one of topk / cdfthreshd must be given; values in (0, 1].
  PerHead topk;
  PerHead cdfthreshd;
  // Self-similarity threshold; a block is self-similar when its similarity is > the threshold.
  // Empty = no similarity test (every block counts as self-similar).
  PerHead simthreshd1;
  bool is_causal = false;
  bool attention_sink = false;
  bool smooth_k = true;
  // Outputs.
  Tensor lut;     // i32 [B, Hq, NQ, NK]
  Tensor counts;  // i32 [B, Hq, NQ]
  // Optional diagnostic outputs (f32), for tests and tooling:
  Tensor maybe_scores;  // [B, Hq, NQ, NK] scale * pooled_q . pooled_k, -inf where excluded
  Tensor maybe_q_sim;   // [B, Hq, NQ] self-similarity of each Q block
  Tensor maybe_k_sim;   // [B, Hk, NK] self-similarity of each (smoothed) K block
  // Optional outputs (opt-in): the fp8 recipe's quantized Q and K, to pass to
  // block_sparse_attention (recipe = fp8). Absent (q8.data == nullptr): not written.
  QuantizedQK maybe_fp8_qk;
  Exec exec;
};

// ---------------------------------------------------------------------------------------------
// Stage 2: block-sparse flash attention over a LUT.
// Quantized recipes of block-sparse attention (docs/quantized.md). none: the GEMMs run in the
// inputs' dtype. fp8: Q, K and V are quantized to fp8 e4m3 with power-of-two scales (Q per row, K per
// key block of blkk keys after optional K smoothing, V per channel) and both GEMMs run in fp8 with
// fp32 accumulation (P is rounded to e4m3 too). The CPU backend is its specification: attention in
// fp64 over the dequantized values. LSE stays that of the original logits (the smoothing shift is
// added back).
enum class Recipe : std::uint8_t { none, fp8 };
const char* to_string(Recipe r);

struct BlockSparseAttentionParams {
  Tensor q, k, v;    // f32 (cpu) / f16 / bf16; all three the same dtype
  Tensor o;          // same dtype as q, or f32
  Tensor maybe_lse;  // f32 [B, Hq, Sq], optional
  Tensor lut;        // i32 [B, Hq, NQ, NK]
  Tensor counts;     // i32 [B, Hq, NQ]
  int blkq = 64;
  int blkk = 64;
  Varlen varlen;
  float scale = 0.0f;  // 0 = 1/sqrt(D)
  bool is_causal = false;
  // log2 units, as upstream SpargeAttn (its default is 50); empty = never skip a PV product.
  PerHead pv_threshold;
  Recipe recipe = Recipe::none;
  bool smooth_k = true;  // fp8 only: quantize K - mean(K) (mean over the sequence, per batch and kv head)
  // fp8 only, optional: Q and K already quantized (by build_block_map); q and k are then read only
  // for the LSE shift of smooth_k when maybe_lse is given.
  QuantizedQK maybe_fp8_qk;
  Exec exec;
};

// Dense attention. The CPU version accumulates in fp64 and is the oracle for every other path.
struct DenseAttentionParams {
  Tensor q, k, v, o;
  Tensor maybe_lse;   // f32 [B, Hq, Sq]
  Tensor maybe_mask;  // u8 [B, Hq, Sq, Sk], nonzero = attend; cpu only; stride 0 broadcasts
  Varlen varlen;
  float scale = 0.0f;
  bool is_causal = false;
  Exec exec;
};

// ---------------------------------------------------------------------------------------------
// Stage 3: token-level sparse attention.

// The k largest of each row of scores. Output order: indices whose value is strictly above the
// k-th largest value, ascending by index, then the indices equal to it, ascending by index, as many
// as fit. -inf is never selected; rows with fewer than k selectable values are padded with -1.
// NaN is an input error (invalid_argument naming the row and column); -0.0 and +0.0 are equal.
struct TopkSelectParams {
  Tensor scores;        // f32 / f16 [R, N]
  int k = 0;            // 1 <= k <= N
  Tensor indices;       // i32 [R, k]
  Tensor maybe_counts;  // i32 [R]: number of valid (non -1) entries
  Exec exec;
};

// Per-row ascending indices of the finite entries of an additive mask (0 / finite = keep,
// -inf = drop), -1 padded. A row with more than n_max finite entries is an error (overflow),
// never a silent truncation. NaN and +inf are input errors.
struct CompactMaskParams {
  Tensor mask;     // f32 / f16 [R, N]
  int n_max = 0;
  Tensor indices;  // i32 [R, n_max]
  Tensor counts;   // i32 [R]
  Exec exec;
};

// Attention of each query row over its own list of keys.
struct GatherAttentionParams {
  Tensor q, k, v, o;
  Tensor maybe_lse;  // f32 [B, Hq, Sq]
  // i32 [B, L, Sq, n_max]: key positions, -1 padded after counts. L = Hq: one list per query head;
  // L = Hk: one list per kv head (NSA / DSA-style selection), query head h reads list h / (Hq / Hk).
  Tensor indices;
  Tensor counts;     // i32 [B, L, Sq], L = indices.shape[1]
  float scale = 0.0f;
  // With is_causal, listed keys after the row's causal bound (j > i + Sk - Sq) are not attended.
  bool is_causal = false;
  // Group union: the query heads sharing a kv head, over union_rows consecutive query positions,
  // attend over the union of their lists, each row still masked to its own keys. Same result as
  // the per-row path (up to summation order); a performance choice of the GPU kernel.
  bool group_union = false;
  int union_rows = 64;
  // On CUDA the lists (counts, index range, repeated keys) are checked on the device; the call waits
  // for that check only and returns its Status while the attention kernel may still be running on
  // exec.stream (stream-ordered, as every entry). After a list error, o and lse are unspecified.
  // check_lists = false (CUDA; the CPU backend always checks): no read-back and no host wait, so the
  // call is fully asynchronous and can be captured in a CUDA graph; the lists are trusted: a count
  // outside [0, n_max] is clamped into it, an index outside [0, Sk) is skipped and a key listed twice
  // counts once, nothing is read out of bounds and no error is reported. With check_lists = true a
  // call on a capturing stream is refused (the read-back cannot be captured).
  bool check_lists = true;
  Exec exec;
};

// ---------------------------------------------------------------------------------------------
// Merging partial results by LSE: lse = max + log1p(exp(min - max)), o = sum exp(lse_i - lse) o_i;
// -inf on both sides gives O = 0, LSE = -inf. The outputs may alias the inputs.
struct MergeAttentionParams {
  Tensor o_a, lse_a;  // o [B, S, H, D] f32/f16/bf16, lse f32 [B, H, S]
  Tensor o_b, lse_b;
  Tensor o, lse;      // outputs
  Exec exec;
};

// One entry per operation. Every entry validates the params on the host and returns a Status whose
// message names the parameter and the bad value; nothing is launched on bad input.
Status build_block_map(const BlockMapParams& p);
Status block_sparse_attention(const BlockSparseAttentionParams& p);
Status dense_attention(const DenseAttentionParams& p);
Status topk_select(const TopkSelectParams& p);
Status compact_mask(const CompactMaskParams& p);
Status gather_attention(const GatherAttentionParams& p);
Status merge_attention(const MergeAttentionParams& p);

// Whether run(p) would execute, and if not, why. Shares its decision with the entries above.
Status supported(const BlockMapParams& p);
Status supported(const BlockSparseAttentionParams& p);
Status supported(const DenseAttentionParams& p);
Status supported(const TopkSelectParams& p);
Status supported(const CompactMaskParams& p);
Status supported(const GatherAttentionParams& p);
Status supported(const MergeAttentionParams& p);

// Whether this build has the CUDA backend and a device to run it on.
bool cuda_available();

inline std::int64_t num_blocks(std::int64_t len, int blk) { return (len + blk - 1) / blk; }

}  // namespace sparge
