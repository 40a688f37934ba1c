// Context parallelism on every visible GPU, one process, one thread per rank (docs/context_parallel.md).
//   sparge_dist_tests            correctness: for each case the distributed result against the
//                                single-GPU build_block_map + block_sparse_attention on device 0
//                                (block map rows identical, LSE within fp32 merge rounding, O
//                                within the kernels' P rounding), then the failure test: one rank
//                                stops participating, every other rank must return an error within
//                                its timeout.
//   sparge_dist_tests --timing   s=131072 b=1 h=32 d=128 f16: time on 1 GPU and on all GPUs, and
//                                the scaling efficiency T1 / (R * TR), for topk 1.0 / 0.4 / 0.1.
//   --world=N uses the first N GPUs. With fewer than 2 GPUs it prints why and exits 0.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sparge/dist.h"
#include "sparge/half.h"
#include "sparge/ops.h"

namespace {

using namespace sparge;
using Clock = std::chrono::steady_clock;

#define CHECK_CUDA(expr)                                                                                       \
  do {                                                                                                         \
    const cudaError_t e_ = (expr);                                                                             \
    if (e_ != cudaSuccess) {                                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));           \
      std::exit(2);                                                                                            \
    }                                                                                                          \
  } while (0)

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs fn(rank) on one thread per rank, each with its device current.
void on_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      CHECK_CUDA(cudaSetDevice(r));
      fn(r);
    });
  }
  for (auto& t : threads) t.join();
}

// Non-blocking communicators (so that every wait in sparge is bounded), one per GPU.
std::vector<ncclComm_t> make_comms(int world) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    std::fprintf(stderr, "ncclGetUniqueId failed\n");
    std::exit(2);
  }
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(world));
  std::atomic<bool> ok{true};
  on_ranks(world, [&](int r) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t st = ncclCommInitRankConfig(&comms[static_cast<std::size_t>(r)], world, id, r, &cfg);
    const auto t0 = Clock::now();
    while (st == ncclInProgress && seconds_since(t0) < 120) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ncclCommGetAsyncError(comms[static_cast<std::size_t>(r)], &st);
    }
    if (st != ncclSuccess) {
      std::fprintf(stderr, "rank %d: ncclCommInitRankConfig: %s\n", r, ncclGetErrorString(st));
      ok = false;
    }
  });
  if (!ok) std::exit(2);
  return comms;
}

void destroy_comms(std::vector<ncclComm_t>& comms) {
  on_ranks(static_cast<int>(comms.size()), [&](int r) {
    ncclComm_t c = comms[static_cast<std::size_t>(r)];
    ncclResult_t st = ncclCommFinalize(c);
    const auto t0 = Clock::now();
    while (st == ncclInProgress && seconds_since(t0) < 60) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ncclCommGetAsyncError(c, &st);
    }
    if (st == ncclSuccess) {
      ncclCommDestroy(c);
    } else {
      ncclCommAbort(c);
    }
  });
  comms.clear();
}

template <class T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(std::size_t count) : n(count) { CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T))); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void upload(const std::vector<T>& h) { CHECK_CUDA(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void fill_bytes(int v) { CHECK_CUDA(cudaMemset(p, v, std::max<std::size_t>(n, 1) * sizeof(T))); }
};

struct Case {
  std::int64_t b = 1, s = 8192, hq = 4, hk = 4, d = 128;
  int blkq = 64, blkk = 64;
  DType dtype = DType::f16;
  DType o_dtype = DType::f32;
  bool causal = false;
  float topk = 0.4f;        // < 0: use cdf
  float cdf = -1.0f;
  float simthreshd1 = -2.0f;  // < -1: not given
  bool smooth_k = true;
  bool sink = false;
  std::string name() const {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "DIST(b=%lld,s=%lld,hq=%lld,hk=%lld,d=%lld,blkq=%d,blkk=%d,%s,o=%s,causal=%d,%s=%.2f,sim=%.2f,smooth_k=%d,sink=%d)",
                  static_cast<long long>(b), static_cast<long long>(s), static_cast<long long>(hq), static_cast<long long>(hk),
                  static_cast<long long>(d), blkq, blkk, to_string(dtype), to_string(o_dtype), causal ? 1 : 0,
                  cdf > 0 ? "cdf" : "topk", cdf > 0 ? cdf : topk, simthreshd1, smooth_k ? 1 : 0, sink ? 1 : 0);
    return buf;
  }
};

