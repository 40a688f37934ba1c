// CUDA entry of build_block_map (docs/semantics.md Stage 1; design in docs/block_map_gpu.md).
// plan() is the one selection function: supported() reports its status, build_block_map() runs
// what it planned, so the two never disagree. The params have passed detail::validate already.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "cuda/attention/sm90/tensor_map.h"
#include "cuda/block_map/block_map.cuh"
#include "cuda/block_map/pdl.cuh"
#include "cuda/cuda_backend.h"
#include "cuda/scratch_pool.h"
#include "validate/validate.h"

namespace sparge::cuda {

namespace {

using namespace block_map;
constexpr const char* kOp = "build_block_map";

// Whether the 16-byte vector loads apply: unit stride along D and every row start 16-byte aligned
// (the base pointer, and the strides of every dimension that has more than one index, multiples
// of 8 elements). Otherwise the kernels read element by element, which is correct for any strides.
bool vector_loads(const Tensor& t) {
  if (t.shape[3] > 1 && t.stride[3] != 1) return false;
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] > 1 && t.stride[i] % 8 != 0) return false;
  }
  return true;
}

struct Plan {
  Geometry g;
  std::size_t select_smem = 0;
};

Status plan(const BlockMapParams& p, Plan& out) {
  if (p.q.dtype != DType::f16 && p.q.dtype != DType::bf16) {
    return unsupported(detail::cat(kOp, ": q.dtype = ", to_string(p.q.dtype),
                                   " is not supported by the CUDA backend (expected f16 or bf16)"));
  }
  const detail::Dims dims = detail::attention_dims(p.q, p.k, p.varlen);
  if (dims.d % 8 != 0 || dims.d > 256) {
    return unsupported(detail::cat(kOp, ": q.shape[3] (head dim) = ", dims.d,
                                   " is not supported by the CUDA backend (expected a multiple of 8, at most 256)"));
  }
  Geometry& g = out.g;
  g.nseq = dims.batch;
  g.hq = dims.hq;
  g.hk = dims.hk;
  g.d = dims.d;
  g.sq = dims.sq;
  g.sk = dims.sk;
  g.nq = num_blocks(dims.sq, p.blkq);
  g.nk = num_blocks(dims.sk, p.blkk);
  g.blkq = p.blkq;
  g.blkk = p.blkk;
  g.causal = p.is_causal;
  g.cu_q = p.varlen.enabled() ? p.varlen.cu_seqlens_q : nullptr;
  g.cu_k = p.varlen.enabled() ? p.varlen.cu_seqlens_k : nullptr;
  g.rows_q = p.q.shape[1];
  g.rows_k = p.k.shape[1];
  if (g.nk > kMaxKeyBlocks) {
    return unsupported(detail::cat(kOp, ": NK = ", g.nk, " key blocks per row (Sk = ", dims.sk, ", blkk = ", p.blkk,
                                   ") exceed the CUDA selection limit of ", kMaxKeyBlocks));
  }
  if (const QuantizedQK& f = p.maybe_fp8_qk; f.present()) {
    // The kernels store 8 bytes per lane and row (and the fp8 attention loads these with TMA).
    for (const auto& [name, t] : {std::pair{"maybe_fp8_qk.q8", &f.q8}, std::pair{"maybe_fp8_qk.k8", &f.k8}}) {
      if (reinterpret_cast<std::uintptr_t>(t->data) % 16 != 0) {
        return invalid_argument(detail::cat(kOp, ": ", name, ".data = ", t->data, " is not 16-byte aligned (the CUDA backend needs it)"));
      }
    }
  }
  out.select_smem = select_smem_bytes(g.nk);
  int dev = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) {
    return runtime_error(detail::cat(kOp, ": cannot query the CUDA device: ", cudaGetErrorString(e)));
  }
  if (out.select_smem > static_cast<std::size_t>(optin)) {
    return unsupported(detail::cat(kOp, ": NK = ", g.nk, " key blocks per row need ", out.select_smem,
                                   " bytes of shared memory for the selection, this device allows ", optin));
  }
  return {};
}

Rows rows_of(const Tensor& t) {
  Rows r;
  r.data = static_cast<const std::uint16_t*>(t.data);
  for (int i = 0; i < 4; ++i) r.stride[i] = t.stride[i];
  r.vec = vector_loads(t);
  return r;
}

template <class T>
Out<T> out_of(const Tensor& t) {
  Out<T> o;
  o.data = static_cast<T*>(t.data);
  for (int i = 0; i < t.ndim; ++i) o.stride[i] = t.stride[i];
  return o;
}

std::size_t round_up(std::size_t n) { return (n + 63) / 64 * 64; }  // 256-byte aligned regions

// Fills a per-head value, inline when the heads fit, else from `dev` (hq floats, uploaded by the
// caller from `host`).
void fill_heads(PerHead v, std::int64_t hq, HeadValues& out, std::vector<float>& host) {
  host.resize(static_cast<std::size_t>(hq));
  for (std::int64_t h = 0; h < hq; ++h) host[static_cast<std::size_t>(h)] = detail::per_head(v, static_cast<int>(h));
  if (hq <= kInlineHeads) {
    for (std::int64_t h = 0; h < hq; ++h) out.inl[h] = host[static_cast<std::size_t>(h)];
  }
}

