// The sparge operators as torch custom ops (namespace `sparge`). Each one allocates its outputs,
// builds the library's params struct from strided views of the torch tensors (no copies: HND
// inputs are passed as their transpose(1, 2) views), and runs it on the tensors' device: the CPU
// backend for CPU tensors, the CUDA backend on the current stream for CUDA tensors. The library
// validates everything else and its message becomes the Python exception (convert.h).
//
// Fake (meta) implementations for torch.compile live in python/sparge/_fake.py; they must allocate
// exactly what these functions allocate (shapes, dtypes, contiguous strides).
#include <torch/library.h>

#include <limits>
#include <optional>

#include "convert.h"

#ifdef SPARGE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace sparge::py {

namespace {

// Where a call runs: holds the device guard for the duration of the call.
class DeviceContext {
 public:
  DeviceContext(c10::Device dev, const char* op) {
    if (dev.is_cpu()) {
      exec_.backend = Backend::cpu;
      exec_.cpu_threads = at::get_num_threads();
      return;
    }
#ifdef SPARGE_WITH_CUDA
    guard_.emplace(dev);
    exec_.backend = Backend::cuda;
    exec_.stream = at::cuda::getCurrentCUDAStream(dev.index()).stream();
#else
    SPARGE_PY_CHECK_NOT_IMPLEMENTED(false, op, ": the tensors are on ", dev,
                                ", but this build of the sparge extension has no CUDA backend "
                                "(rebuild on a machine with nvcc and a CUDA torch, SPARGE_CUDA=on)");
#endif
  }
  const Exec& exec() const { return exec_; }