std::uint16_t to16(float x, DType t) { return t == DType::bf16 ? float_to_bf16(x) : float_to_half(x); }
float from16(std::uint16_t x, DType t) { return t == DType::bf16 ? bf16_to_float(x) : half_to_float(x); }

// Random values in 16-bit storage; a fast generator, since the timing mode fills gigabytes.
std::vector<std::uint16_t> random16(std::size_t n, DType t, std::uint64_t seed, float scale) {
  std::vector<std::uint16_t> out(n);
  const unsigned nthreads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (unsigned w = 0; w < nthreads; ++w) {
    th.emplace_back([&, w] {
      std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + w + 1;
      for (std::size_t i = w; i < n; i += nthreads) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Sum of two uniforms: a bump on [-1, 1), enough structure-free data for the map.
        const float u = static_cast<float>(x & 0xffffff) / 16777216.0f + static_cast<float>((x >> 24) & 0xffffff) / 16777216.0f - 1.0f;
        out[i] = to16(u * scale, t);
      }
    });
  }
  for (auto& t2 : th) t2.join();
  return out;
}

// Rows of shard sh of a global [B, S, H, D] array.
std::vector<std::uint16_t> shard_rows(const std::vector<std::uint16_t>& x, const dist::Shard& sh, std::int64_t b_n,
                                      std::int64_t s, std::int64_t h, std::int64_t d) {
  std::vector<std::uint16_t> out(static_cast<std::size_t>(b_n * sh.len * h * d));
  for (std::int64_t b = 0; b < b_n; ++b) {
    for (const dist::Piece& pc : sh.piece) {
      if (pc.len == 0) continue;
      std::copy_n(x.begin() + (b * s + pc.global_begin) * h * d, pc.len * h * d, out.begin() + (b * sh.len + pc.local_begin) * h * d);
    }
  }
  return out;
}

struct Inputs {
  std::vector<std::uint16_t> q, k, v;
};

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  Inputs in;
  in.q = random16(static_cast<std::size_t>(c.b * c.s * c.hq * c.d), c.dtype, seed, 2.0f);
  in.k = random16(static_cast<std::size_t>(c.b * c.s * c.hk * c.d), c.dtype, seed + 1, 2.0f);
  in.v = random16(static_cast<std::size_t>(c.b * c.s * c.hk * c.d), c.dtype, seed + 2, 1.0f);
  return in;
}

struct Rule {
  float topk[1], cdf[1], sim[1];
};

template <class P>
void set_rule(P& p, const Case& c, const Rule& r) {
  if (c.cdf > 0) {
    p.cdfthreshd = PerHead(r.cdf, 1);
  } else {
    p.topk = PerHead(r.topk, 1);
  }
  if (c.simthreshd1 >= -1.0f) p.simthreshd1 = PerHead(r.sim, 1);
  p.is_causal = c.causal;
  p.attention_sink = c.sink;
  p.smooth_k = c.smooth_k;
}

struct Reference {
  std::vector<std::int32_t> lut, counts;
  std::vector<float> o, lse;
  double seconds = 0;
};