// SPARGE_BLOCKMAP_PROFILE=1 (read per call): a CUDA event after each launch, and one line on stderr
// per call with the time of every stage (ms) and the total from the first launch. The print waits
// for the last event, so profiling adds a host synchronization per call; off, it costs nothing.
class StageTimer {
 public:
  explicit StageTimer(cudaStream_t stream) : stream_(stream) {
    const char* v = std::getenv("SPARGE_BLOCKMAP_PROFILE");
    on_ = v != nullptr && v[0] != '\0' && v[0] != '0';
    if (on_) mark("start");
  }
  ~StageTimer() {
    for (auto& m : marks_) cudaEventDestroy(m.second);
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  static void mark_fn(void* self, const char* stage) { static_cast<StageTimer*>(self)->mark(stage); }
  Marks marks() { return on_ ? Marks{&StageTimer::mark_fn, this} : Marks{}; }

  void mark(const char* stage) {
    if (!on_) return;
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess || cudaEventRecord(e, stream_) != cudaSuccess) {
      if (e != nullptr) cudaEventDestroy(e);
      (void)cudaGetLastError();
      on_ = false;  // timing is best effort; the block map itself goes on
      return;
    }
    marks_.emplace_back(stage, e);
  }

  void print(const Geometry& g, const char* pool_variant, const char* scores_variant, const char* select_variant) {
    if (!on_ || marks_.size() < 2 || cudaEventSynchronize(marks_.back().second) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    std::string line = detail::cat("sparge block map profile: nseq ", g.nseq, " hq ", g.hq, " hk ", g.hk, " sq ", g.sq,
                                   " sk ", g.sk, " d ", g.d, " blkq ", g.blkq, " blkk ", g.blkk, " nq ", g.nq, " nk ",
                                   g.nk, " pool ", pool_variant, " scores ", scores_variant, " select ", select_variant, ":");
    char buf[96];
    for (std::size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, marks_[i - 1].second, marks_[i].second);
      std::snprintf(buf, sizeof buf, " %s %.4f |", marks_[i].first, ms);
      line += buf;
    }
    float total = 0.0f;
    cudaEventElapsedTime(&total, marks_.front().second, marks_.back().second);
    std::snprintf(buf, sizeof buf, " total %.4f ms", total);
    line += buf;
    std::fprintf(stderr, "%s\n", line.c_str());
    (void)cudaGetLastError();
  }

 private:
  cudaStream_t stream_;
  bool on_ = false;
  std::vector<std::pair<const char*, cudaEvent_t>> marks_;
};

}  // namespace

Status supported(const BlockMapParams& p) {
  Plan pl;
  return plan(p, pl);
}