 private:
  Exec exec_;
#ifdef SPARGE_WITH_CUDA
  std::optional<c10::cuda::CUDAGuard> guard_;
#endif
};

at::TensorOptions f32(const at::Tensor& like) { return like.options().dtype(at::kFloat); }
at::TensorOptions i32(const at::Tensor& like) { return like.options().dtype(at::kInt); }

// [B, S, H, D] output storage in the caller's layout, and its logical view.
at::Tensor alloc_like_layout(const at::Tensor& user, at::ScalarType dtype) {
  return at::empty(user.sizes(), user.options().dtype(dtype));
}

// NQ / NK with a guard for a nonsense block size (the library rejects it with its own message).
std::int64_t blocks(std::int64_t len, std::int64_t blk) { return blk > 0 ? (len + blk - 1) / blk : 1; }

// ------------------------------------------------------------------------------------------------

// The params of build_block_map from the block_map schema's arguments (q, k: logical views; the
// per-head values must outlive the call), without exec.
BlockMapParams block_map_params(const char* op, const at::Tensor& q, const at::Tensor& k, const PerHeadValues& topk,
                                const PerHeadValues& cdfthreshd, const PerHeadValues& simthreshd1, std::int64_t blkq,
                                std::int64_t blkk, bool is_causal, bool attention_sink, bool smooth_k, double scale,
                                const at::Tensor& lut, const at::Tensor& counts) {
  BlockMapParams p;
  p.q = view(q, op, "q");
  p.k = view(k, op, "k");
  p.blkq = static_cast<int>(blkq);
  p.blkk = static_cast<int>(blkk);
  p.scale = static_cast<float>(scale);
  p.topk = topk.span();
  p.cdfthreshd = cdfthreshd.span();
  p.simthreshd1 = simthreshd1.span();
  p.is_causal = is_causal;
  p.attention_sink = attention_sink;
  p.smooth_k = smooth_k;
  p.lut = view(lut, op, "lut");
  p.counts = view(counts, op, "counts");
  return p;
}

// dense_attention on the views of a (AttentionArgs or VarlenArgs): allocates o / lse and runs.
template <class Args>
std::tuple<at::Tensor, at::Tensor> run_dense(const Args& a, const DeviceContext& ctx, bool is_causal, double scale,
                                             bool return_lse) {
  DenseAttentionParams p;
  auto out = a.outputs(p, return_lse);
  p.scale = static_cast<float>(scale);
  p.is_causal = is_causal;
  p.exec = ctx.exec();
  throw_if_error(dense_attention(p));
  return out;
}

// The LUT and the attention parameters of block_sparse_attention (the fixed-length and varlen bindings).
void set_lut_params(BlockSparseAttentionParams& p, const char* op, const at::Tensor& lut, const at::Tensor& counts,
                    std::int64_t blkq, std::int64_t blkk, bool is_causal, double scale, const PerHeadValues& pv) {
  p.lut = view(lut, op, "lut");
  p.counts = view(counts, op, "counts");
  p.blkq = static_cast<int>(blkq);
  p.blkk = static_cast<int>(blkk);
  p.scale = static_cast<float>(scale);
  p.is_causal = is_causal;
  p.pv_threshold = pv.span();
}

std::tuple<at::Tensor, at::Tensor> block_map(const at::Tensor& q_user, const at::Tensor& k_user,
                                             std::optional<c10::ArrayRef<double>> topk,
                                             std::optional<c10::ArrayRef<double>> cdfthreshd,
                                             std::optional<c10::ArrayRef<double>> simthreshd1, std::int64_t blkq,
                                             std::int64_t blkk, bool is_causal, bool attention_sink,
                                             bool smooth_k, double scale, c10::string_view tensor_layout) {
  constexpr const char* op = "sparge.block_map";
  const bool hnd = is_hnd(tensor_layout, op);
  const at::Tensor q = logical(q_user, hnd, op, "q");
  const at::Tensor k = logical(k_user, hnd, op, "k");
  const DeviceContext ctx(common_device(op, {{"q", &q}, {"k", &k}}), op);

  const std::int64_t nq = blocks(q.size(1), blkq), nk = blocks(k.size(1), blkk);
  at::Tensor lut = at::empty({q.size(0), q.size(2), nq, nk}, i32(q));
  at::Tensor counts = at::empty({q.size(0), q.size(2), nq}, i32(q));

  const PerHeadValues topk_v = per_head(topk), cdf_v = per_head(cdfthreshd), sim_v = per_head(simthreshd1);
  BlockMapParams p = block_map_params(op, q, k, topk_v, cdf_v, sim_v, blkq, blkk, is_causal, attention_sink, smooth_k,
                                      scale, lut, counts);
  p.exec = ctx.exec();
  throw_if_error(build_block_map(p));
  return {lut, counts};
}

std::tuple<at::Tensor, at::Tensor> block_sparse_attn(const at::Tensor& q_user, const at::Tensor& k_user,
                                                     const at::Tensor& v_user, const at::Tensor& lut,
                                                     const at::Tensor& counts, std::int64_t blkq, std::int64_t blkk,
                                                     bool is_causal, double scale,
                                                     std::optional<c10::ArrayRef<double>> pv_threshold,
                                                     c10::string_view tensor_layout, bool return_lse,
                                                     c10::string_view recipe) {
  constexpr const char* op = "sparge.block_sparse_attn";
  SPARGE_PY_CHECK_VALUE(recipe == "none" || recipe == "fp8", op, ": recipe = '", std::string(recipe),
                        "' is not supported (expected 'none' or 'fp8')");
  const AttentionArgs a(op, tensor_layout, q_user, k_user, v_user);
  const DeviceContext ctx(
      common_device(op, {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"lut", &lut}, {"counts", &counts}}), op);

  const PerHeadValues pv = per_head(pv_threshold);
  BlockSparseAttentionParams p;
  auto out = a.outputs(p, return_lse);
  set_lut_params(p, op, lut, counts, blkq, blkk, is_causal, scale, pv);
  p.recipe = recipe == "fp8" ? Recipe::fp8 : Recipe::none;
  p.exec = ctx.exec();
  throw_if_error(block_sparse_attention(p));
  return out;
}