// The single-GPU result on device 0 (o in c.o_dtype, widened to f32).
Reference single_gpu(const Case& c, const Inputs& in, int iters) {
  CHECK_CUDA(cudaSetDevice(0));
  const std::int64_t nq = num_blocks(c.s, c.blkq), nk = num_blocks(c.s, c.blkk);
  Dev<std::uint16_t> q(in.q.size()), k(in.k.size()), v(in.v.size());
  q.upload(in.q);
  k.upload(in.k);
  v.upload(in.v);
  Dev<std::int32_t> lut(static_cast<std::size_t>(c.b * c.hq * nq * nk)), counts(static_cast<std::size_t>(c.b * c.hq * nq));
  const std::size_t on = static_cast<std::size_t>(c.b * c.s * c.hq * c.d);
  Dev<std::uint8_t> o(on * dtype_size(c.o_dtype));
  Dev<float> lse(static_cast<std::size_t>(c.b * c.hq * c.s));
  const Rule rule{{c.topk}, {c.cdf}, {c.simthreshd1}};
  BlockMapParams bp;
  bp.q = make_tensor(q.p, c.dtype, {c.b, c.s, c.hq, c.d});
  bp.k = make_tensor(k.p, c.dtype, {c.b, c.s, c.hk, c.d});
  bp.blkq = c.blkq;
  bp.blkk = c.blkk;
  set_rule(bp, c, rule);
  bp.lut = make_tensor(lut.p, DType::i32, {c.b, c.hq, nq, nk});
  bp.counts = make_tensor(counts.p, DType::i32, {c.b, c.hq, nq});
  bp.exec.backend = Backend::cuda;
  BlockSparseAttentionParams ap;
  ap.q = bp.q;
  ap.k = bp.k;
  ap.v = make_tensor(v.p, c.dtype, {c.b, c.s, c.hk, c.d});
  ap.o = make_tensor(o.p, c.o_dtype, {c.b, c.s, c.hq, c.d});
  ap.maybe_lse = make_tensor(lse.p, DType::f32, {c.b, c.hq, c.s});
  ap.lut = bp.lut;
  ap.counts = bp.counts;
  ap.blkq = c.blkq;
  ap.blkk = c.blkk;
  ap.is_causal = c.causal;
  ap.exec.backend = Backend::cuda;
  Reference ref;
  std::vector<double> times;
  for (int it = 0; it < iters; ++it) {
    CHECK_CUDA(cudaDeviceSynchronize());
    const auto t0 = Clock::now();
    Status st = build_block_map(bp);
    if (st.ok()) st = block_sparse_attention(ap);
    if (!st.ok()) {
      std::fprintf(stderr, "single GPU reference failed: %s\n", st.message().c_str());
      std::exit(2);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  ref.seconds = times[times.size() / 2];
  ref.lut = lut.download();
  ref.counts = counts.download();
  ref.lse = lse.download();
  const std::vector<std::uint8_t> raw = o.download();
  ref.o.resize(on);
  for (std::size_t i = 0; i < on; ++i) ref.o[i] = load_as_float(raw.data(), c.o_dtype, static_cast<std::int64_t>(i));
  return ref;
}

struct RankOut {
  Status status;
  std::vector<std::int32_t> lut, counts;
  std::vector<float> o, lse;
  double seconds = 0;
};

// The distributed run on `world` ranks; per rank the outputs (downloaded) and the median time.
std::vector<RankOut> distributed(const Case& c, const Inputs& in, std::vector<ncclComm_t>& comms, int iters,
                                 double timeout_s) {
  const int world = static_cast<int>(comms.size());
  std::vector<RankOut> outs(static_cast<std::size_t>(world));
  std::barrier sync(world);
  std::atomic<bool> any_failed{false};  // all ranks leave the timing loop together
  on_ranks(world, [&](int r) {
    const dist::Shard sh = dist::shard_of(c.s, world, r);
    const std::int64_t L = sh.len, nql = num_blocks(L, c.blkq), nk = num_blocks(c.s, c.blkk);
    Dev<std::uint16_t> q(static_cast<std::size_t>(c.b * L * c.hq * c.d)), k(static_cast<std::size_t>(c.b * L * c.hk * c.d)),
        v(static_cast<std::size_t>(c.b * L * c.hk * c.d));
    q.upload(shard_rows(in.q, sh, c.b, c.s, c.hq, c.d));
    k.upload(shard_rows(in.k, sh, c.b, c.s, c.hk, c.d));
    v.upload(shard_rows(in.v, sh, c.b, c.s, c.hk, c.d));
    const std::size_t on = static_cast<std::size_t>(c.b * L * c.hq * c.d);
    Dev<std::uint8_t> o(on * dtype_size(c.o_dtype));
    Dev<float> lse(static_cast<std::size_t>(c.b * c.hq * L));
    Dev<std::int32_t> lut(static_cast<std::size_t>(c.b * c.hq * nql * nk)), counts(static_cast<std::size_t>(c.b * c.hq * nql));
    o.fill_bytes(0xff);  // NaN everywhere: a row the ring forgot stays NaN
    lse.fill_bytes(0xff);
    lut.fill_bytes(0x7f);
    counts.fill_bytes(0x7f);
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const Rule rule{{c.topk}, {c.cdf}, {c.simthreshd1}};
    dist::SparseAttentionParams p;
    p.comm = {comms[static_cast<std::size_t>(r)], r, world, nullptr};
    p.q = make_tensor(q.p, c.dtype, {c.b, L, c.hq, c.d});
    p.k = make_tensor(k.p, c.dtype, {c.b, L, c.hk, c.d});
    p.v = make_tensor(v.p, c.dtype, {c.b, L, c.hk, c.d});
    p.o = make_tensor(o.p, c.o_dtype, {c.b, L, c.hq, c.d});
    p.maybe_lse = make_tensor(lse.p, DType::f32, {c.b, c.hq, L});
    p.maybe_lut = make_tensor(lut.p, DType::i32, {c.b, c.hq, nql, nk});
    p.maybe_counts = make_tensor(counts.p, DType::i32, {c.b, c.hq, nql});
    p.seq_len = c.s;
    p.blkq = c.blkq;
    p.blkk = c.blkk;
    set_rule(p, c, rule);
    p.timeout_seconds = timeout_s;
    p.exec = {Backend::cuda, stream, 0};
    RankOut& out = outs[static_cast<std::size_t>(r)];
    std::vector<double> times;
    for (int it = 0; it < iters; ++it) {
      sync.arrive_and_wait();
      const auto t0 = Clock::now();
      out.status = dist::sparse_attention(p);
      if (!out.status.ok()) any_failed = true;
      sync.arrive_and_wait();  // the slowest rank sets the time
      times.push_back(seconds_since(t0));
      if (any_failed) break;
    }
    std::sort(times.begin(), times.end());
    out.seconds = times[times.size() / 2];
    if (out.status.ok()) {
      out.lut = lut.download();
      out.counts = counts.download();
      out.lse = lse.download();
      const std::vector<std::uint8_t> raw = o.download();
      out.o.resize(on);
      for (std::size_t i = 0; i < on; ++i) out.o[i] = load_as_float(raw.data(), c.o_dtype, static_cast<std::int64_t>(i));
    }
    cudaStreamDestroy(stream);
  });
  return outs;
}

// Compares every rank's rows with the single-GPU rows; returns "" when they agree.
std::string compare(const Case& c, const Reference& ref, const std::vector<RankOut>& outs) {
  const int world = static_cast<int>(outs.size());
  const std::int64_t nq = num_blocks(c.s, c.blkq), nk = num_blocks(c.s, c.blkk);
  double max_lse = 0, sq_err = 0, sq_ref = 0, max_o = 0;
  char buf[512];
  for (int r = 0; r < world; ++r) {
    const RankOut& out = outs[static_cast<std::size_t>(r)];
    if (!out.status.ok()) return "rank " + std::to_string(r) + ": " + out.status.message();
    const dist::Shard sh = dist::shard_of(c.s, world, r);
    const std::int64_t L = sh.len, nql = num_blocks(L, c.blkq);
    for (std::int64_t b = 0; b < c.b; ++b) {
      for (std::int64_t h = 0; h < c.hq; ++h) {
        for (std::int64_t j = 0; j < nql; ++j) {
          const dist::Piece& pc = j < num_blocks(sh.piece[0].len, c.blkq) ? sh.piece[0] : sh.piece[1];
          const std::int64_t gq = pc.global_begin / c.blkq + j - pc.local_begin / c.blkq;
          const std::int32_t want = ref.counts[static_cast<std::size_t>((b * c.hq + h) * nq + gq)];
          const std::int32_t got = out.counts[static_cast<std::size_t>((b * c.hq + h) * nql + j)];
          if (want != got) {
            std::snprintf(buf, sizeof buf, "rank %d: block map count of b=%lld h=%lld q block %lld: %d, single GPU %d", r,
                          static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(gq), got, want);
            return buf;
          }
          for (std::int64_t x = 0; x < nk; ++x) {
            const std::int32_t w = ref.lut[static_cast<std::size_t>(((b * c.hq + h) * nq + gq) * nk + x)];
            const std::int32_t g = out.lut[static_cast<std::size_t>(((b * c.hq + h) * nql + j) * nk + x)];
            if (w != g) {
              std::snprintf(buf, sizeof buf, "rank %d: block map of b=%lld h=%lld q block %lld differs at slot %lld: %d, single GPU %d", r,
                            static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(gq),
                            static_cast<long long>(x), g, w);
              return buf;
            }
          }
        }
        for (std::int64_t i = 0; i < L; ++i) {
          const dist::Piece& pc = i < sh.piece[0].len ? sh.piece[0] : sh.piece[1];
          const std::int64_t gi = pc.global_begin + i - pc.local_begin;
          const float lw = ref.lse[static_cast<std::size_t>((b * c.hq + h) * c.s + gi)];
          const float lg = out.lse[static_cast<std::size_t>((b * c.hq + h) * L + i)];
          if (std::isnan(lg) || std::isinf(lw) != std::isinf(lg)) {
            std::snprintf(buf, sizeof buf, "rank %d: lse of b=%lld h=%lld row %lld is %g, single GPU %g", r,
                          static_cast<long long>(b), static_cast<long long>(h), static_cast<long long>(gi), lg, lw);
            return buf;
          }
          if (std::isfinite(lw)) max_lse = std::max(max_lse, std::fabs(static_cast<double>(lg) - lw));
          for (std::int64_t x = 0; x < c.d; ++x) {
            const float ow = ref.o[static_cast<std::size_t>(((b * c.s + gi) * c.hq + h) * c.d + x)];
            const float og = out.o[static_cast<std::size_t>(((b * L + i) * c.hq + h) * c.d + x)];
            if (!std::isfinite(og)) {
              std::snprintf(buf, sizeof buf, "rank %d: o of b=%lld h=%lld row %lld is %g", r, static_cast<long long>(b),
                            static_cast<long long>(h), static_cast<long long>(gi), og);
              return buf;
            }
            const double e = static_cast<double>(og) - ow;
            sq_err += e * e;
            sq_ref += static_cast<double>(ow) * ow;
            max_o = std::max(max_o, std::fabs(e));
          }
        }
      }
    }
  }
  // LSE: fp32 sums merged in fp32. O: the kernels round P to 16 bits relative to the running max,
  // which differs between a partial and the whole row; a missing or doubled block moves the LSE
  // by ~1/blocks and the O error far past these bounds.
  const double nmse = sq_ref > 0 ? sq_err / sq_ref : 0;
  const double o_tol = c.o_dtype == DType::f32 ? 1e-5 : 4e-5;
  if (max_lse > 1e-4 || nmse > o_tol || max_o > 2e-2) {
    std::snprintf(buf, sizeof buf, "max |lse - ref| = %.3g (tol 1e-4), o nmse = %.3g (tol %.0e), max |o - ref| = %.3g (tol 2e-2)",
                  max_lse, nmse, o_tol, max_o);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "OK (max |dlse| %.2g, o nmse %.2g)", max_lse, nmse);
  return std::string("=") + buf;
}

std::vector<Case> correctness_cases() {
  std::vector<Case> cs;
  for (bool causal : {false, true}) {
    for (float topk : {1.0f, 0.4f, 0.1f}) {
      Case c;
      c.causal = causal;
      c.topk = topk;
      cs.push_back(c);
    }
  }
  {
    Case c;  // GQA 4:1, head dim 64, a tail block and an empty chunk
    c.s = 6000;
    c.hq = 8;
    c.hk = 2;
    c.d = 64;
    c.causal = true;
    cs.push_back(c);
    c.causal = false;
    c.topk = 0.1f;
    cs.push_back(c);
  }
  {
    Case c;  // bf16, blkq != blkk, batch 2, f16-width output, a tail
    c.b = 2;
    c.s = 5000;
    c.hq = 4;
    c.hk = 2;
    c.blkq = 128;
    c.blkk = 64;
    c.dtype = DType::bf16;
    c.o_dtype = DType::bf16;
    c.causal = true;
    c.topk = 0.4f;
    cs.push_back(c);
    c.blkq = 64;
    c.blkk = 128;
    c.causal = false;
    c.o_dtype = DType::f32;
    cs.push_back(c);
  }
  {
    Case c;  // cdf selection, similarity threshold, sink, no smoothing; f16 output
    c.s = 9000;
    c.cdf = 0.8f;
    c.simthreshd1 = 0.3f;
    c.sink = true;
    c.causal = true;
    c.o_dtype = DType::f16;
    cs.push_back(c);
    c.smooth_k = false;
    c.causal = false;
    cs.push_back(c);
  }
  {
    Case c;  // short: some ranks hold empty shards
    c.s = 1500;
    c.causal = true;
    cs.push_back(c);
  }
  return cs;
}

// One rank (the last) never calls; every other rank must fail with a timeout, in time.
bool failure_test(int world) {
  std::vector<ncclComm_t> comms = make_comms(world);
  Case c;
  c.s = 4096;
  const Inputs in = make_inputs(c, 99);
  const double timeout = 5.0;
  std::vector<std::string> msgs(static_cast<std::size_t>(world));
  std::vector<double> elapsed(static_cast<std::size_t>(world), 0);
  std::vector<int> failed(static_cast<std::size_t>(world), 0);
  // Drive ranks 0..world-2 through the normal path, with the full world size in the params.
  on_ranks(world - 1, [&](int r) {
    const dist::Shard sh = dist::shard_of(c.s, world, r);
    const std::int64_t L = sh.len;
    Dev<std::uint16_t> q(static_cast<std::size_t>(L * c.hq * c.d)), k(static_cast<std::size_t>(L * c.hk * c.d));
    q.upload(shard_rows(in.q, sh, 1, c.s, c.hq, c.d));
    k.upload(shard_rows(in.k, sh, 1, c.s, c.hk, c.d));
    Dev<float> o(static_cast<std::size_t>(L * c.hq * c.d));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const float topk[1] = {0.4f};
    dist::SparseAttentionParams p;
    p.comm = {comms[static_cast<std::size_t>(r)], r, world, nullptr};
    p.q = make_tensor(q.p, c.dtype, {1, L, c.hq, c.d});
    p.k = p.v = make_tensor(k.p, c.dtype, {1, L, c.hk, c.d});
    p.o = make_tensor(o.p, DType::f32, {1, L, c.hq, c.d});
    p.seq_len = c.s;
    p.topk = PerHead(topk, 1);
    p.timeout_seconds = timeout;
    p.exec = {Backend::cuda, stream, 0};
    const auto t0 = Clock::now();
    const Status st = dist::sparse_attention(p);
    elapsed[static_cast<std::size_t>(r)] = seconds_since(t0);
    failed[static_cast<std::size_t>(r)] = st.ok() ? 0 : 1;
    msgs[static_cast<std::size_t>(r)] = st.message();
    // After the abort nothing of ours may still hang the device.
    CHECK_CUDA(cudaStreamSynchronize(stream));
    cudaStreamDestroy(stream);
  });
  {  // the rank that stopped participating cleans up its own communicator
    CHECK_CUDA(cudaSetDevice(world - 1));
    ncclCommAbort(comms.back());
  }
  bool ok = true;
  for (int r = 0; r + 1 < world; ++r) {
    const bool good = failed[static_cast<std::size_t>(r)] && msgs[static_cast<std::size_t>(r)].find("timed out") != std::string::npos &&
                      elapsed[static_cast<std::size_t>(r)] < timeout + 10.0;
    std::printf("DIST_FAILURE(world=%d,rank=%d,timeout=%.0fs): %s after %.2f s: %s\n", world, r, timeout,
                good ? "OK" : "FAIL", elapsed[static_cast<std::size_t>(r)], msgs[static_cast<std::size_t>(r)].c_str());
    ok = ok && good;
  }
  return ok;  // the communicators were aborted (by sparge on the failing ranks, above on the last)
}

void timing(std::vector<ncclComm_t>& comms) {
  const int world = static_cast<int>(comms.size());
  std::printf("\nTiming: s=131072 b=1 hq=hk=32 d=128 f16, blkq=128 blkk=64, median of 3 after a warm-up; "
              "single GPU = build_block_map + block_sparse_attention on device 0\n");
  std::printf("%-7s %-5s %12s %12s %10s %12s\n", "causal", "topk", "1 GPU (ms)", "R GPUs (ms)", "speedup", "efficiency");
  Case c;
  c.s = 131072;
  c.hq = c.hk = 32;
  c.d = 128;
  c.blkq = 128;
  c.blkk = 64;
  c.o_dtype = DType::f16;
  const Inputs in = make_inputs(c, 7);
  for (bool causal : {false, true}) {
    for (float topk : {1.0f, 0.4f, 0.1f}) {
      c.causal = causal;
      c.topk = topk;
      const Reference ref = single_gpu(c, in, 4);
      const std::vector<RankOut> outs = distributed(c, in, comms, 4, 600.0);
      for (const RankOut& o : outs) {
        if (!o.status.ok()) {
          std::printf("timing failed: %s\n", o.status.message().c_str());
          return;
        }
      }
      double tr = 0;
      for (const RankOut& o : outs) tr = std::max(tr, o.seconds);
      std::printf("%-7d %-5.1f %12.2f %12.2f %10.2f %11.1f%%   (R = %d)\n", causal ? 1 : 0, topk, ref.seconds * 1e3, tr * 1e3,
                  ref.seconds / tr, 100.0 * ref.seconds / (world * tr), world);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool do_timing = false;
  int want_world = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--timing") == 0) do_timing = true;
    if (std::strncmp(argv[i], "--world=", 8) == 0) want_world = std::atoi(argv[i] + 8);
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (!dist::available()) {
    std::printf("sparge_dist_tests: skipped: this build has no NCCL\n0 passed, 0 failed, 1 skipped\n");
    return 0;
  }
  if (n < 2) {
    std::printf("sparge_dist_tests: skipped: %d GPU(s) visible, context parallelism needs at least 2\n"
                "0 passed, 0 failed, 1 skipped\n", n);
    return 0;
  }
  const int world = want_world >= 2 ? std::min(want_world, n) : n;
  std::printf("sparge_dist_tests: %d ranks (one thread per GPU)\n", world);
  std::vector<ncclComm_t> comms = make_comms(world);
  if (do_timing) {
    timing(comms);
    destroy_comms(comms);
    return 0;
  }
  int passed = 0, failed = 0;
  std::uint64_t seed = 1;
  for (const Case& c : correctness_cases()) {
    const Inputs in = make_inputs(c, seed++);
    const Reference ref = single_gpu(c, in, 1);
    const std::vector<RankOut> outs = distributed(c, in, comms, 1, 120.0);
    const std::string verdict = compare(c, ref, outs);
    const bool ok = !verdict.empty() && verdict[0] == '=';
    std::printf("%s: %s\n", c.name().c_str(), ok ? verdict.c_str() + 1 : ("FAIL: " + verdict).c_str());
    std::fflush(stdout);
    (ok ? passed : failed)++;
    if (!ok) {
      bool aborted = false;
      for (const RankOut& o : outs) aborted = aborted || !o.status.ok();
      if (aborted) {  // the communicators are gone; the remaining cases cannot run
        std::printf("a rank failed: stopping\n%d passed, %d failed\n", passed, failed);
        return 1;
      }
    }
  }
  destroy_comms(comms);
  (failure_test(world) ? passed : failed)++;
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