Status build_block_map(const BlockMapParams& p) {
  Plan pl;
  SPARGE_RETURN_IF_ERROR(plan(p, pl));
  const Geometry& g = pl.g;
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  const bool bf16 = p.q.dtype == DType::bf16;

  // Selection rule and per-head values.
  SelectRule rule;
  rule.use_topk = !p.topk.empty();
  rule.sink = p.attention_sink;
  rule.has_threshold = !p.simthreshd1.empty();
  std::vector<float> host_value, host_threshold;
  fill_heads(rule.use_topk ? p.topk : p.cdfthreshd, g.hq, rule.value, host_value);
  if (rule.has_threshold) fill_heads(p.simthreshd1, g.hq, rule.threshold, host_threshold);
  const bool heads_on_device = g.hq > kInlineHeads;

  // Scratch: one allocation on the stream (from the shared retained pool, src/cuda/scratch_pool.h),
  // carved into fp32 regions (and the folded K mean's 32-bit counters, the passes' 64-bit tickets).
  Scratch s;
  s.nchunks = p.smooth_k ? (g.sk + kKSumRows - 1) / kKSumRows : 0;
  const auto n = [](std::int64_t v) { return round_up(static_cast<std::size_t>(v)); };
  const std::size_t sizes[] = {
      n(g.nseq * g.hk * s.nchunks * g.d), n(g.nseq * g.hk * g.d), n(g.nseq * g.hk * g.nk * g.d), n(g.nseq * g.hk * g.nk),
      n(g.nseq * g.hq * g.nq * g.d),      n(g.nseq * g.hq * g.nq), n(g.nseq * g.hq * g.nq * g.nk),
      p.smooth_k ? n(g.nseq * g.hk) : 0,  // the folded K mean's counters (32-bit words)
      n(4),                                // the passes' item tickets (2 x 64-bit)
      heads_on_device ? n(2 * g.hq) : 0};
  std::size_t floats = 0;
  for (std::size_t v : sizes) floats += v;
  if (floats == sizes[8]) return {};  // nothing to compute (the tickets alone)

  float* base = nullptr;
  cudaError_t e = scratch_alloc(reinterpret_cast<void**>(&base), floats * sizeof(float), stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so it does not surface in a later call
    return runtime_error(detail::cat(kOp, ": cudaMallocFromPoolAsync of ", floats * sizeof(float),
                                     " bytes of scratch failed: ", cudaGetErrorString(e)));
  }
  float* cursor = base;
  float** regions[] = {&s.k_part, &s.k_mean, &s.pk, &s.k_sim, &s.pq, &s.q_sim, &s.scores};
  for (int i = 0; i < 7; ++i) {
    *regions[i] = cursor;
    cursor += sizes[i];
  }
  if (p.smooth_k) s.k_done = reinterpret_cast<std::uint32_t*>(cursor);  // 256-byte aligned
  cursor += sizes[7];
  s.tickets = reinterpret_cast<unsigned long long*>(cursor);  // 256-byte aligned
  cursor += sizes[8];

  const char* phase = "";
  const auto fail = [&](cudaError_t err) {
    (void)cudaFreeAsync(base, stream);
    (void)cudaGetLastError();
    return runtime_error(detail::cat(kOp, ": CUDA error in ", phase, ": ", cudaGetErrorString(err)));
  };

  if (heads_on_device) {
    phase = "copying per-head parameters";
    // Pageable host memory: cudaMemcpyAsync has staged the values when it returns, so the host
    // vectors may go out of scope afterwards.
    rule.value.dev = cursor;
    e = cudaMemcpyAsync(cursor, host_value.data(), g.hq * sizeof(float), cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess && rule.has_threshold) {
      rule.threshold.dev = cursor + g.hq;
      e = cudaMemcpyAsync(cursor + g.hq, host_threshold.data(), g.hq * sizeof(float), cudaMemcpyHostToDevice, stream);
    }
    if (e != cudaSuccess) return fail(e);
  }

  // The fp8 recipe's Q and K (opt-in): written by the pooling passes; with smooth_k the K mean is
  // computed straight into the output (the scratch region stays unused), without it the output
  // is zeros.
  Fp8Out fp8;
  if (const QuantizedQK& f = p.maybe_fp8_qk; f.present()) {
    fp8 = {static_cast<std::uint8_t*>(f.q8.data), static_cast<float*>(f.q_scale.data),
           static_cast<std::uint8_t*>(f.k8.data), static_cast<float*>(f.k_scale.data)};
    if (p.smooth_k) {
      s.k_mean = static_cast<float*>(f.k_mean.data);
    } else if ((e = cudaMemsetAsync(f.k_mean.data, 0, static_cast<std::size_t>(g.nseq * g.hk * g.d) * sizeof(float),
                                    stream)) != cudaSuccess) {
      phase = "zeroing maybe_fp8_qk.k_mean";
      return fail(e);
    }
  }

  StageTimer timer(stream);
  const Rows q = rows_of(p.q), k = rows_of(p.k);
  // The pooling ring loads by TMA where it can (the default; sm_90+, power-of-two head dims, 16-byte
  // rows, no fp8 outputs, whose passes take the fp8 ring kernel, maps the driver accepts); elsewhere
  // the cp.async ring runs (same bits). Only maps that a pass will use are encoded.
  TmaMaps maps;
  const TmaMaps* tma = nullptr;
  const int tma_rows = pool_tma_rows(g.d);
  if (pool_tma_asked() && fp8.q8 == nullptr && tma_rows > 0 && q.vec && k.vec && device_major() >= 9 &&
      sparge::cuda::attn::sm90::encode_rows_map(&maps.q, p.q, tma_rows) &&
      sparge::cuda::attn::sm90::encode_rows_map(&maps.k, p.k, tma_rows)) {
    tma = &maps;
  }
  phase = "the pooling (K mean, Q and K blocks)";
  if ((e = launch_pooling(g, q, k, bf16, p.smooth_k, s, out_of<float>(p.maybe_q_sim), out_of<float>(p.maybe_k_sim),
                          stream, timer.marks(), fp8, tma)) != cudaSuccess) {
    return fail(e);
  }
  const float scale = p.scale == 0.0f ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.d))) : p.scale;
  phase = "the pooled scores";
  if ((e = launch_scores(g, scale, s, stream)) != cudaSuccess) return fail(e);
  timer.mark("scores");
  phase = "the selection";
  if ((e = launch_select(g, rule, s, out_of<std::int32_t>(p.lut), out_of<std::int32_t>(p.counts),
                         out_of<float>(p.maybe_scores), stream)) != cudaSuccess) {
    return fail(e);
  }
  timer.mark("select");
  e = cudaFreeAsync(base, stream);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return runtime_error(detail::cat(kOp, ": cudaFreeAsync of the scratch failed: ", cudaGetErrorString(e)));
  }
  timer.print(g, pool_variant_name(tma != nullptr), scores_variant(g), select_variant(g.nk));
  return {};
}

}  // namespace sparge::cuda
