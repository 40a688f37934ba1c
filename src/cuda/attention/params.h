// The kernel's view of one block-sparse (or dense) attention call: plain pointers, 64-bit element
// strides and values computed once on the host. Passed by value as a __grid_constant__ argument.
#pragma once

#include <cstdint>

namespace sparge::cuda::attn {

struct KernelParams {
  // q/o [B, Sq, Hq, D], k/v [B, Sk, Hk, D]; strides in elements for dims 0..2 (dim 3 is contiguous).
  const void* q;
  const void* k;
  const void* v;
  void* o;
  std::int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
  bool o_is_f32;  // o is f32 instead of the input dtype

  float* lse;  // optional [B, Hq, Sq]
  std::int64_t lse_stride[3];

  // Sparse: lut [B, Hq, NQ, NK] and counts [B, Hq, NQ]. lut == nullptr means dense: the block
  // iterator walks every causally visible key block in ascending order.
  const std::int32_t* lut;
  const std::int32_t* counts;
  std::int64_t lut_stride[4], counts_stride[3];
  int nk_lut;  // NK: entries per lut row (clamp for counts)

  // Varlen: cu_seqlens (device) or nullptr; then seq_q/seq_k are the fixed lengths.
  const std::int32_t* cu_seqlens_q;
  const std::int32_t* cu_seqlens_k;
  int seq_q, seq_k;  // fixed lengths, or max_seqlen_* with varlen (kernels clamp to them)

  int batch;   // B, or num_seqs with varlen
  int hq, hk;  // query heads, kv heads; query head h reads kv head h / (hq / hk)
  int nq;      // query blocks per (b, h): ceil(seq_q / BLKQ)

  float scale_log2;  // scale * log2(e): logits are kept in log2 units
  bool is_causal;
  bool heavy_first;  // walk query blocks in descending order (causal rows grow with qb)

  // pv_threshold (log2 units): off when use_pv_threshold is false; one value or Hq values (device).
  bool use_pv_threshold;
  float pv_threshold;              // when pv_threshold_per_head == nullptr
  const float* pv_threshold_per_head;

  // Tuning switches (entry.cu reads them per call from the environment; they change speed, never
  // results beyond summation order): skipping the O rescale of a warp whose rows' maxima all stayed
  // put (alpha == 1 exactly: bitwise the same result).
  bool lazy_rescale;
};

}  // namespace sparge::cuda::attn