// sparge_attn with recipe = fp8 (docs/quantized.md): build_block_map also writes the recipe's
// quantized Q and K (maybe_fp8_qk, while it reads them for the pooling), and block_sparse_attention
// takes them, quantizing only V itself. Returns (o, lse, lut, counts).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sparge_attn_fp8(
    const at::Tensor& q_user, const at::Tensor& k_user, const at::Tensor& v_user,
    std::optional<c10::ArrayRef<double>> topk, std::optional<c10::ArrayRef<double>> cdfthreshd,
    std::optional<c10::ArrayRef<double>> simthreshd1, std::int64_t blkq, std::int64_t blkk, bool is_causal,
    bool attention_sink, bool smooth_k, double scale, std::optional<c10::ArrayRef<double>> pv_threshold,
    c10::string_view tensor_layout, bool return_lse) {
  constexpr const char* op = "sparge.sparge_attn";
  const AttentionArgs a(op, tensor_layout, q_user, k_user, v_user);
  const DeviceContext ctx(common_device(op, {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}}), op);
  const at::Tensor& q = a.q;
  const at::Tensor& k = a.k;
  const std::int64_t nq = blocks(q.size(1), blkq), nk = blocks(k.size(1), blkk);
  at::Tensor lut = at::empty({q.size(0), q.size(2), nq, nk}, i32(q));
  at::Tensor counts = at::empty({q.size(0), q.size(2), nq}, i32(q));
  // The quantized Q and K (contiguous; at::empty's storage is 16-byte aligned or better).
  const auto u8 = q.options().dtype(at::kByte);
  at::Tensor q8 = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, u8);
  at::Tensor q_scale = at::empty({q.size(0), q.size(2), q.size(1)}, f32(q));
  at::Tensor k8 = at::empty({k.size(0), k.size(2), k.size(1), k.size(3)}, u8);
  at::Tensor k_scale = at::empty({k.size(0), k.size(2), nk}, f32(q));
  at::Tensor k_mean = at::empty({k.size(0), k.size(2), k.size(3)}, f32(q));
  QuantizedQK qk;
  qk.q8 = view(q8, op, "q8");
  qk.q_scale = view(q_scale, op, "q_scale");
  qk.k8 = view(k8, op, "k8");
  qk.k_scale = view(k_scale, op, "k_scale");
  qk.k_mean = view(k_mean, op, "k_mean");
  qk.blkk = static_cast<int>(blkk);
  qk.smooth_k = smooth_k;

  const PerHeadValues topk_v = per_head(topk), cdf_v = per_head(cdfthreshd), sim_v = per_head(simthreshd1);
  BlockMapParams m = block_map_params(op, q, k, topk_v, cdf_v, sim_v, blkq, blkk, is_causal, attention_sink, smooth_k,
                                      scale, lut, counts);
  m.maybe_fp8_qk = qk;
  m.exec = ctx.exec();
  throw_if_error(build_block_map(m));

  const PerHeadValues pv = per_head(pv_threshold);
  BlockSparseAttentionParams p;
  auto [o, lse] = a.outputs(p, return_lse);
  p.lut = m.lut;
  p.counts = m.counts;
  p.blkq = m.blkq;
  p.blkk = m.blkk;
  p.scale = m.scale;
  p.is_causal = is_causal;
  p.pv_threshold = pv.span();
  p.recipe = Recipe::fp8;
  p.smooth_k = smooth_k;
  p.maybe_fp8_qk = qk;
  p.exec = ctx.exec();
  throw_if_error(block_sparse_attention(p));
  return {o, lse, lut, counts};
}

std::tuple<at::Tensor, at::Tensor> dense_attn(const at::Tensor& q_user, const at::Tensor& k_user,
                                              const at::Tensor& v_user, bool is_causal, double scale,
                                              c10::string_view tensor_layout, bool return_lse) {
  constexpr const char* op = "sparge.dense_attn";
  const AttentionArgs a(op, tensor_layout, q_user, k_user, v_user);
  const DeviceContext ctx(common_device(op, {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}}), op);

  return run_dense(a, ctx, is_causal, scale, return_lse);
}

std::tuple<at::Tensor, at::Tensor> topk_select(const at::Tensor& scores, std::int64_t k) {
  constexpr const char* op = "sparge.topk_select";
  SPARGE_PY_CHECK_VALUE(scores.dim() == 2, op, ": scores has ", scores.dim(), " dimensions (expected 2: [R, N])");
  SPARGE_PY_CHECK_VALUE(k >= 1 && k <= scores.size(1), op, ": k = ", k, " is out of range (expected 1..N = ",
                    scores.size(1), ")");
  const DeviceContext ctx(common_device(op, {{"scores", &scores}}), op);
  at::Tensor indices = at::empty({scores.size(0), k}, i32(scores));
  at::Tensor counts = at::empty({scores.size(0)}, i32(scores));
  TopkSelectParams p;
  p.scores = view(scores, op, "scores");
  p.k = static_cast<int>(k);
  p.indices = view(indices, op, "indices");
  p.maybe_counts = view(counts, op, "counts");
  p.exec = ctx.exec();
  throw_if_error(sparge::topk_select(p));
  return {indices, counts};
}

std::tuple<at::Tensor, at::Tensor> compact_mask(const at::Tensor& mask, std::int64_t n_max) {
  constexpr const char* op = "sparge.compact_mask";
  SPARGE_PY_CHECK_VALUE(mask.dim() == 2, op, ": mask has ", mask.dim(), " dimensions (expected 2: [R, N])");
  SPARGE_PY_CHECK_VALUE(n_max >= 1, op, ": n_max = ", n_max, " (expected >= 1)");
  const DeviceContext ctx(common_device(op, {{"mask", &mask}}), op);
  at::Tensor indices = at::empty({mask.size(0), n_max}, i32(mask));
  at::Tensor counts = at::empty({mask.size(0)}, i32(mask));
  CompactMaskParams p;
  p.mask = view(mask, op, "mask");
  p.n_max = static_cast<int>(n_max);
  p.indices = view(indices, op, "indices");
  p.counts = view(counts, op, "counts");
  p.exec = ctx.exec();
  throw_if_error(sparge::compact_mask(p));
  return {indices, counts};
}

std::tuple<at::Tensor, at::Tensor> gather_attn(const at::Tensor& q_user, const at::Tensor& k_user,
                                               const at::Tensor& v_user, const at::Tensor& indices,
                                               const at::Tensor& counts, bool is_causal, double scale,
                                               bool group_union, std::int64_t union_rows,
                                               c10::string_view tensor_layout, bool return_lse, bool check_lists) {
  constexpr const char* op = "sparge.gather_attn";
  const AttentionArgs a(op, tensor_layout, q_user, k_user, v_user);
  const DeviceContext ctx(
      common_device(op, {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"indices", &indices}, {"counts", &counts}}), op);

  GatherAttentionParams p;
  auto out = a.outputs(p, return_lse);
  p.indices = view(indices, op, "indices");
  p.counts = view(counts, op, "counts");
  p.scale = static_cast<float>(scale);
  p.is_causal = is_causal;
  p.group_union = group_union;
  p.union_rows = static_cast<int>(union_rows);
  p.check_lists = check_lists;
  p.exec = ctx.exec();
  throw_if_error(gather_attention(p));
  return out;
}

std::tuple<at::Tensor, at::Tensor> merge_attn(const at::Tensor& o_a_user, const at::Tensor& lse_a,
                                              const at::Tensor& o_b_user, const at::Tensor& lse_b,
                                              c10::string_view tensor_layout) {
  constexpr const char* op = "sparge.merge_attn";
  const bool hnd = is_hnd(tensor_layout, op);
  const at::Tensor o_a = logical(o_a_user, hnd, op, "o_a");
  const at::Tensor o_b = logical(o_b_user, hnd, op, "o_b");
  const DeviceContext ctx(
      common_device(op, {{"o_a", &o_a}, {"lse_a", &lse_a}, {"o_b", &o_b}, {"lse_b", &lse_b}}), op);

  at::Tensor o_user = alloc_like_layout(o_a_user, o_a_user.scalar_type());
  at::Tensor lse = at::empty({o_a.size(0), o_a.size(2), o_a.size(1)}, f32(o_a));
  MergeAttentionParams p;
  p.o_a = view(o_a, op, "o_a");
  p.lse_a = view(lse_a, op, "lse_a");
  p.o_b = view(o_b, op, "o_b");
  p.lse_b = view(lse_b, op, "lse_b");
  p.o = view(logical(o_user, hnd, op, "o"), op, "o");
  p.lse = view(lse, op, "lse");
  p.exec = ctx.exec();
  throw_if_error(merge_attention(p));
  return {o_user, lse};
}

}  // namespace

// ---- varlen: packed sequences, as FlashAttention's varlen functions take them -----------------
// q [total_q, Hq, D] and k / v [total_k, Hk, D] ('NHD'; 'HND' = [H, total, D]); cu_seqlens_q / _k int32
// [num_seqs + 1] on the tensors' device (sequence s owns rows [cu[s], cu[s + 1])); max_seqlen_q / _k
// bound every sequence (the library checks the cu values where it can read them: on the CPU backend).
// Outputs: o like q, lse [num_seqs, Hq, max_seqlen_q], LUTs [num_seqs, Hq, NQ, NK] with NQ / NK from the
// max lengths. Internally the library's varlen view: [1, total, H, D].
struct VarlenArgs {
  VarlenArgs(const char* op_name, c10::string_view layout, const at::Tensor& q_user_, const at::Tensor& k_user,
             const at::Tensor* v_user, const at::Tensor& cu_q_, const at::Tensor& cu_k_, std::int64_t max_q,
             std::int64_t max_k)
      : op(op_name), hnd(is_hnd(layout, op_name)), q_user(q_user_), cu_q(cu_q_), cu_k(cu_k_) {
    q = packed(q_user_, "q");
    k = packed(k_user, "k");
    if (v_user != nullptr) v = packed(*v_user, "v");
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"cu_seqlens_q", &cu_q},
                                  std::pair<const char*, const at::Tensor*>{"cu_seqlens_k", &cu_k}}) {
      SPARGE_PY_CHECK_VALUE(t->dim() == 1 && t->numel() >= 2, op, ": ", name, " has shape ", t->sizes(),
                            " (expected [num_seqs + 1], num_seqs >= 1)");
      SPARGE_PY_CHECK_VALUE(t->scalar_type() == at::kInt, op, ": ", name, ".dtype = ", t->scalar_type(),
                            " (expected torch.int32)");
      SPARGE_PY_CHECK_VALUE(t->is_contiguous(), op, ": ", name, " must be contiguous");
    }
    SPARGE_PY_CHECK_VALUE(cu_q.numel() == cu_k.numel(), op, ": cu_seqlens_q has ", cu_q.numel(),
                          " entries and cu_seqlens_k ", cu_k.numel(), " (expected the same: num_seqs + 1)");
    SPARGE_PY_CHECK_VALUE(max_q >= 1 && max_q <= INT32_MAX, op, ": max_seqlen_q = ", max_q, " (expected >= 1)");
    SPARGE_PY_CHECK_VALUE(max_k >= 1 && max_k <= INT32_MAX, op, ": max_seqlen_k = ", max_k, " (expected >= 1)");
    vl.cu_seqlens_q = cu_q.data_ptr<std::int32_t>();
    vl.cu_seqlens_k = cu_k.data_ptr<std::int32_t>();
    vl.num_seqs = static_cast<int>(cu_q.numel() - 1);
    vl.max_seqlen_q = static_cast<int>(max_q);
    vl.max_seqlen_k = static_cast<int>(max_k);
  }

  // The library's [1, total, H, D] view of a packed [total, H, D] ('HND': [H, total, D]) tensor.
  at::Tensor packed(const at::Tensor& t, const char* name) const {
    SPARGE_PY_CHECK_VALUE(t.dim() == 3, op, ": ", name, " has ", t.dim(), " dimensions (expected 3: ",
                          hnd ? "[H, total, D]" : "[total, H, D]", ")");
    return (hnd ? t.transpose(0, 1) : t).unsqueeze(0);
  }

  // o (q's shape, layout and dtype) and lse ([num_seqs, Hq, max_seqlen_q] f32, or an empty [0]); the
  // library leaves lse past each sequence's end unwritten, so it starts as -inf (defined values).
  template <class Params>
  std::tuple<at::Tensor, at::Tensor> outputs(Params& p, bool return_lse) const {
    at::Tensor o = at::empty(q_user.sizes(), q_user.options());
    at::Tensor lse = return_lse ? at::full({vl.num_seqs, q.size(2), vl.max_seqlen_q},
                                           -std::numeric_limits<float>::infinity(), f32(q))
                                : at::empty({0}, f32(q));
    p.q = view(q, op, "q");
    p.k = view(k, op, "k");
    p.v = view(v, op, "v");
    p.o = view(packed(o, "o"), op, "o");
    if (return_lse) p.maybe_lse = view(lse, op, "lse");
    p.varlen = vl;
    return {o, lse};
  }

  const char* op;
  bool hnd;
  at::Tensor q_user, cu_q, cu_k;
  at::Tensor q, k, v;
  Varlen vl;
};

std::tuple<at::Tensor, at::Tensor> dense_attn_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& cu_q, const at::Tensor& cu_k,
                                                     std::int64_t max_q, std::int64_t max_k, bool is_causal,
                                                     double scale, c10::string_view tensor_layout,
                                                     bool return_lse) {
  constexpr const char* op = "sparge.dense_attn_varlen";
  const VarlenArgs a(op, tensor_layout, q, k, &v, cu_q, cu_k, max_q, max_k);
  const DeviceContext ctx(common_device(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"cu_seqlens_q", &cu_q},
                                             {"cu_seqlens_k", &cu_k}}),
                          op);
  return run_dense(a, ctx, is_causal, scale, return_lse);
}

std::tuple<at::Tensor, at::Tensor> block_sparse_attn_varlen(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& lut, const at::Tensor& counts,
    const at::Tensor& cu_q, const at::Tensor& cu_k, std::int64_t max_q, std::int64_t max_k, std::int64_t blkq,
    std::int64_t blkk, bool is_causal, double scale, std::optional<c10::ArrayRef<double>> pv_threshold,
    c10::string_view tensor_layout, bool return_lse) {
  constexpr const char* op = "sparge.block_sparse_attn_varlen";
  const VarlenArgs a(op, tensor_layout, q, k, &v, cu_q, cu_k, max_q, max_k);
  const DeviceContext ctx(common_device(op, {{"q", &q}, {"k", &k}, {"v", &v}, {"lut", &lut}, {"counts", &counts},
                                             {"cu_seqlens_q", &cu_q}, {"cu_seqlens_k", &cu_k}}),
                          op);
  const PerHeadValues pv = per_head(pv_threshold);
  BlockSparseAttentionParams p;
  auto out = a.outputs(p, return_lse);
  set_lut_params(p, op, lut, counts, blkq, blkk, is_causal, scale, pv);
  p.exec = ctx.exec();
  throw_if_error(block_sparse_attention(p));
  return out;
}

std::tuple<at::Tensor, at::Tensor> block_map_varlen(
    const at::Tensor& q_user, const at::Tensor& k_user, const at::Tensor& cu_q, const at::Tensor& cu_k,
    std::int64_t max_q, std::int64_t max_k, std::optional<c10::ArrayRef<double>> topk,
    std::optional<c10::ArrayRef<double>> cdfthreshd, std::optional<c10::ArrayRef<double>> simthreshd1,
    std::int64_t blkq, std::int64_t blkk, bool is_causal, bool attention_sink, bool smooth_k, double scale,
    c10::string_view tensor_layout) {
  constexpr const char* op = "sparge.block_map_varlen";
  const VarlenArgs a(op, tensor_layout, q_user, k_user, nullptr, cu_q, cu_k, max_q, max_k);
  const DeviceContext ctx(common_device(op, {{"q", &q_user}, {"k", &k_user}, {"cu_seqlens_q", &cu_q},
                                             {"cu_seqlens_k", &cu_k}}),
                          op);
  const std::int64_t nq = blocks(max_q, blkq), nk = blocks(max_k, blkk);
  at::Tensor lut = at::empty({a.vl.num_seqs, a.q.size(2), nq, nk}, i32(a.q));
  at::Tensor counts = at::empty({a.vl.num_seqs, a.q.size(2), nq}, i32(a.q));
  const PerHeadValues topk_v = per_head(topk), cdf_v = per_head(cdfthreshd), sim_v = per_head(simthreshd1);
  BlockMapParams p = block_map_params(op, a.q, a.k, topk_v, cdf_v, sim_v, blkq, blkk, is_causal, attention_sink,
                                      smooth_k, scale, lut, counts);
  p.varlen = a.vl;
  p.exec = ctx.exec();
  throw_if_error(build_block_map(p));
  return {lut, counts};
}

TORCH_LIBRARY(sparge, m) {
  m.def(
      "block_map(Tensor q, Tensor k, float[]? topk, float[]? cdfthreshd, float[]? simthreshd1, int blkq, "
      "int blkk, bool is_causal, bool attention_sink, bool smooth_k, float scale, str tensor_layout) "
      "-> (Tensor lut, Tensor counts)");
  m.def(
      "block_sparse_attn(Tensor q, Tensor k, Tensor v, Tensor lut, Tensor counts, int blkq, int blkk, "
      "bool is_causal, float scale, float[]? pv_threshold, str tensor_layout, bool return_lse, "
      "str recipe=\"none\") -> (Tensor o, Tensor lse)");
  m.def(
      "sparge_attn_fp8(Tensor q, Tensor k, Tensor v, float[]? topk, float[]? cdfthreshd, float[]? simthreshd1, "
      "int blkq, int blkk, bool is_causal, bool attention_sink, bool smooth_k, float scale, float[]? pv_threshold, "
      "str tensor_layout, bool return_lse) -> (Tensor o, Tensor lse, Tensor lut, Tensor counts)");
  m.def(
      "dense_attn(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, str tensor_layout, "
      "bool return_lse) -> (Tensor o, Tensor lse)");
  m.def(
      "dense_attn_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, bool is_causal, float scale, str tensor_layout, bool return_lse) -> (Tensor o, Tensor lse)");
  m.def(
      "block_sparse_attn_varlen(Tensor q, Tensor k, Tensor v, Tensor lut, Tensor counts, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, int blkq, int blkk, bool is_causal, float scale, "
      "float[]? pv_threshold, str tensor_layout, bool return_lse) -> (Tensor o, Tensor lse)");
  m.def(
      "block_map_varlen(Tensor q, Tensor k, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, float[]? topk, float[]? cdfthreshd, float[]? simthreshd1, int blkq, int blkk, "
      "bool is_causal, bool attention_sink, bool smooth_k, float scale, str tensor_layout) "
      "-> (Tensor lut, Tensor counts)");
  m.def("topk_select(Tensor scores, int k) -> (Tensor indices, Tensor counts)");
  m.def("compact_mask(Tensor mask, int n_max) -> (Tensor indices, Tensor counts)");
  m.def(
      "gather_attn(Tensor q, Tensor k, Tensor v, Tensor indices, Tensor counts, bool is_causal, float scale, "
      "bool group_union, int union_rows, str tensor_layout, bool return_lse, bool check_lists) -> (Tensor o, Tensor lse)");
  m.def(
      "merge_attn(Tensor o_a, Tensor lse_a, Tensor o_b, Tensor lse_b, str tensor_layout) "
      "-> (Tensor o, Tensor lse)");
}

// One implementation serves both keys: it picks the backend from the tensors' device (and rejects
// mixed devices with a message naming both).
#define SPARGE_IMPL_ALL(m)                        \
  m.impl("block_map", &block_map);                \
  m.impl("block_sparse_attn", &block_sparse_attn); \
  m.impl("sparge_attn_fp8", &sparge_attn_fp8);    \
  m.impl("dense_attn", &dense_attn);              \
  m.impl("dense_attn_varlen", &dense_attn_varlen); \
  m.impl("block_sparse_attn_varlen", &block_sparse_attn_varlen); \
  m.impl("block_map_varlen", &block_map_varlen);  \
  m.impl("topk_select", &topk_select);            \
  m.impl("compact_mask", &compact_mask);          \
  m.impl("gather_attn", &gather_attn);            \
  m.impl("merge_attn", &merge_attn);

TORCH_LIBRARY_IMPL(sparge, CPU, m) { SPARGE_IMPL_ALL(m) }
TORCH_LIBRARY_IMPL(sparge, CUDA, m) { SPARGE_IMPL_ALL(m) }

#undef SPARGE_IMPL_ALL

}  // namespace sparge::py
