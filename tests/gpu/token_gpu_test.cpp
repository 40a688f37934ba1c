// Stage 3 on the GPU against the CPU backend (docs/semantics.md, "Stage 3"):
//   TOPK_GPU*     index lists and counts bitwise identical to the CPU backend (ties, -inf, +inf,
//                 k = N, k = 1, short rows, f16/f32, strided rows), NaN -> error naming the row,
//                 400 relaunches bitwise identical, timing of the 512 x 131072, k = 2048 shape;
//   COMPACT_GPU*  lists and counts identical to the CPU backend, overflow and NaN/+inf errors;
//   GATHER_GPU*   O and LSE vs an fp64 oracle within 2x the error of a same-precision reference
//                 (+ noise), vs the CPU backend, group_union == per-row, bad lists, 400 relaunches,
//                 and the hd128 / 2048 keys / 64-row groups timing with the measured union overlap.
// Every output is poisoned before the run (an unwritten element shows) and guarded on both sides.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <map>
#include <set>
#include <tuple>

#include "cuda/gather/tma_probe.h"
#include "gpu/gpu_harness.h"

namespace sparge::test {
namespace {

Exec gpu_exec() { return Exec{Backend::cuda, nullptr, 0}; }
Exec cpu_exec() { return Exec{Backend::cpu, nullptr, 0}; }

// Host scores of dtype t as raw bytes (f32 or f16 storage).
std::vector<unsigned char> to_bytes(const std::vector<float>& v, DType t) {
  std::vector<unsigned char> out(v.size() * dtype_size(t));
  if (t == DType::f32) {
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    const auto h = to_storage16(v, t);
    std::memcpy(out.data(), h.data(), out.size());
  }
  return out;
}

// ---- topk_select -------------------------------------------------------------------------------
enum class ScoreKind { normal, quantised, neg_inf_heavy, pos_inf, all_neg_inf, zeros_signed };

std::vector<float> make_scores(ScoreKind kind, std::int64_t r, std::int64_t n, std::mt19937_64& rng) {
  std::vector<float> s(static_cast<size_t>(r * n));
  fill_normal(s, rng);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& x : s) {
    switch (kind) {
      case ScoreKind::normal: break;
      case ScoreKind::quantised: x = std::round(x * 2.0f); break;  // ~13 levels: many ties
      case ScoreKind::neg_inf_heavy: if (u(rng) < 0.9f) x = -INFINITY; else x = std::round(x); break;
      case ScoreKind::pos_inf: { const float c = u(rng); if (c < 0.05f) x = INFINITY; else if (c < 0.3f) x = -INFINITY; } break;
      case ScoreKind::all_neg_inf: x = -INFINITY; break;
      case ScoreKind::zeros_signed: x = u(rng) < 0.5f ? 0.0f : (u(rng) < 0.5f ? -0.0f : std::round(x)); break;
    }
  }
  return s;
}

struct TopkRun {
  std::vector<std::int32_t> idx, counts;
  Status st;
};

// Runs topk_select on `backend` over scores stored [r, n] with row stride ld (>= n) and column
// stride cs; outputs poisoned and guarded.
TopkRun run_topk(Backend backend, const std::vector<float>& s_logical, std::int64_t r, std::int64_t n, int k, DType t,
                 std::int64_t cs = 1, std::int64_t ld = -1) {
  if (ld < 0) ld = n * cs;
  std::vector<float> stored(static_cast<size_t>(r * ld), -7.0f);
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < n; ++j) stored[static_cast<size_t>(i * ld + j * cs)] = s_logical[static_cast<size_t>(i * n + j)];
  const auto bytes = to_bytes(stored, t);
  TopkRun out;
  if (backend == Backend::cpu) {
    Guarded<std::int32_t> idx(static_cast<size_t>(r * k)), cnt(static_cast<size_t>(r));
    idx.poison();
    cnt.poison();
    TopkSelectParams p;
    p.scores = make_tensor(const_cast<unsigned char*>(bytes.data()), t, {r, n}, {ld, cs});
    p.k = k;
    p.indices = make_tensor(idx.data(), DType::i32, {r, k});
    p.maybe_counts = make_tensor(cnt.data(), DType::i32, {r});
    p.exec = cpu_exec();
    out.st = topk_select(p);
    out.idx.assign(idx.data(), idx.data() + idx.size());
    out.counts.assign(cnt.data(), cnt.data() + cnt.size());
    EXPECT_TRUE(idx.guards_intact() && cnt.guards_intact());
    return out;
  }
  DeviceGuarded<unsigned char> ds(bytes.size());
  ds.upload(bytes);
  DeviceGuarded<std::int32_t> idx(static_cast<size_t>(r * k)), cnt(static_cast<size_t>(r));
  idx.poison();
  cnt.poison();
  TopkSelectParams p;
  p.scores = make_tensor(ds.data(), t, {r, n}, {ld, cs});
  p.k = k;
  p.indices = make_tensor(idx.data(), DType::i32, {r, k});
  p.maybe_counts = make_tensor(cnt.data(), DType::i32, {r});
  p.exec = gpu_exec();
  out.st = topk_select(p);
  out.idx = idx.download();
  out.counts = cnt.download();
  EXPECT_TRUE(idx.guards_intact()) << "indices guard overwritten";
  EXPECT_TRUE(cnt.guards_intact()) << "counts guard overwritten";
  return out;
}

void expect_same_lists(const TopkRun& cpu, const TopkRun& gpu, std::int64_t width) {
  ASSERT_TRUE(cpu.st.ok()) << cpu.st.message();
  ASSERT_TRUE(gpu.st.ok()) << gpu.st.message();
  ASSERT_EQ(cpu.idx.size(), gpu.idx.size());
  for (size_t i = 0; i < cpu.idx.size(); ++i) {
    if (cpu.idx[i] != gpu.idx[i]) {
      FAIL() << "indices differ at row " << i / width << " slot " << i % width << ": cpu " << cpu.idx[i] << " gpu " << gpu.idx[i];
    }
  }
  for (size_t i = 0; i < cpu.counts.size(); ++i) ASSERT_EQ(cpu.counts[i], gpu.counts[i]) << "counts differ at row " << i;
}

const char* kind_name(ScoreKind k) {
  switch (k) {
    case ScoreKind::normal: return "normal";
    case ScoreKind::quantised: return "quantised";
    case ScoreKind::neg_inf_heavy: return "neginf90";
    case ScoreKind::pos_inf: return "posinf";
    case ScoreKind::all_neg_inf: return "allneginf";
    case ScoreKind::zeros_signed: return "signedzeros";
  }
  return "?";
}

SPARGE_CASES(TopkGpu) {
  struct Shape { std::int64_t r, n; int k; ScoreKind kind; std::int64_t cs; };
  const Shape shapes[] = {
      {64, 4096, 64, ScoreKind::normal, 1},      {64, 4096, 64, ScoreKind::quantised, 1},
      {33, 5000, 700, ScoreKind::quantised, 1},  {16, 20000, 2048, ScoreKind::quantised, 1},
      {16, 20000, 2048, ScoreKind::neg_inf_heavy, 1}, {16, 3001, 100, ScoreKind::pos_inf, 1},
      {8, 1000, 1000, ScoreKind::normal, 1},     {8, 1000, 1000, ScoreKind::quantised, 1},  // k = N
      {8, 1000, 1000, ScoreKind::pos_inf, 1},    {32, 777, 1, ScoreKind::normal, 1},        // k = 1
      {32, 777, 1, ScoreKind::quantised, 1},     {4, 513, 37, ScoreKind::all_neg_inf, 1},
      {16, 10007, 300, ScoreKind::neg_inf_heavy, 1},  // fewer than k selectable in most rows
      {16, 4096, 900, ScoreKind::zeros_signed, 1},    {7, 3333, 123, ScoreKind::quantised, 3},  // strided
      {1, 131072, 2048, ScoreKind::quantised, 1},     {3, 17, 5, ScoreKind::quantised, 1},
  };
  for (const Shape& sh : shapes) {
    for (DType t : {DType::f32, DType::f16}) {
      const std::string name = Name("TOPK_GPU")("r", sh.r)("n", sh.n)("k", sh.k)("dtype", to_string(t))("scores", kind_name(sh.kind))("cs", sh.cs);
      cases.push_back({name, [sh, t, name] {
                         if (!have_gpu()) GTEST_SKIP() << "no GPU";
                         auto rng = rng_for(name);
                         const auto s = make_scores(sh.kind, sh.r, sh.n, rng);
                         const auto cpu = run_topk(Backend::cpu, s, sh.r, sh.n, sh.k, t, sh.cs);
                         const auto gpu = run_topk(Backend::cuda, s, sh.r, sh.n, sh.k, t, sh.cs);
                         expect_same_lists(cpu, gpu, sh.k);
                       }});
    }
  }
  // Row stride not a multiple of the vector width: the strided path, same answer.
  cases.push_back({"TOPK_GPU(r=9,n=1000,k=50,dtype=f32,ld=1001)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     auto rng = rng_for("TOPK_GPU_ld");
                     const auto s = make_scores(ScoreKind::quantised, 9, 1000, rng);
                     expect_same_lists(run_topk(Backend::cpu, s, 9, 1000, 50, DType::f32, 1, 1001),
                                       run_topk(Backend::cuda, s, 9, 1000, 50, DType::f32, 1, 1001), 50);
                   }});
  for (DType t : {DType::f32, DType::f16}) {
    cases.push_back({Name("TOPK_GPU_NAN")("dtype", to_string(t)), [t] {
                       if (!have_gpu()) GTEST_SKIP() << "no GPU";
                       auto rng = rng_for("TOPK_GPU_NAN");
                       auto s = make_scores(ScoreKind::normal, 12, 3000, rng);
                       s[static_cast<size_t>(9 * 3000 + 2500)] = NAN;
                       s[static_cast<size_t>(5 * 3000 + 17)] = NAN;  // the lowest row is reported
                       const auto gpu = run_topk(Backend::cuda, s, 12, 3000, 40, t);
                       EXPECT_EQ(gpu.st.code(), StatusCode::invalid_argument);
                       EXPECT_NE(gpu.st.message().find("scores[5, 17]"), std::string::npos) << gpu.st.message();
                       EXPECT_NE(gpu.st.message().find("row 5"), std::string::npos) << gpu.st.message();
                     }});
  }
  // Long rows (the sample filter is on): NaN in a sampled column, in the row's last (partial)
  // chunk and in the middle; the lowest (row, column) is reported under every kernel variant.
  for (DType t : {DType::f32, DType::f16}) {
    cases.push_back({Name("TOPK_GPU_NAN_LONG")("dtype", to_string(t)), [t] {
                       if (!have_gpu()) GTEST_SKIP() << "no GPU";
                       auto rng = rng_for("TOPK_GPU_NAN_LONG");
                       const std::int64_t r = 4, n = 40003;
                       auto s = make_scores(ScoreKind::normal, r, n, rng);
                       s[static_cast<size_t>(3 * n + 0)] = NAN;          // row 3, sampled column 0
                       s[static_cast<size_t>(2 * n + n - 1)] = -NAN;     // row 2, last column
                       s[static_cast<size_t>(2 * n + 30001)] = NAN;      // row 2: the lowest
                       for (const char* v : {"0", "1", "4", "5", "6"}) {
                         ::setenv("SPARGE_TOPK_VARIANT", v, 1);
                         const auto gpu = run_topk(Backend::cuda, s, r, n, 2048, t);
                         ::unsetenv("SPARGE_TOPK_VARIANT");
                         SCOPED_TRACE(std::string("SPARGE_TOPK_VARIANT=") + v);
                         EXPECT_EQ(gpu.st.code(), StatusCode::invalid_argument);
                         EXPECT_NE(gpu.st.message().find("scores[2, 30001]"), std::string::npos) << gpu.st.message();
                       }
                     }});
  }
  cases.push_back({"TOPK_GPU_RELAUNCH(r=64,n=20000,k=2048,dtype=f32,runs=400)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     auto rng = rng_for("TOPK_GPU_RELAUNCH");
                     const std::int64_t r = 64, n = 20000;
                     const int k = 2048;
                     const auto s = make_scores(ScoreKind::quantised, r, n, rng);
                     DeviceGuarded<float> ds(s.size());
                     ds.upload(s);
                     DeviceGuarded<std::int32_t> idx(static_cast<size_t>(r * k));
                     TopkSelectParams p;
                     p.scores = make_tensor(ds.data(), DType::f32, {r, n});
                     p.k = k;
                     p.indices = make_tensor(idx.data(), DType::i32, {r, k});
                     p.exec = gpu_exec();
                     std::vector<std::int32_t> first;
                     for (int run = 0; run < 400; ++run) {
                       idx.poison();
                       ASSERT_TRUE(topk_select(p).ok());
                       auto got = idx.download();
                       if (run == 0) first = got;
                       else ASSERT_EQ(std::memcmp(first.data(), got.data(), got.size() * 4), 0) << "run " << run << " differs";
                     }
                   }});
  // The PERF.md shape: correctness against the CPU, then the kernel time (median of 20 runs).
  for (DType t : {DType::f32, DType::f16}) {
    const std::string name = Name("TOPK_GPU")("r", 512)("n", 131072)("k", 2048)("dtype", to_string(t));
    cases.push_back({name, [t, name] {
                       if (!have_gpu()) GTEST_SKIP() << "no GPU";
                       const std::int64_t r = 512, n = 131072;
                       const int k = 2048;
                       auto rng = rng_for(name);
                       const auto s = make_scores(ScoreKind::normal, r, n, rng);
                       expect_same_lists(run_topk(Backend::cpu, s, r, n, k, t), run_topk(Backend::cuda, s, r, n, k, t), k);
                       const auto bytes = to_bytes(s, t);
                       DeviceGuarded<unsigned char> ds(bytes.size());
                       ds.upload(bytes);
                       DeviceGuarded<std::int32_t> idx(static_cast<size_t>(r * k));
                       TopkSelectParams p;
                       p.scores = make_tensor(ds.data(), t, {r, n});
                       p.k = k;
                       p.indices = make_tensor(idx.data(), DType::i32, {r, k});
                       p.exec = gpu_exec();
                       cudaEvent_t e0, e1;
                       SPARGE_CUDA_CHECK(cudaEventCreate(&e0));
                       SPARGE_CUDA_CHECK(cudaEventCreate(&e1));
                       const char* variant = std::getenv("SPARGE_TOPK_VARIANT");
                       // Second round: SPARGE_TOPK_NO_SYNC=1 (no NaN read-back), to see what the sync costs.
                       for (const bool no_sync : {false, true}) {
                         if (no_sync) ::setenv("SPARGE_TOPK_NO_SYNC", "1", 1);
                         std::vector<float> ms;
                         for (int it = 0; it < 23; ++it) {
                           SPARGE_CUDA_CHECK(cudaEventRecord(e0));
                           ASSERT_TRUE(topk_select(p).ok());
                           SPARGE_CUDA_CHECK(cudaEventRecord(e1));
                           SPARGE_CUDA_CHECK(cudaEventSynchronize(e1));
                           float x = 0;
                           SPARGE_CUDA_CHECK(cudaEventElapsedTime(&x, e0, e1));
                           if (it >= 3) ms.push_back(x);
                         }
                         if (no_sync) ::unsetenv("SPARGE_TOPK_NO_SYNC");
                         std::sort(ms.begin(), ms.end());
                         std::printf("[perf] %s variant=%s: median %.3f ms (min %.3f, max %.3f), %s\n", name.c_str(),
                                     variant != nullptr ? variant : "0", ms[ms.size() / 2], ms.front(), ms.back(),
                                     no_sync ? "NO_SYNC (kernel + launch only)" : "includes the error-flag sync");
                       }
                       cudaEventDestroy(e0);
                       cudaEventDestroy(e1);
                     }});
  }
}

// ---- compact_mask ------------------------------------------------------------------------------
struct CompactRun {
  std::vector<std::int32_t> idx, counts;
  Status st;
};

CompactRun run_compact(Backend backend, const std::vector<float>& m, std::int64_t r, std::int64_t n, int n_max, DType t) {
  const auto bytes = to_bytes(m, t);
  CompactRun out;
  CompactMaskParams p;
  p.n_max = n_max;
  if (backend == Backend::cpu) {
    Guarded<std::int32_t> idx(static_cast<size_t>(r * n_max)), cnt(static_cast<size_t>(r));
    idx.poison();
    cnt.poison();
    p.mask = make_tensor(const_cast<unsigned char*>(bytes.data()), t, {r, n});
    p.indices = make_tensor(idx.data(), DType::i32, {r, n_max});
    p.counts = make_tensor(cnt.data(), DType::i32, {r});
    p.exec = cpu_exec();
    out.st = compact_mask(p);
    out.idx.assign(idx.data(), idx.data() + idx.size());
    out.counts.assign(cnt.data(), cnt.data() + cnt.size());
    return out;
  }
  DeviceGuarded<unsigned char> dm(bytes.size());
  dm.upload(bytes);
  DeviceGuarded<std::int32_t> idx(static_cast<size_t>(r * n_max)), cnt(static_cast<size_t>(r));
  idx.poison();
  cnt.poison();
  p.mask = make_tensor(dm.data(), t, {r, n});
  p.indices = make_tensor(idx.data(), DType::i32, {r, n_max});
  p.counts = make_tensor(cnt.data(), DType::i32, {r});
  p.exec = gpu_exec();
  out.st = compact_mask(p);
  out.idx = idx.download();
  out.counts = cnt.download();
  EXPECT_TRUE(idx.guards_intact() && cnt.guards_intact()) << "guard overwritten";
  return out;
}

std::vector<float> make_mask(std::int64_t r, std::int64_t n, double keep, std::mt19937_64& rng) {
  std::vector<float> m(static_cast<size_t>(r * n));
  std::uniform_real_distribution<double> u(0, 1);
  for (auto& x : m) x = u(rng) < keep ? static_cast<float>(u(rng) * 4 - 2) : -INFINITY;
  return m;
}

SPARGE_CASES(CompactGpu) {
  struct Shape { std::int64_t r, n; int n_max; double keep; };
  const Shape shapes[] = {{64, 4096, 4096, 0.1}, {32, 16384, 2048, 0.1}, {17, 1001, 1001, 1.0}, {8, 999, 50, 0.02},
                          {5, 100000, 40000, 0.3}, {3, 7, 7, 0.5}, {4, 300, 1, 0.0}};  // last: every entry masked (n_max = 0 is invalid)
  for (const Shape& sh : shapes) {
    for (DType t : {DType::f32, DType::f16}) {
      const std::string name = Name("COMPACT_GPU")("r", sh.r)("n", sh.n)("n_max", sh.n_max)("keep", sh.keep)("dtype", to_string(t));
      cases.push_back({name, [sh, t, name] {
                         if (!have_gpu()) GTEST_SKIP() << "no GPU";
                         auto rng = rng_for(name);
                         const auto m = make_mask(sh.r, sh.n, sh.keep, rng);
                         const auto cpu = run_compact(Backend::cpu, m, sh.r, sh.n, sh.n_max, t);
                         const auto gpu = run_compact(Backend::cuda, m, sh.r, sh.n, sh.n_max, t);
                         ASSERT_TRUE(cpu.st.ok()) << cpu.st.message();
                         ASSERT_TRUE(gpu.st.ok()) << gpu.st.message();
                         ASSERT_EQ(cpu.idx, gpu.idx);
                         ASSERT_EQ(cpu.counts, gpu.counts);
                       }});
    }
  }
  cases.push_back({"COMPACT_GPU_OVERFLOW(r=16,n=5000,n_max=100)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     auto rng = rng_for("COMPACT_GPU_OVERFLOW");
                     auto m = make_mask(16, 5000, 0.01, rng);  // ~50 per row
                     for (int c = 0; c < 300; ++c) m[static_cast<size_t>(11 * 5000 + c * 7)] = 0.0f;
                     for (int c = 0; c < 200; ++c) m[static_cast<size_t>(6 * 5000 + c * 3)] = 1.0f;
                     const auto cpu = run_compact(Backend::cpu, m, 16, 5000, 100, DType::f32);
                     const auto gpu = run_compact(Backend::cuda, m, 16, 5000, 100, DType::f32);
                     EXPECT_EQ(gpu.st.code(), StatusCode::overflow);
                     EXPECT_NE(gpu.st.message().find("row 6 "), std::string::npos) << gpu.st.message();
                     EXPECT_EQ(gpu.st.message(), cpu.st.message());
                   }});
  for (float bad : {NAN, INFINITY}) {
    const std::string name = Name("COMPACT_GPU_BADVALUE")("value", bad);
    cases.push_back({name, [bad, name] {
                       if (!have_gpu()) GTEST_SKIP() << "no GPU";
                       auto rng = rng_for(name);
                       auto m = make_mask(10, 3000, 0.5, rng);
                       m[static_cast<size_t>(7 * 3000 + 2999)] = bad;
                       m[static_cast<size_t>(3 * 3000 + 1500)] = bad;
                       m[static_cast<size_t>(3 * 3000 + 1600)] = bad;
                       const auto cpu = run_compact(Backend::cpu, m, 10, 3000, 3000, DType::f32);
                       const auto gpu = run_compact(Backend::cuda, m, 10, 3000, 3000, DType::f32);
                       EXPECT_EQ(gpu.st.code(), StatusCode::invalid_argument);
                       EXPECT_NE(gpu.st.message().find("mask[3, 1500]"), std::string::npos) << gpu.st.message();
                       EXPECT_EQ(gpu.st.message(), cpu.st.message());
                     }});
  }
}

// ---- gather_attention --------------------------------------------------------------------------
struct GCase {
  std::int64_t b, hq, hk, sq, sk, d;
  int n_max;
  DType t;
  bool causal;
  bool o_f32;
  double empty_frac;
  int overlap_rows;   // adjacent positions share most keys when > 1 (like top-k of nearby tokens)
  double swap = 0.1;  // fraction of the shared base set each row replaces by random keys
};

std::string gname(const char* op, const GCase& c) {
  return Name(op)("b", c.b)("hq", c.hq)("hk", c.hk)("sq", c.sq)("sk", c.sk)("d", c.d)("n_max", c.n_max)("dtype", to_string(c.t))(
      "causal", c.causal)("o", c.o_f32 ? "f32" : "same")("overlap", c.overlap_rows);
}

// max |a - b| over two outputs of 16-bit dtype dt, element by element (the perf benches' check
// that every path computes the same attention as the first one timed).
double max_abs_diff16(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b, DType dt) {
  double diff = 0;
  for (size_t i = 0; i + 1 < a.size(); i += 2) {
    const auto e = static_cast<std::int64_t>(i / 2);
    diff = std::max(diff, static_cast<double>(std::abs(load_as_float(a.data(), dt, e) - load_as_float(b.data(), dt, e))));
  }
  return diff;
}

struct GProblem {
  GCase c;
  std::vector<float> q, k, v;  // rounded through the dtype: the values the kernels see
  std::vector<std::int32_t> idx, counts;  // [b, hq, sq, n_max], [b, hq, sq]
};

// Times gather_attention(p): 3 warmup calls, then runs - 3 timed ones (CUDA events around each call);
// every call must succeed. *ms receives the timed runs, sorted (median ms[size / 2]); *host_ms, when
// given, the host's wall time inside each timed call (it returns after the list checks' read-back).
void time_gather(const GatherAttentionParams& p, int runs, std::vector<float>* ms, std::vector<float>* host_ms = nullptr) {
  cudaEvent_t e0, e1;
  SPARGE_CUDA_CHECK(cudaEventCreate(&e0));
  SPARGE_CUDA_CHECK(cudaEventCreate(&e1));
  ms->clear();
  if (host_ms != nullptr) host_ms->clear();
  for (int it = 0; it < runs; ++it) {
    SPARGE_CUDA_CHECK(cudaEventRecord(e0));
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = gather_attention(p);
    const auto t1 = std::chrono::steady_clock::now();
    if (host_ms != nullptr && it >= 3) host_ms->push_back(std::chrono::duration<float, std::milli>(t1 - t0).count());
    SPARGE_CUDA_CHECK(cudaEventRecord(e1));
    SPARGE_CUDA_CHECK(cudaEventSynchronize(e1));
    ASSERT_TRUE(st.ok()) << st.message();
    float x = 0;
    SPARGE_CUDA_CHECK(cudaEventElapsedTime(&x, e0, e1));
    if (it >= 3) ms->push_back(x);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms->begin(), ms->end());
  if (host_ms != nullptr) std::sort(host_ms->begin(), host_ms->end());
}

// Times n back-to-back gather_attention(p) calls between two events (no synchronisation between
// calls, as a model's layers would issue them): milliseconds per call.
float time_gather_back_to_back(const GatherAttentionParams& p, int n) {
  cudaEvent_t e0, e1;
  SPARGE_CUDA_CHECK(cudaEventCreate(&e0));
  SPARGE_CUDA_CHECK(cudaEventCreate(&e1));
  bool ok = true;
  SPARGE_CUDA_CHECK(cudaEventRecord(e0));
  for (int it = 0; it < n; ++it) ok = gather_attention(p).ok() && ok;
  SPARGE_CUDA_CHECK(cudaEventRecord(e1));
  SPARGE_CUDA_CHECK(cudaEventSynchronize(e1));
  float x = 0;
  SPARGE_CUDA_CHECK(cudaEventElapsedTime(&x, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  EXPECT_TRUE(ok);
  return x / static_cast<float>(n);
}

GProblem make_gather(const GCase& c, const std::string& salt) {
  GProblem g;
  g.c = c;
  auto rng = rng_for(salt);
  g.q.resize(static_cast<size_t>(c.b * c.sq * c.hq * c.d));
  g.k.resize(static_cast<size_t>(c.b * c.sk * c.hk * c.d));
  g.v.resize(g.k.size());
  fill_normal(g.q, rng);
  fill_normal(g.k, rng);
  fill_normal(g.v, rng);
  g.q = round_through(g.q, c.t);
  g.k = round_through(g.k, c.t);
  g.v = round_through(g.v, c.t);
  const std::int64_t rows = c.b * c.hq * c.sq;
  g.idx.assign(static_cast<size_t>(rows * c.n_max), -1);
  g.counts.assign(static_cast<size_t>(rows), 0);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::int32_t> perm(static_cast<size_t>(c.sk));
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::vector<std::int32_t>> bases;
  const int cap = static_cast<int>(std::min<std::int64_t>(c.n_max, c.sk));
  for (std::int64_t bb = 0; bb < c.b; ++bb) {
    for (std::int64_t h = 0; h < c.hq; ++h) {
      for (std::int64_t i = 0; i < c.sq; ++i) {
        const std::int64_t row = (bb * c.hq + h) * c.sq + i;
        // One base set per (b, kv head, overlap_rows positions), shared by the kv head's query
        // heads; each row then swaps a fraction `swap` of it. overlap_rows <= 1: independent rows.
        std::vector<std::int32_t> list;
        if (c.overlap_rows > 1) {
          auto& base_set = bases[{bb, h / (c.hq / c.hk), i / c.overlap_rows}];
          if (base_set.empty()) {
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng);
            base_set.assign(perm.begin(), perm.begin() + cap);
          }
          list = base_set;
        } else {
          std::iota(perm.begin(), perm.end(), 0);
          std::shuffle(perm.begin(), perm.end(), rng);
          list.assign(perm.begin(), perm.begin() + cap);
        }
        if (c.overlap_rows > 1 && c.swap > 0) {
          std::set<std::int32_t> have(list.begin(), list.end());
          std::uniform_int_distribution<std::int32_t> key(0, static_cast<std::int32_t>(c.sk - 1));
          for (auto& x : list) {
            if (u(rng) < c.swap) {
              const std::int32_t y = key(rng);
              if (!have.count(y)) { have.erase(x); have.insert(y); x = y; }
            }
          }
        }
        std::shuffle(list.begin(), list.end(), rng);  // any order: the kernel must not assume sorted
        int n = u(rng) < c.empty_frac ? 0 : static_cast<int>(std::uniform_int_distribution<int>(cap / 2, cap)(rng));
        if (u(rng) < 0.2 || c.empty_frac < 0) n = cap;  // empty_frac < 0: every row full
        for (int t = 0; t < n; ++t) g.idx[static_cast<size_t>(row * c.n_max + t)] = list[static_cast<size_t>(t)];
        g.counts[static_cast<size_t>(row)] = n;
      }
    }
  }
  return g;
}

// fp64 oracle (exact softmax over the row's visible listed keys) and, with lowp, the
// same-precision reference: fp32 logits, P = exp(s - max) rounded to the dtype, fp32 sums, output
// rounded to the output dtype (the error budget of a kernel that feeds P to a half-precision MMA).
void gather_reference(const GProblem& g, bool lowp, std::vector<double>& o, std::vector<double>& lse) {
  const GCase& c = g.c;
  const std::int64_t grp = c.hq / c.hk;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  o.assign(g.q.size(), 0.0);
  lse.assign(static_cast<size_t>(c.b * c.hq * c.sq), -INFINITY);
  std::vector<double> s;
  std::vector<std::int32_t> keys;
  for (std::int64_t bb = 0; bb < c.b; ++bb)
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < c.sq; ++i) {
        const std::int64_t row = (bb * c.hq + h) * c.sq + i;
        const std::int64_t hk = h / grp;
        keys.clear();
        for (int t = 0; t < g.counts[static_cast<size_t>(row)]; ++t) {
          const std::int32_t j = g.idx[static_cast<size_t>(row * c.n_max + t)];
          if (c.causal && j > i + c.sk - c.sq) continue;
          keys.push_back(j);
        }
        if (keys.empty()) continue;
        const float* qr = &g.q[static_cast<size_t>(((bb * c.sq + i) * c.hq + h) * c.d)];
        s.assign(keys.size(), 0.0);
        double mx = -INFINITY;
        for (size_t t = 0; t < keys.size(); ++t) {
          const float* kr = &g.k[static_cast<size_t>(((bb * c.sk + keys[t]) * c.hk + hk) * c.d)];
          if (lowp) {
            float acc = 0;
            for (std::int64_t x = 0; x < c.d; ++x) acc += qr[x] * kr[x];
            s[t] = static_cast<float>(acc * static_cast<float>(scale));
          } else {
            double acc = 0;
            for (std::int64_t x = 0; x < c.d; ++x) acc += static_cast<double>(qr[x]) * kr[x];
            s[t] = acc * scale;
          }
          mx = std::max(mx, s[t]);
        }
        double l = 0;
        double* orow = &o[static_cast<size_t>(((bb * c.sq + i) * c.hq + h) * c.d)];
        for (size_t t = 0; t < keys.size(); ++t) {
          double p = std::exp(s[t] - mx);
          l += p;
          if (lowp) p = round_through({static_cast<float>(p)}, c.t)[0];
          const float* vr = &g.v[static_cast<size_t>(((bb * c.sk + keys[t]) * c.hk + hk) * c.d)];
          for (std::int64_t x = 0; x < c.d; ++x) orow[x] += p * vr[x];
        }
        for (std::int64_t x = 0; x < c.d; ++x) {
          orow[x] /= l;
          if (lowp) orow[x] = round_through({static_cast<float>(orow[x])}, c.o_f32 ? DType::f32 : c.t)[0];
        }
        lse[static_cast<size_t>(row)] = mx + std::log(l);
      }
}

struct GOut {
  std::vector<float> o, lse;
  Status st;
};

// A gather problem's inputs on the device: Q / K / V uploaded (dtype c.t), O (odt) and LSE guarded,
// the given lists uploaded; `p` holds every tensor, the lists as [b, list_heads, sq, n_max] (list_heads
// = hq: make_gather's own per-query-head lists; hk: one list per kv head), and gpu_exec(). with_lse =
// false leaves maybe_lse unset (the perf rows time the call without it). Every GPU runner of
// gather_attention below builds its call from this.
struct DeviceGather {
  DeviceGuarded<unsigned char> dq, dk, dv, o;
  DeviceGuarded<float> lse;
  DeviceGuarded<std::int32_t> di, dc;
  GatherAttentionParams p;
  DeviceGather(const GProblem& g, const std::vector<std::int32_t>& idx, const std::vector<std::int32_t>& cnt,
               std::int64_t list_heads, DType odt, bool with_lse = true)
      : dq(g.q.size() * 2), dk(g.k.size() * 2), dv(g.v.size() * 2), o(g.q.size() * dtype_size(odt)),
        lse(static_cast<size_t>(g.c.b * g.c.hq * g.c.sq)), di(idx.size()), dc(cnt.size()) {
    const GCase& c = g.c;
    dq.upload(to_bytes(g.q, c.t));
    dk.upload(to_bytes(g.k, c.t));
    dv.upload(to_bytes(g.v, c.t));
    di.upload(idx);
    dc.upload(cnt);
    p.q = make_tensor(dq.data(), c.t, {c.b, c.sq, c.hq, c.d});
    p.k = make_tensor(dk.data(), c.t, {c.b, c.sk, c.hk, c.d});
    p.v = make_tensor(dv.data(), c.t, {c.b, c.sk, c.hk, c.d});
    p.o = make_tensor(o.data(), odt, {c.b, c.sq, c.hq, c.d});
    if (with_lse) p.maybe_lse = make_tensor(lse.data(), DType::f32, {c.b, c.hq, c.sq});
    p.indices = make_tensor(di.data(), DType::i32, {c.b, list_heads, c.sq, c.n_max});
    p.counts = make_tensor(dc.data(), DType::i32, {c.b, list_heads, c.sq});
    p.exec = gpu_exec();
  }
};

// Runs on the GPU (or the CPU backend, with f32 copies of the rounded inputs when t is f32-only).
// list_heads = 0: indices [b, hq, sq, n_max]; otherwise indices [b, list_heads, sq, n_max] (the
// per-kv-head layout when list_heads = hk), with idx/cnt overrides of that size.
GOut run_gather(const GProblem& g, Backend backend, bool group_union, int union_rows = 64,
                const std::vector<std::int32_t>* idx_override = nullptr, const std::vector<std::int32_t>* cnt_override = nullptr,
                std::int64_t list_heads = 0, bool check_lists = true) {
  const GCase& c = g.c;
  const std::int64_t lh = list_heads > 0 ? list_heads : c.hq;
  const auto& idx = idx_override ? *idx_override : g.idx;
  const auto& cnt = cnt_override ? *cnt_override : g.counts;
  GOut out;
  // The call's flags, the same for both backends.
  const auto flagged = [&](GatherAttentionParams q) {
    q.is_causal = c.causal;
    q.group_union = group_union;
    q.union_rows = union_rows;
    q.check_lists = check_lists;
    return q;
  };
  const DType odt = c.o_f32 ? DType::f32 : c.t;
  const std::int64_t lrows = c.b * c.hq * c.sq;
  auto decode_o = [&](const std::vector<unsigned char>& raw) {
    std::vector<float> f(g.q.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = load_as_float(raw.data(), odt, static_cast<std::int64_t>(i));
    return f;
  };
  if (backend == Backend::cpu) {
    const auto qb = to_bytes(g.q, c.t), kb = to_bytes(g.k, c.t), vb = to_bytes(g.v, c.t);
    Guarded<unsigned char> o(g.q.size() * dtype_size(odt));
    Guarded<float> lse(static_cast<size_t>(lrows));
    GatherAttentionParams p;
    p.q = make_tensor(const_cast<unsigned char*>(qb.data()), c.t, {c.b, c.sq, c.hq, c.d});
    p.k = make_tensor(const_cast<unsigned char*>(kb.data()), c.t, {c.b, c.sk, c.hk, c.d});
    p.v = make_tensor(const_cast<unsigned char*>(vb.data()), c.t, {c.b, c.sk, c.hk, c.d});
    p.o = make_tensor(o.data(), odt, {c.b, c.sq, c.hq, c.d});
    p.maybe_lse = make_tensor(lse.data(), DType::f32, {c.b, c.hq, c.sq});
    p.indices = make_tensor(const_cast<std::int32_t*>(idx.data()), DType::i32, {c.b, lh, c.sq, c.n_max});
    p.counts = make_tensor(const_cast<std::int32_t*>(cnt.data()), DType::i32, {c.b, lh, c.sq});
    p.exec = cpu_exec();
    out.st = gather_attention(flagged(p));
    out.o = decode_o(std::vector<unsigned char>(o.data(), o.data() + o.size()));
    out.lse.assign(lse.data(), lse.data() + lse.size());
    return out;
  }
  DeviceGather dg(g, idx, cnt, lh, odt);
  auto& o = dg.o;
  auto& lse = dg.lse;
  if (c.o_f32) {  // poison as floats
    std::vector<unsigned char> pz(o.size());
    const std::uint32_t pat = 0x7fbadbadu;
    for (size_t i = 0; i + 4 <= pz.size(); i += 4) std::memcpy(&pz[i], &pat, 4);
    o.upload(pz);
  } else {
    std::vector<unsigned char> pz(o.size());
    const std::uint16_t pat = 0x7e5a;
    for (size_t i = 0; i + 2 <= pz.size(); i += 2) std::memcpy(&pz[i], &pat, 2);
    o.upload(pz);
  }
  lse.poison();
  out.st = gather_attention(flagged(dg.p));
  out.o = decode_o(o.download());
  out.lse = lse.download();
  EXPECT_TRUE(o.guards_intact() && lse.guards_intact()) << "output guard overwritten";
  return out;
}

double max_abs_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(a[i])) continue;  // checked exactly by compare()
    e = std::max(e, std::abs(a[i] - ref[i]));
  }
  return e;
}

// FA-style judgement: O within 2x the same-precision reference's error (+ noise), LSE close, and
// NaN/Inf positions exactly the oracle's (compare()).
void check_gather(const GOut& gpu, const std::vector<double>& o_ref, const std::vector<double>& lse_ref, double lowp_err,
                  const std::string& what) {
  ASSERT_TRUE(gpu.st.ok()) << what << ": " << gpu.st.message();
  const Error eo = compare(gpu.o.data(), o_ref.data(), o_ref.size());
  const Error el = compare(gpu.lse.data(), lse_ref.data(), lse_ref.size());
  EXPECT_EQ(eo.nonfinite_mismatch, 0) << what << " O: " << describe(eo);
  EXPECT_EQ(el.nonfinite_mismatch, 0) << what << " LSE: " << describe(el);
  const double tol = 2.0 * lowp_err + 1e-3;
  EXPECT_LE(eo.max_abs, tol) << what << " O: " << describe(eo) << " (same-precision reference: " << lowp_err << ")";
  EXPECT_LE(el.max_abs, 1e-3) << what << " LSE: " << describe(el);
}

// ---- gather_attention with one list per kv head (indices [B, Hk, Sq, n_max]) --------------------
// Query head h reads list h / (Hq / Hk). The problem is built from make_gather's lists: list hk is
// the list of query head hk * G; the "expanded" problem gives every head of the group that list in
// the per-query-head layout. Both layouts mean the same attention, and the GPU runs the same tiles
// over the same unions and masks, so their outputs must be bitwise equal (per-row and union); the
// CPU backend must agree with itself across layouts bitwise, and the GPU with the fp64 oracle.
namespace gather_kv {

struct KvLists {
  std::vector<std::int32_t> idx, counts;  // [b, hk, sq, n_max], [b, hk, sq]
  GProblem expanded;                      // the same lists, per query head
};

KvLists kv_lists(const GProblem& g) {
  const GCase& c = g.c;
  const std::int64_t grp = c.hq / c.hk;
  KvLists kv;
  kv.expanded = g;
  kv.idx.assign(static_cast<size_t>(c.b * c.hk * c.sq * c.n_max), -1);
  kv.counts.assign(static_cast<size_t>(c.b * c.hk * c.sq), 0);
  for (std::int64_t bb = 0; bb < c.b; ++bb)
    for (std::int64_t h = 0; h < c.hq; ++h)
      for (std::int64_t i = 0; i < c.sq; ++i) {
        const std::int64_t hk = h / grp;
        const std::int64_t src = (bb * c.hq + hk * grp) * c.sq + i;  // the group's first head
        const std::int64_t dst = (bb * c.hq + h) * c.sq + i;
        const std::int64_t kvr = (bb * c.hk + hk) * c.sq + i;
        kv.counts[static_cast<size_t>(kvr)] = g.counts[static_cast<size_t>(src)];
        kv.expanded.counts[static_cast<size_t>(dst)] = g.counts[static_cast<size_t>(src)];
        for (int t = 0; t < c.n_max; ++t) {
          kv.idx[static_cast<size_t>(kvr * c.n_max + t)] = g.idx[static_cast<size_t>(src * c.n_max + t)];
          kv.expanded.idx[static_cast<size_t>(dst * c.n_max + t)] = g.idx[static_cast<size_t>(src * c.n_max + t)];
        }
      }
  return kv;
}

// Union overlap of kv-head lists: per group of 64 positions of one kv head, the union's size over the
// sum of the group's (distinct) list lengths, summed over all groups before dividing.
double union_overlap(const KvLists& kv) {
  const GCase& c = kv.expanded.c;
  double sum_lists = 0, sum_union = 0;
  for (std::int64_t bh = 0; bh < c.b * c.hk; ++bh)
    for (std::int64_t i0 = 0; i0 < c.sq; i0 += 64) {
      std::vector<char> seen(static_cast<size_t>(c.sk), 0);
      for (std::int64_t i = i0; i < std::min(i0 + 64, c.sq); ++i) {
        const std::int64_t row = bh * c.sq + i;
        for (int t = 0; t < kv.counts[static_cast<size_t>(row)]; ++t) {
          char& f = seen[static_cast<size_t>(kv.idx[static_cast<size_t>(row * c.n_max + t)])];
          sum_union += f == 0;
          f = 1;
        }
        sum_lists += kv.counts[static_cast<size_t>(row)];
      }
    }
  return sum_union / sum_lists;
}

// Empties every list of kv head 0 at positions [0, n) (a whole union group without keys).
void empty_positions(KvLists& kv, std::int64_t n) {
  const GCase& c = kv.expanded.c;
  const std::int64_t grp = c.hq / c.hk;
  for (std::int64_t i = 0; i < std::min(n, c.sq); ++i) {
    kv.counts[static_cast<size_t>(i)] = 0;
    for (std::int64_t h = 0; h < grp; ++h) kv.expanded.counts[static_cast<size_t>(h * c.sq + i)] = 0;
  }
}

void expect_bitwise(const GOut& a, const GOut& b, const std::string& what) {
  ASSERT_TRUE(a.st.ok()) << what << ": " << a.st.message();
  ASSERT_TRUE(b.st.ok()) << what << ": " << b.st.message();
  ASSERT_EQ(a.o.size(), b.o.size());
  EXPECT_EQ(std::memcmp(a.o.data(), b.o.data(), a.o.size() * 4), 0) << what << ": O differs";
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0) << what << ": LSE differs";
}

// PERF.md's gather shape (b1 hq32 hk8 sq1024 sk16384 d128, 2048 keys per row, swap 0) on the device
// for the perf benches: Q / K / V / O, both list layouts, and params with every tensor but the lists
// (use_lists picks a layout). One seed for both benches, so their rows time the same problem.
struct PerfProblem {
  GCase c;
  GProblem g = make_gather(c, "GATHER_GPU_KV_PERF");
  KvLists kv = kv_lists(g);
  DeviceGather dg{g, kv.expanded.idx, kv.expanded.counts, c.hq, c.t, false};  // the per-query-head lists
  DeviceGuarded<std::int32_t> dik{kv.idx.size()}, dck{kv.counts.size()};      // the per-kv-head lists
  GatherAttentionParams& p = dg.p;
  DeviceGuarded<unsigned char>& o = dg.o;
  double flops = 4.0 * c.d * 2048.0 * static_cast<double>(c.b * c.hq * c.sq);  // on the attended keys

  explicit PerfProblem(std::int64_t d = 128, std::int64_t hk = 8) : c{1, 32, hk, 1024, 16384, d, 2048, DType::f16, false, false, -1.0, 64, 0.0} {
    dik.upload(kv.idx);
    dck.upload(kv.counts);
    p.union_rows = 64;
  }
  // The lists per kv head ([b, hk, sq, n_max]) or per query head ([b, hq, sq, n_max]).
  void use_lists(bool per_kv_head) {
    p.indices = per_kv_head ? make_tensor(dik.data(), DType::i32, {c.b, c.hk, c.sq, c.n_max})
                            : make_tensor(dg.di.data(), DType::i32, {c.b, c.hq, c.sq, c.n_max});
    p.counts = per_kv_head ? make_tensor(dck.data(), DType::i32, {c.b, c.hk, c.sq})
                           : make_tensor(dg.dc.data(), DType::i32, {c.b, c.hq, c.sq});
  }
};

}  // namespace gather_kv

// One timed configuration of a perf problem: the median, min and max of 13 calls, the host time in
// the call, back-to-back calls, then (profile) one call with the [gather profile] line, and the
// output's max difference to ref (ref is set by the first call of a table).
struct RowTiming {
  double med = 0, min = 0, max = 0, host = 0, b2b = 0, diff = 0;
  std::vector<unsigned char> out;
};
void measure_row(gather_kv::PerfProblem& pp, bool profile, std::vector<unsigned char>& ref, RowTiming* r) {
  std::vector<float> ms, host;
  ASSERT_NO_FATAL_FAILURE(time_gather(pp.p, 13, &ms, &host));
  r->med = ms[ms.size() / 2];
  r->min = ms.front();
  r->max = ms.back();
  r->host = host[host.size() / 2];
  r->b2b = time_gather_back_to_back(pp.p, 20);
  if (profile) {
    ScopedEnv e("SPARGE_GATHER_PROFILE", "1");
    ASSERT_TRUE(gather_attention(pp.p).ok());
  }
  SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
  r->out = pp.o.download();
  if (ref.empty()) ref = r->out;
  r->diff = max_abs_diff16(r->out, ref, pp.c.t);
}

// ---- one case runner for both list layouts ------------------------------------------------------
// gather_attention takes one list per query head ([b, hq, sq, n_max], make_gather's own lists) or
// one per kv head ([b, hk, sq, n_max], kv_lists). GATHER_GPU* and GATHER_GPU_KV* cases run the
// same bodies below, parameterised by the layout; the kv layout adds the checks that only it has
// (CPU backend bitwise across layouts, GPU bitwise against the expanded per-query-head problem).
enum class Layout { q, kv };

// The lists of a case in one layout. `problem` is what the oracle reads (per query head: for kv,
// the expanded copy); run() launches gather_attention on the layout's own lists.
struct LayoutLists {
  Layout layout = Layout::q;
  GProblem problem;
  gather_kv::KvLists kv;  // kv layout only
  GOut run(Backend be, bool uni, int ur = 64) const {
    if (layout == Layout::q) return run_gather(problem, be, uni, ur);
    return run_gather(problem, be, uni, ur, &kv.idx, &kv.counts, problem.c.hk);
  }
};

// kv layout: list hk = the list of query head hk * G; the first `empty` positions of kv head 0
// get empty lists (a whole union group without keys).
LayoutLists layout_lists(const GProblem& g, Layout layout, std::int64_t empty) {
  LayoutLists l;
  l.layout = layout;
  if (layout == Layout::q) {
    l.problem = g;
    return l;
  }
  l.kv = gather_kv::kv_lists(g);
  if (empty > 0) gather_kv::empty_positions(l.kv, empty);
  l.problem = l.kv.expanded;
  return l;
}

// SPARGE_GATHER_UNION_VARIANT values with the union-kernel knobs each is run under: every bit
// combination (1 kStream, 2 kPosMap, 4 kRowBitmaps), one CTA / clusters of 8, shared-memory mask
// batches of one list / global atomics (mask_rows only matters without kRowBitmaps).
const char* const kUnionVariants[] = {"0", "1", "2", "3", "4", "5", "6", "7"};

// An attention path of gather_attention: SPARGE_GATHER_PATH with, for the warp-specialized kernel
// (path "ws", attention_ws.cuh), its switches SPARGE_GATHER_WS_WG / _STAGES / _ARRIVE / _PINGPONG
// (nullptr: unset, the kernel's default).
struct PathConfig {
  const char* label;
  const char* path;
  const char* ws_wg = nullptr;
  const char* ws_stages = nullptr;
  const char* ws_arrive = nullptr;
  const char* ws_pingpong = nullptr;
  const char* prefetch = nullptr;  // SPARGE_GATHER_PREFETCH
  const char* l2pf = nullptr;      // SPARGE_GATHER_L2PF
  const char* pdl = nullptr;       // SPARGE_GATHER_PDL
  const char* wgmma_stages = nullptr;  // SPARGE_GATHER_WGMMA_STAGES
  const char* ws_pair = nullptr;       // SPARGE_GATHER_WS_PAIR
  const char* ws_persist = nullptr;    // SPARGE_GATHER_WS_PERSIST
  const char* persist_ctas = nullptr;  // SPARGE_GATHER_WS_PERSIST_CTAS (a smaller persistent grid)
};
// Sets a PathConfig's variables for its lifetime.
class PathEnv {
 public:
  explicit PathEnv(const PathConfig& c)
      : path_("SPARGE_GATHER_PATH", c.path),
        wg_("SPARGE_GATHER_WS_WG", c.ws_wg),
        stages_("SPARGE_GATHER_WS_STAGES", c.ws_stages),
        arrive_("SPARGE_GATHER_WS_ARRIVE", c.ws_arrive),
        pingpong_("SPARGE_GATHER_WS_PINGPONG", c.ws_pingpong),
        prefetch_("SPARGE_GATHER_PREFETCH", c.prefetch),
        l2pf_("SPARGE_GATHER_L2PF", c.l2pf),
        pdl_("SPARGE_GATHER_PDL", c.pdl),
        wgmma_stages_("SPARGE_GATHER_WGMMA_STAGES", c.wgmma_stages),
        ws_pair_("SPARGE_GATHER_WS_PAIR", c.ws_pair),
        ws_persist_("SPARGE_GATHER_WS_PERSIST", c.ws_persist),
        persist_ctas_("SPARGE_GATHER_WS_PERSIST_CTAS", c.persist_ctas) {}

 private:
  ScopedEnv path_, wg_, stages_, arrive_, pingpong_, prefetch_, l2pf_, pdl_, wgmma_stages_, ws_pair_, ws_persist_, persist_ctas_;
};
// Switches added 2026-11-30 session 5 (not run on a GPU when added), each with the path it must
// equal bit for bit (same keys, masks and arithmetic): SPARGE_GATHER_PREFETCH=1 (keys and mask
// words through shared memory) in the wgmma kernels (BM 64 with 2 stages, BM 64 / 128 with 3)
// and the ws kernel's noinc producer (its defaults, one consumer warpgroup, the smallest ring);
// SPARGE_GATHER_L2PF=256; SPARGE_GATHER_PDL=1 (the attention launch overlaps the union's end).
struct BitwisePair {
  PathConfig with, without;
};
const BitwisePair kBitwisePairs[] = {
    // Prefetch is the default since the H200 round of 2026-11-30 session 5: each "without" side
    // turns it off (SPARGE_GATHER_PREFETCH=0).
    {{"wgmma64 prefetch", "wgmma64", nullptr, nullptr, nullptr, nullptr, "1"}, {"wgmma64 no prefetch", "wgmma64", nullptr, nullptr, nullptr, nullptr, "0"}},
    {{"wgmma prefetch", "wgmma", nullptr, nullptr, nullptr, nullptr, "1"}, {"wgmma no prefetch", "wgmma", nullptr, nullptr, nullptr, nullptr, "0"}},
    {{"ws prefetch", "ws", nullptr, nullptr, nullptr, nullptr, "1"}, {"ws stages=5 no prefetch", "ws", nullptr, "5", nullptr, nullptr, "0"}},
    {{"ws wg=1 prefetch", "ws", "1", nullptr, nullptr, nullptr, "1"}, {"ws wg=1 stages=2 no prefetch", "ws", "1", "2", nullptr, nullptr, "0"}},
    {{"ws stages=2 prefetch", "ws", nullptr, "2", nullptr, nullptr, "1"}, {"ws stages=2 no prefetch", "ws", nullptr, "2", nullptr, nullptr, "0"}},
    // SPARGE_GATHER_L2PF=256: the .L2::256B hint on the K/V gathers (a hint: same bits).
    {{"wgmma64 prefetch L2::256B", "wgmma64", nullptr, nullptr, nullptr, nullptr, "1", "256"}, {"wgmma64 no prefetch", "wgmma64", nullptr, nullptr, nullptr, nullptr, "0"}},
    {{"wgmma prefetch L2::256B", "wgmma", nullptr, nullptr, nullptr, nullptr, "1", "256"}, {"wgmma no prefetch", "wgmma", nullptr, nullptr, nullptr, nullptr, "0"}},
    {{"wgmma64 pdl", "wgmma64", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1"}, {"wgmma64 no prefetch", "wgmma64", nullptr, nullptr, nullptr, nullptr, "0"}},
    {{"wgmma pdl", "wgmma", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1"}, {"wgmma no prefetch", "wgmma", nullptr, nullptr, nullptr, nullptr, "0"}},
    {{"ws prefetch pdl", "ws", nullptr, nullptr, nullptr, nullptr, "1", nullptr, "1"}, {"ws stages=5 no prefetch", "ws", nullptr, "5", nullptr, nullptr, "0"}},
    // SPARGE_GATHER_WGMMA_STAGES=4 (BM 128 with prefetch, three steps in flight).
    {{"wgmma stages=4", "wgmma", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "4"}, {"wgmma no prefetch", "wgmma", nullptr, nullptr, nullptr, nullptr, "0"}},
    // The persistent walk (session 27; the ws default for groups of more than 64 rows since s27r2,
    // SPARGE_GATHER_WS_PERSIST=0 turns it off): the tiles in the per-tile grid's order, so bitwise its
    // output (the "without" side, no prefetch, is always the per-tile grid); on the default grid (one
    // CTA per SM: at these sizes one tile per CTA) and on grids of 1 to 3 CTAs
    // (SPARGE_GATHER_WS_PERSIST_CTAS), which walk several tiles each (the ring, the Q buffers and the
    // turns carried across tiles), with the smallest ring and without turns; and the per-tile grid
    // with prefetch. Groups of at most 64 rows keep the per-tile kernel (one consumer warpgroup).
    {{"ws per-tile prefetch", "ws", nullptr, nullptr, nullptr, nullptr, "1", nullptr, nullptr, nullptr, nullptr, "0"}, {"ws stages=5 no prefetch", "ws", nullptr, "5", nullptr, nullptr, "0"}},
    {{"ws persist", "ws", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1"}, {"ws stages=5 no prefetch", "ws", nullptr, "5", nullptr, nullptr, "0"}},
    {{"ws persist ctas=3", "ws", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1", "3"}, {"ws stages=5 no prefetch", "ws", nullptr, "5", nullptr, nullptr, "0"}},
    {{"ws persist ctas=1 stages=2", "ws", nullptr, "2", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1", "1"}, {"ws stages=5 no prefetch", "ws", nullptr, "5", nullptr, nullptr, "0"}},
    {{"ws persist ctas=2 pingpong=0", "ws", nullptr, nullptr, nullptr, "0", nullptr, nullptr, nullptr, nullptr, nullptr, "1", "2"}, {"ws stages=5 no prefetch", "ws", nullptr, "5", nullptr, nullptr, "0"}},
};
// The warp-specialized kernel's variants (not run on a GPU when they were added): its defaults
// (BM 128 for groups of more than 64 rows, BM 64 otherwise; the most stages that fit; noinc
// arrivals; pingpong), one consumer warpgroup on large groups (4 CTAs per 256-row group), two on
// small ones (the second warpgroup's rows past the group's end), the smallest ring (2 stages:
// every stage refilled as soon as it is released), the producer's fallback completion (wait +
// fence + arrive), and the two consumer warpgroups without turns.
const PathConfig kWsPaths[] = {
    {"ws", "ws"},
    {"ws wg=1", "ws", "1"},
    {"ws wg=2", "ws", "2"},
    {"ws stages=2", "ws", nullptr, "2"},
    {"ws arrive=wait", "ws", nullptr, nullptr, "wait"},
    {"ws pingpong=0", "ws", nullptr, nullptr, nullptr, "0"},
    {"ws wg=1 stages=2 arrive=wait", "ws", "1", "2", "wait"},
    // Paired consumers (session 11): the default ring, the smallest one they take (3 stages), and
    // pingpong off; with stages=2 the request falls back to unpaired steps.
    {"ws pair=1", "ws", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1"},
    {"ws pair=1 stages=3", "ws", nullptr, "3", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1"},
    {"ws pair=1 pingpong=0", "ws", nullptr, nullptr, nullptr, "0", nullptr, nullptr, nullptr, nullptr, "1"},
    {"ws pair=1 stages=2", "ws", nullptr, "2", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1"},
};

// GATHER_GPU(...) / GATHER_GPU_KV(...): the GPU against the fp64 oracle (per-row, union at
// ur = 1, 7, 64, the mma, wgmma and ws paths with the ws variants), union == per-row within tolerance, every union-kernel
// variant bitwise equal to the default, the CPU backend agreeing with the oracle; kv layout also:
// CPU backend bitwise equal across layouts, every GPU result bitwise equal to the expanded run.
void gather_case(const GCase& c, const std::string& name, Layout layout) {
  const bool kv = layout == Layout::kv;
  const std::string pre = kv ? "kv " : "";
  const GProblem g = make_gather(c, name);
  const LayoutLists l = layout_lists(g, layout, kv ? 9 : 0);  // kv head 0's first 9 positions: empty lists
  const GOut cpu = l.run(Backend::cpu, false);
  if (kv && cpu.st.code() != StatusCode::unsupported) {
    // The CPU backend, both layouts: the same rows read the same lists in the same order.
    gather_kv::expect_bitwise(cpu, run_gather(l.problem, Backend::cpu, false), "cpu kv vs expanded");
  }
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  std::vector<double> o_ref, lse_ref, o_lp, lse_lp;
  gather_reference(l.problem, false, o_ref, lse_ref);
  gather_reference(l.problem, true, o_lp, lse_lp);
  std::vector<float> o_lpf(o_lp.begin(), o_lp.end());
  const double lowp_err = max_abs_err(o_lpf, o_ref);
  // The same launch on the expanded per-query-head lists must give the same bits (kv only).
  auto vs_expanded = [&](const GOut& out, bool uni, int ur, const std::string& what) {
    if (kv) gather_kv::expect_bitwise(out, run_gather(l.problem, Backend::cuda, uni, ur), what + " vs expanded");
  };
  const GOut per_row = l.run(Backend::cuda, false);
  check_gather(per_row, o_ref, lse_ref, lowp_err, pre + "per-row");
  vs_expanded(per_row, false, 64, pre + "per-row");
  for (int ur : {1, 7, 64}) {
    const std::string what = pre + "group_union ur=" + std::to_string(ur);
    const GOut uni = l.run(Backend::cuda, true, ur);
    check_gather(uni, o_ref, lse_ref, lowp_err, what);
    vs_expanded(uni, true, ur, what);
    // group_union == per-row up to summation order.
    std::vector<double> pr(per_row.o.begin(), per_row.o.end());
    const Error e = compare(uni.o.data(), pr.data(), pr.size());
    EXPECT_EQ(e.nonfinite_mismatch, 0) << what;
    EXPECT_LE(e.max_abs, 2.0 * lowp_err + 1e-3) << what << ": union vs per-row: " << describe(e);
    for (const char* path : {"mma", "wgmma"}) {  // default: wgmma (BM 128, prefetch) for groups >= 128 rows on sm_90
      ScopedEnv e0("SPARGE_GATHER_PATH", path);
      const GOut up = l.run(Backend::cuda, true, ur);
      check_gather(up, o_ref, lse_ref, lowp_err, what + " path=" + path);
      vs_expanded(up, true, ur, what + " path=" + path);
    }
    for (const PathConfig& pc : kWsPaths) {
      PathEnv e0(pc);
      const GOut up = l.run(Backend::cuda, true, ur);
      check_gather(up, o_ref, lse_ref, lowp_err, what + " path=" + pc.label);
      vs_expanded(up, true, ur, what + " path=" + pc.label);
    }
    // Prefetch: against the oracle and bitwise against the same path without it.
    for (const BitwisePair& pp : kBitwisePairs) {
      GOut base;
      {
        PathEnv e0(pp.without);
        base = l.run(Backend::cuda, true, ur);
      }
      PathEnv e0(pp.with);
      const GOut up = l.run(Backend::cuda, true, ur);
      check_gather(up, o_ref, lse_ref, lowp_err, what + " path=" + pp.with.label);
      gather_kv::expect_bitwise(base, up, what + " path=" + pp.with.label + " vs " + pp.without.label);
    }
    // The union kernel's variants: bitwise the default's output (same unions, same masks).
    for (const char* variant : kUnionVariants)
      for (const char* ctas : {"1", "8"})
        for (const char* mrows : {"1", "0"}) {
          ScopedEnv e0("SPARGE_GATHER_UNION_VARIANT", variant);
          ScopedEnv e1("SPARGE_GATHER_UNION_CTAS", ctas);
          ScopedEnv e2("SPARGE_GATHER_UNION_MASK_ROWS", mrows);
          gather_kv::expect_bitwise(uni, l.run(Backend::cuda, true, ur), what + " ctas=" + ctas + " mask_rows=" + mrows + " variant=" + variant);
        }
  }
  // The CPU backend (fp64) agrees with the oracle built here; the GPU with both.
  if (cpu.st.code() != StatusCode::unsupported) {
    ASSERT_TRUE(cpu.st.ok()) << cpu.st.message();
    std::vector<double> co(cpu.o.begin(), cpu.o.end()), cl(cpu.lse.begin(), cpu.lse.end());
    check_gather(per_row, co, cl, lowp_err, pre + "per-row vs cpu backend");
  }
}

// GATHER_GPU_RELAUNCH / GATHER_GPU_KV_RELAUNCH: 200 launches per-row and with the union, every
// one bitwise equal to the first. GATHER_GPU_WS_RELAUNCH: 400 launches with the union of 256-row
// groups at hd128 (the ws kernel, the sm_90 default there; union only).
void relaunch_case(const std::string& salt, Layout layout, const GCase& c = {1, 8, 2, 96, 700, 128, 128, DType::f16, true, false, 0.05, 16},
                   int runs = 200, bool union_only = false) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const LayoutLists l = layout_lists(make_gather(c, salt), layout, 0);
  for (bool uni : {false, true}) {
    if (union_only && !uni) continue;
    const GOut first = l.run(Backend::cuda, uni);
    ASSERT_TRUE(first.st.ok()) << first.st.message();
    for (int run = 1; run < runs; ++run) {
      const GOut again = l.run(Backend::cuda, uni);
      ASSERT_EQ(std::memcmp(first.o.data(), again.o.data(), first.o.size() * 4), 0) << "run " << run;
      ASSERT_EQ(std::memcmp(first.lse.data(), again.lse.data(), first.lse.size() * 4), 0) << "run " << run;
    }
  }
}

// GATHER_GPU_BADLIST / GATHER_GPU_KV_BADLIST: b = 2, Sq = 5, 4 query heads over 2 kv heads, every
// list 0, 1, 2, 3 except two bad ones; list (b, h, i) = (1, 1, 2) is the lower one in both layouts
// (row 27 of [2, 4, 5] per query head, row 17 of [2, 2, 5] per kv head), and both backends name it
// by the layout's own coordinates, with the same message, under per-row and union tiles and the
// union kernel's variants.
struct BadList { const char* what; int pos; std::int32_t value; const char* fragment; };
const BadList kBadLists[] = {
    {"index_negative", 1, -1, "indices[1, 1, 2, 1] = -1 is out of range (expected 0..6"},
    {"index_sk", 0, 7, "indices[1, 1, 2, 0] = 7 is out of range"},
    {"duplicate", 3, -2, "indices[1, 1, 2, 3] = 0 repeats an earlier entry"},
    {"counts_above_nmax", -1, 5, "counts[1, 1, 2] = 5 is out of range (expected 0..4"},
    {"counts_negative", -1, -1, "counts[1, 1, 2] = -1 is out of range"},
};

constexpr GCase kBadListCase{2, 4, 2, 5, 7, 64, 4, DType::f16, false, false, 0.0, 1};

// The lists of a bad-list case in one layout: every list 0, 1, 2, 3 (n_max 4), two of them made bad.
struct BadLists {
  std::int64_t heads = 0, lists = 0;
  std::vector<std::int32_t> idx, cnt;
};
BadLists bad_lists(const BadList& bl, Layout layout) {
  const GCase& c = kBadListCase;
  BadLists b;
  b.heads = layout == Layout::kv ? c.hk : c.hq;
  b.lists = c.b * b.heads * c.sq;
  b.idx.resize(static_cast<size_t>(b.lists * 4));
  b.cnt.assign(static_cast<size_t>(b.lists), 4);
  for (std::int64_t r = 0; r < b.lists; ++r)
    for (int t = 0; t < 4; ++t) b.idx[static_cast<size_t>(r * 4 + t)] = t;
  const std::int64_t bad[2] = {(1 * b.heads + 1) * c.sq + 2, layout == Layout::kv ? 19 : 38};  // (1, 1, 2) is reported
  for (std::int64_t r : bad) {
    if (bl.pos < 0) b.cnt[static_cast<size_t>(r)] = bl.value;
    else b.idx[static_cast<size_t>(r * 4 + bl.pos)] = bl.value == -2 ? 0 : bl.value;
  }
  return b;
}

void badlist_case(const BadList& bl, const std::string& salt, Layout layout) {
  const GProblem g = make_gather(kBadListCase, salt);
  const BadLists b = bad_lists(bl, layout);
  const std::vector<std::int32_t>& idx = b.idx;
  const std::vector<std::int32_t>& cnt = b.cnt;
  const std::int64_t heads = b.heads;
  std::vector<Backend> backends{Backend::cpu};
  if (have_gpu()) backends.push_back(Backend::cuda);
  for (Backend be : backends)
    for (const char* variant : {"0", "3", "4", "5"})
      for (bool uni : {false, true}) {
        ScopedEnv e0("SPARGE_GATHER_UNION_VARIANT", variant);
        const GOut out = run_gather(g, be, uni, 64, &idx, &cnt, heads);
        EXPECT_EQ(out.st.code(), StatusCode::invalid_argument) << "variant=" << variant << " union=" << uni;
        EXPECT_NE(out.st.message().find(bl.fragment), std::string::npos) << out.st.message();
      }
  if (!have_gpu()) GTEST_SKIP() << "no GPU (CPU backend checked)";
}

// GATHER_GPU_UNCHECKED_BADLIST / GATHER_GPU_KV_UNCHECKED_BADLIST: the same bad lists with
// check_lists = false: the call succeeds and its output is bitwise that of the checked call on the
// lists' trusted reading (counts clamped into [0, n_max], indices outside [0, Sk) skipped, a repeated
// key once), under per-row and union tiles and the union kernel's variants; the output guards hold.
void unchecked_badlist_case(const BadList& bl, const std::string& salt, Layout layout) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const GCase& c = kBadListCase;
  const GProblem g = make_gather(c, salt);
  const BadLists b = bad_lists(bl, layout);
  const std::vector<std::int32_t>& idx = b.idx;
  const std::vector<std::int32_t>& cnt = b.cnt;
  const std::int64_t heads = b.heads, lists = b.lists;
  std::vector<std::int32_t> sidx(idx.size(), -1), scnt(cnt.size(), 0);
  for (std::int64_t r = 0; r < lists; ++r) {
    const int n = std::clamp(cnt[static_cast<size_t>(r)], 0, c.n_max);
    std::vector<char> seen(static_cast<size_t>(c.sk), 0);
    for (int t = 0; t < n; ++t) {
      const std::int32_t j = idx[static_cast<size_t>(r * 4 + t)];
      if (j < 0 || j >= c.sk || seen[static_cast<size_t>(j)] != 0) continue;
      seen[static_cast<size_t>(j)] = 1;
      sidx[static_cast<size_t>(r * 4 + scnt[static_cast<size_t>(r)]++)] = j;
    }
  }
  for (const char* variant : {"0", "5"})
    for (bool uni : {false, true}) {
      ScopedEnv e0("SPARGE_GATHER_UNION_VARIANT", variant);
      const std::string what = std::string("variant=") + variant + " union=" + (uni ? "1" : "0");
      const GOut trusted = run_gather(g, Backend::cuda, uni, 64, &sidx, &scnt, heads, true);
      const GOut out = run_gather(g, Backend::cuda, uni, 64, &idx, &cnt, heads, false);
      gather_kv::expect_bitwise(trusted, out, what + ": unchecked bad lists vs checked trusted reading");
      const GOut checked = run_gather(g, Backend::cuda, uni, 64, &idx, &cnt, heads, true);
      EXPECT_EQ(checked.st.code(), StatusCode::invalid_argument) << what;
    }
}

// GATHER_GPU_GRAPH: gather_attention with check_lists = false captured in a CUDA graph on a stream
// of its own (global capture mode) and replayed: bitwise the checked direct call's output, every
// replay, with the output poisoned before each. A checked call on the capturing stream is refused
// with a message naming check_lists, and nothing of it lands in the graph.
void graph_case(Layout layout) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const GCase c{1, 8, 2, 130, 4096, 128, 512, DType::f16, false, false, 0.05, 64, 0.02};
  const LayoutLists l = layout_lists(make_gather(c, "GATHER_GPU_GRAPH"), layout, 0);
  const GOut ref = l.run(Backend::cuda, true);
  ASSERT_TRUE(ref.st.ok()) << ref.st.message();
  const GProblem& g = l.problem;
  const bool kv = layout == Layout::kv;
  const std::vector<std::int32_t>& idx = kv ? l.kv.idx : g.idx;
  const std::vector<std::int32_t>& cnt = kv ? l.kv.counts : g.counts;
  const std::int64_t lh = kv ? c.hk : c.hq;
  DeviceGather dg(g, idx, cnt, lh, c.t);
  auto& o = dg.o;
  auto& lse = dg.lse;
  GatherAttentionParams& p = dg.p;
  cudaStream_t s = nullptr;
  SPARGE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  p.group_union = true;
  p.exec = Exec{Backend::cuda, s, 0};
  auto poison = [&] {
    o.upload(std::vector<unsigned char>(o.size(), 0xff));  // f16 0xffff: NaN
    lse.poison();
  };
  auto expect_ref = [&](const std::string& what) {
    SPARGE_CUDA_CHECK(cudaStreamSynchronize(s));
    const std::vector<unsigned char> raw = o.download();
    std::vector<float> of(g.q.size());
    for (size_t i = 0; i < of.size(); ++i) of[i] = load_as_float(raw.data(), c.t, static_cast<std::int64_t>(i));
    const std::vector<float> lf = lse.download();
    EXPECT_EQ(std::memcmp(of.data(), ref.o.data(), of.size() * 4), 0) << what << ": O differs from the checked call";
    EXPECT_EQ(std::memcmp(lf.data(), ref.lse.data(), lf.size() * 4), 0) << what << ": LSE differs from the checked call";
    EXPECT_TRUE(o.guards_intact() && lse.guards_intact()) << what << ": output guard overwritten";
  };
  // Direct, unchecked, on the stream.
  poison();
  p.check_lists = false;
  ASSERT_TRUE(gather_attention(p).ok());
  expect_ref("direct unchecked");
  // Captured.
  cudaGraph_t graph = nullptr;
  SPARGE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  p.check_lists = true;
  const Status refused = gather_attention(p);
  p.check_lists = false;
  const Status captured = gather_attention(p);
  SPARGE_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  EXPECT_EQ(refused.code(), StatusCode::invalid_argument);
  EXPECT_NE(refused.message().find("check_lists = true on a stream that is being captured"), std::string::npos) << refused.message();
  ASSERT_TRUE(captured.ok()) << captured.message();
  cudaGraphExec_t exec = nullptr;
  SPARGE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    poison();
    SPARGE_CUDA_CHECK(cudaGraphLaunch(exec, s));
    expect_ref("graph replay " + std::to_string(replay));
  }
  SPARGE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SPARGE_CUDA_CHECK(cudaGraphDestroy(graph));
  SPARGE_CUDA_CHECK(cudaStreamDestroy(s));
}

SPARGE_CASES(GatherGpu) {
  const GCase shapes[] = {
      {1, 4, 4, 37, 300, 64, 64, DType::f16, false, false, 0.1, 1},
      {2, 8, 2, 113, 203, 128, 96, DType::f16, true, false, 0.1, 8},
      {2, 8, 2, 113, 203, 128, 96, DType::bf16, true, true, 0.1, 8},
      {1, 8, 1, 130, 1000, 128, 256, DType::bf16, false, false, 0.05, 64},
      {1, 4, 2, 200, 150, 64, 150, DType::f16, true, true, 0.0, 16},   // k = Sk: every key
      {1, 6, 3, 64, 40, 128, 8, DType::f16, true, false, 0.0, 1},      // Sq > Sk: early rows see nothing
      {1, 16, 4, 128, 2048, 128, 512, DType::f16, false, false, 0.02, 64},
  };
  for (const GCase& c : shapes) {
    const std::string name = gname("GATHER_GPU", c);
    cases.push_back({name, [c, name] { gather_case(c, name, Layout::q); }});
  }
  cases.push_back({"GATHER_GPU_RELAUNCH(runs=200x2,per_row+union)", [] { relaunch_case("GATHER_GPU_RELAUNCH", Layout::q); }});
  // The ws kernel (hd128, 256-row groups; a 2-position tail group): per-query-head lists (masked
  // steps) and per-kv-head lists (every warp's masks full), 400 launches each.
  for (Layout layout : {Layout::q, Layout::kv}) {
    const GCase c{1, 8, 2, 130, 4096, 128, 512, DType::f16, false, false, 0.05, 64, 0.02};
    const std::string name = std::string("GATHER_GPU_WS_RELAUNCH(runs=400,union,") + (layout == Layout::kv ? "kv" : "q") + "_lists)";
    cases.push_back({name, [c, layout] { relaunch_case("GATHER_GPU_WS_RELAUNCH", layout, c, 400, true); }});
  }
  {  // The persistent ws walk (the default since session 27) on 3 CTAs: hd128, 256-row groups
     // with a 2-position tail group (11 tiles: the tail groups' second row tiles hold no rows),
     // 400 launches, per-query-head lists (masked steps).
    const GCase c{1, 8, 2, 130, 4096, 128, 512, DType::f16, false, false, 0.05, 64, 0.02};
    cases.push_back({"GATHER_GPU_WS_RELAUNCH(runs=400,union,q_lists,persist_ctas=3)", [c] {
                       ScopedEnv e0("SPARGE_GATHER_WS_PERSIST", "1");
                       ScopedEnv e1("SPARGE_GATHER_WS_PERSIST_CTAS", "3");
                       relaunch_case("GATHER_GPU_WS_RELAUNCH", Layout::q, c, 400, true);
                     }});
  }
  {  // The ws kernel at hd64 (its default since session 12), 400 launches, per-kv-head lists.
    const GCase c{1, 8, 2, 130, 4096, 64, 512, DType::f16, false, false, 0.05, 64, 0.02};
    cases.push_back({"GATHER_GPU_WS_RELAUNCH(runs=400,union,kv_lists,hd64)", [c] { relaunch_case("GATHER_GPU_WS_RELAUNCH_HD64", Layout::kv, c, 400, true); }});
  }
  // GATHER_GPU_WS_SMALL: one 160-row group at hd128 (two 128-row tiles, the second with 32 rows):
  // the default (ws on sm_90) against the fp64 oracle with O in Q's dtype (the staged epilogue) and
  // in f32 (the register epilogue), both list layouts, paired consumers too. Small enough for the
  // sanitizers (racecheck / synccheck on the warpgroup barriers of the staged epilogue).
  for (bool f32 : {false, true}) {
    const GCase c{1, 4, 1, 40, 600, 128, 96, DType::f16, false, f32, 0.1, 32, 0.1};
    cases.push_back({gname("GATHER_GPU_WS_SMALL", c), [c] {
                       if (!have_gpu()) GTEST_SKIP() << "no GPU";
                       const GProblem g = make_gather(c, "GATHER_GPU_WS_SMALL");
                       for (Layout layout : {Layout::q, Layout::kv}) {
                         const LayoutLists l = layout_lists(g, layout, 0);
                         std::vector<double> o_ref, lse_ref, o_lp, lse_lp;
                         gather_reference(l.problem, false, o_ref, lse_ref);
                         gather_reference(l.problem, true, o_lp, lse_lp);
                         std::vector<float> o_lpf(o_lp.begin(), o_lp.end());
                         const double lowp_err = max_abs_err(o_lpf, o_ref);
                         const std::string what = layout == Layout::kv ? "kv" : "q";
                         check_gather(l.run(Backend::cuda, true), o_ref, lse_ref, lowp_err, what + " default");
                         ScopedEnv e0("SPARGE_GATHER_WS_PAIR", "1");
                         check_gather(l.run(Backend::cuda, true), o_ref, lse_ref, lowp_err, what + " pair=1");
                       }
                     }});
  }
  for (const BadList& bl : kBadLists) {
    cases.push_back({Name("GATHER_GPU_BADLIST")("what", bl.what), [bl] { badlist_case(bl, "GATHER_GPU_BADLIST", Layout::q); }});
    for (Layout layout : {Layout::q, Layout::kv}) {
      const char* op = layout == Layout::kv ? "GATHER_GPU_KV_UNCHECKED_BADLIST" : "GATHER_GPU_UNCHECKED_BADLIST";
      cases.push_back({Name(op)("what", bl.what), [bl, layout, op] { unchecked_badlist_case(bl, op, layout); }});
    }
  }
  cases.push_back({"GATHER_GPU_GRAPH(q_lists)", [] { graph_case(Layout::q); }});
  cases.push_back({"GATHER_GPU_GRAPH(kv_lists)", [] { graph_case(Layout::kv); }});
  // PERF.md: hd128, 2048 keys per row, 64-row groups. TFLOPS counted on attended keys
  // (4 * D * sum(counts)); the union overlap (union size / sum of list sizes per group) is measured
  // on the host from the same lists.
  for (double swap : {0.0, 0.01, 0.1}) {
  const std::string perf_name = Name("GATHER_GPU_PERF")("b", 1)("hq", 32)("hk", 8)("sq", 1024)("sk", 16384)("d", 128)("keys", 2048)("dtype", "f16")("union_rows", 64)("swap", swap);
  cases.push_back({perf_name, [swap, perf_name] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     const GCase c{1, 32, 8, 1024, 16384, 128, 2048, DType::f16, false, false, -1.0, 64, swap};
                     GProblem g = make_gather(c, perf_name);
                     // Union overlap per (kv head, 64 positions) group.
                     double sum_lists = 0, sum_union = 0;
                     const std::int64_t grp = c.hq / c.hk;
                     for (std::int64_t hk = 0; hk < c.hk; ++hk)
                       for (std::int64_t i0 = 0; i0 < c.sq; i0 += 64) {
                         std::vector<char> seen(static_cast<size_t>(c.sk), 0);
                         for (std::int64_t h = hk * grp; h < (hk + 1) * grp; ++h)
                           for (std::int64_t i = i0; i < std::min(i0 + 64, c.sq); ++i) {
                             const std::int64_t row = h * c.sq + i;
                             for (int t = 0; t < 2048; ++t) {
                               char& f = seen[static_cast<size_t>(g.idx[static_cast<size_t>(row * c.n_max + t)])];
                               sum_union += f == 0;
                               f = 1;
                             }
                             sum_lists += 2048;
                           }
                       }
                     DeviceGather dg(g, g.idx, g.counts, c.hq, c.t, false);
                     GatherAttentionParams& p = dg.p;
                     const double flops = 4.0 * c.d * 2048.0 * static_cast<double>(c.b * c.hq * c.sq);
                     for (bool uni : {false, true}) {
                       p.group_union = uni;
                       p.union_rows = 64;
                       std::vector<float> ms;
                       ASSERT_NO_FATAL_FAILURE(time_gather(p, 13, &ms));
                       const double med = ms[ms.size() / 2];
                       std::printf("[perf] gather hd128 keys=2048 group_union=%d: median %.3f ms (min %.3f max %.3f), %.1f TFLOPS on attended keys; "
                                   "swap=%.2f union overlap (union / sum of lists per 64-row group) = %.4f\n",
                                   uni, med, ms.front(), ms.back(), flops / (med * 1e-3) / 1e12, swap, sum_union / sum_lists);
                     }
                   }});
  }
}


// ---- topk_select: the two-pass kernel's candidate buffer (src/cuda/topk/two_pass.cuh) ---------
// The kernel keeps the keys of the top-digit bucket holding the k-th value in shared memory
// (kCap = 4096 of them) and falls back to more passes over the row when the bucket is larger.
// These rows put the bucket at, just under and just over that size, make it huge (ties, narrow
// value ranges, all-equal rows), make the strong list long (large k: the in-place merge walks many
// chunks) and cover N = 1, k = 1, k = N and N not a multiple of the vector width. Every result is
// compared with the CPU backend, for each kernel variant (SPARGE_TOPK_VARIANT, read per call).
namespace topk_stress {

// A row: `strong` values above the bucket, `bucket` values inside one top-digit bin of the key
// (1 + j/1024, exact in f16 and f32, 200 distinct), the rest below; positions shuffled.
std::vector<float> bucket_rows(std::int64_t r, std::int64_t n, std::int64_t strong, std::int64_t bucket, std::mt19937_64& rng) {
  std::vector<float> s(static_cast<size_t>(r * n));
  for (std::int64_t i = 0; i < r; ++i) {
    std::vector<float> row(static_cast<size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) {
      if (j < strong) row[static_cast<size_t>(j)] = 4.0f + static_cast<float>(j % 50) * 0.125f;
      else if (j < strong + bucket) row[static_cast<size_t>(j)] = 1.0f + static_cast<float>(rng() % 200) / 1024.0f;
      else row[static_cast<size_t>(j)] = -2.0f + static_cast<float>(rng() % 100) / 64.0f;
    }
    std::shuffle(row.begin(), row.end(), rng);
    std::copy(row.begin(), row.end(), s.begin() + i * n);
  }
  return s;
}

enum class Fill {
  normal, all_equal, all_zero_signed, narrow, heavy_tie, single_neg_inf, mostly_neg_inf, sample_trap, keep_trap,
  cluster4000, cluster6000
};

std::vector<float> fill_rows(Fill f, std::int64_t r, std::int64_t n, std::mt19937_64& rng) {
  std::vector<float> s(static_cast<size_t>(r * n));
  fill_normal(s, rng);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (size_t i = 0; i < s.size(); ++i) {
    float& x = s[i];
    switch (f) {
      case Fill::normal: break;
      case Fill::all_equal: x = 3.0f; break;
      case Fill::all_zero_signed: x = u(rng) < 0.5f ? 0.0f : -0.0f; break;
      case Fill::narrow: x = 0.5f + u(rng) * 0.01f; break;  // one top-digit bin, many low digits
      case Fill::heavy_tie: x = u(rng) < 0.6f ? 1.0f : x - 3.0f; break;  // 60% one value, the k-th
      case Fill::single_neg_inf: x = (i % 3 == 0) ? -INFINITY : x; break;
      case Fill::mostly_neg_inf: x = (i % 100 != 0) ? -INFINITY : x; break;  // 1% selectable
      case Fill::sample_trap: {
        // The histogram pass's sample reads columns t * n / 256 + [0, 4) (two_pass.cuh,
        // sample_lowest_digit); with n % 256 == 0 these are the columns j with j % (n / 256) < 4.
        // Large values exactly there make the sample overrate the row: with k > 1024 the k-th
        // score lies below the sampled digit and the kernel must redo the pass counting every key.
        const auto j = static_cast<std::int64_t>(i) % n;
        if (n % 256 == 0 && j % (n / 256) < 4) x = 100.0f + static_cast<float>(j % 7);
      } break;
      case Fill::keep_trap: {
        // The one-pass kernel's sample reads the 8 columns from (g * n / 512) & ~7, g < 512
        // (one_pass.cuh, keep_threshold); with n / 512 a multiple of 8 these are the columns j with
        // j % (n / 512) < 8. Large values in the first 2 of them make the sample set its threshold
        // among them, so that fewer than k keys are kept (k > n / 256) and the row must fall back.
        const auto j = static_cast<std::int64_t>(i) % n;
        if (n % 4096 == 0 && j % (n / 512) < 2) x = 100.0f + static_cast<float>(j % 7);
      } break;
      case Fill::cluster4000:
      case Fill::cluster6000: {
        // The largest scores in one run of columns inside one warp's eighth of the row (n = 131072:
        // [65536, 81920) for warp 4): its kept list takes most segments (4000), or more than all of
        // them (6000: the keep overflows and the row falls back).
        const auto j = static_cast<std::int64_t>(i) % n;
        const std::int64_t len = f == Fill::cluster4000 ? 4000 : 6000;
        if (j >= 70000 && j < 70000 + len) x += 5.0f;
      } break;
    }
  }
  return s;
}

const char* fill_name(Fill f) {
  switch (f) {
    case Fill::normal: return "normal";
    case Fill::all_equal: return "allequal";
    case Fill::all_zero_signed: return "allzero";
    case Fill::narrow: return "narrow";
    case Fill::heavy_tie: return "heavytie";
    case Fill::single_neg_inf: return "neginf33";
    case Fill::mostly_neg_inf: return "neginf99";
    case Fill::sample_trap: return "sampletrap";
    case Fill::keep_trap: return "keeptrap";
    case Fill::cluster4000: return "cluster4000";
    case Fill::cluster6000: return "cluster6000";
  }
  return "?";
}

// Runs the CPU backend once and the GPU under each variant (the environment is restored).
void expect_all_variants(const std::vector<float>& s, std::int64_t r, std::int64_t n, int k, DType t, std::int64_t cs = 1) {
  const auto cpu = run_topk(Backend::cpu, s, r, n, k, t, cs);
  for (const char* v : {"0", "1", "4", "5", "6"}) {
    ::setenv("SPARGE_TOPK_VARIANT", v, 1);
    const auto gpu = run_topk(Backend::cuda, s, r, n, k, t, cs);
    ::unsetenv("SPARGE_TOPK_VARIANT");
    SCOPED_TRACE(std::string("SPARGE_TOPK_VARIANT=") + v);
    expect_same_lists(cpu, gpu, k);
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
  }
}

}  // namespace topk_stress

SPARGE_CASES(TopkGpuStress) {
  using namespace topk_stress;
  // The bucket around the kCap = 4096 boundary (fits / overflows into a second row pass), T inside
  // it (k - strong = 1000) or at its smallest value (k = strong + bucket).
  for (std::int64_t bucket : {std::int64_t{4095}, std::int64_t{4096}, std::int64_t{4097}, std::int64_t{9000}}) {
    for (bool t_at_bottom : {false, true}) {
      for (DType t : {DType::f32, DType::f16}) {
        const std::int64_t r = 6, n = 20011, strong = 300;
        const int k = static_cast<int>(t_at_bottom ? strong + bucket : strong + 1000);
        const std::string name = Name("TOPK_GPU_CAND")("r", r)("n", n)("k", k)("bucket", bucket)("dtype", to_string(t));
        cases.push_back({name, [=] {
                           if (!have_gpu()) GTEST_SKIP() << "no GPU";
                           auto rng = rng_for(name);
                           expect_all_variants(bucket_rows(r, n, strong, bucket, rng), r, n, k, t);
                         }});
      }
    }
  }
  struct Shape { std::int64_t r, n; int k; Fill fill; std::int64_t cs; };
  const Shape shapes[] = {
      {4, 50000, 2048, Fill::heavy_tie, 1},  // bucket = one value, 30000 ties: three row passes
      {4, 50000, 2048, Fill::narrow, 1},     // bucket spans the low digits
      {4, 10000, 777, Fill::all_equal, 1},   {3, 10000, 10000, Fill::all_equal, 1},
      {4, 9001, 333, Fill::all_zero_signed, 1},
      {4, 65536, 60000, Fill::normal, 1},    // long strong list: the in-place merge walks ~230 chunks
      {4, 4099, 4099, Fill::normal, 1},      {4, 4099, 1, Fill::normal, 1},  // N % 8 != 0, k = N, k = 1
      {4, 131071, 2048, Fill::normal, 1},    {4, 8191, 4096, Fill::narrow, 1},
      {5, 1, 1, Fill::normal, 1},            {3, 1, 1, Fill::single_neg_inf, 1},  // N = 1 (row 0: -inf)
      {3, 7, 7, Fill::single_neg_inf, 1},    {6, 30000, 5000, Fill::single_neg_inf, 1},
      {3, 20000, 1500, Fill::heavy_tie, 3},  // strided rows through the scalar path, bucket overflow
      {3, 20000, 1500, Fill::narrow, 5},
      // The sample filter of the histogram pass (rows >= 16384): the sample misleads it (k = 2048:
      // the pass is repeated counting every key; k = 1000: the sampled values are the answer,
      // with ties), fewer than k selectable scores behind a filter at the bin of -inf, strided.
      {3, 65536, 2048, Fill::sample_trap, 1},  {3, 65536, 1000, Fill::sample_trap, 1},
      {3, 65536, 2048, Fill::sample_trap, 3},  {4, 40000, 1000, Fill::mostly_neg_inf, 1},
      {4, 40000, 300, Fill::mostly_neg_inf, 1},
      // The one-pass kernel (variant 0): a sample that keeps too few keys (fallback) or only the
      // planted ones (the answer among them, with ties), the kept keys crowded into one warp's list
      // (fits) or overflowing every segment (fallback), rows kept whole (n <= 5120) with k < n and
      // -inf, strided rows through the kept lists.
      {3, 65536, 2500, Fill::keep_trap, 1},     {3, 65536, 100, Fill::keep_trap, 1},
      {3, 131072, 2048, Fill::cluster4000, 1},  {3, 131072, 2048, Fill::cluster6000, 1},
      {3, 131072, 2048, Fill::cluster4000, 3},  {4, 5120, 700, Fill::single_neg_inf, 1},
      {4, 5120, 5120, Fill::heavy_tie, 1},      {4, 5121, 2000, Fill::normal, 1},
  };
  for (const Shape& sh : shapes) {
    for (DType t : {DType::f32, DType::f16}) {
      const std::string name = Name("TOPK_GPU_STRESS")("r", sh.r)("n", sh.n)("k", sh.k)("scores", fill_name(sh.fill))("dtype", to_string(t))("cs", sh.cs);
      cases.push_back({name, [sh, t, name] {
                         if (!have_gpu()) GTEST_SKIP() << "no GPU";
                         auto rng = rng_for(name);
                         expect_all_variants(fill_rows(sh.fill, sh.r, sh.n, rng), sh.r, sh.n, sh.k, t, sh.cs);
                       }});
    }
  }
}

// ---- gather_attention: long lists, every attention path and union-kernel path ------------------
// 2048-key lists (hd128 and hd64, union on and off, counts and union sizes that are not multiples
// of the 64-position step, a tail group cut off by Sq), each result checked against the fp64
// oracle under every SPARGE_GATHER_PATH, and the union kernel's phase-B variants (one CTA per
// group / clusters; shared-memory mask batches of a few rows; global atomics) via its env knobs.
namespace gather_long {


// Every attention path; the ws variants after the established paths.
std::vector<PathConfig> all_paths() {
  std::vector<PathConfig> v = {{"default", nullptr}, {"mma", "mma"},         {"mma64", "mma64"},    {"mma128", "mma128"},
                               {"wgmma", "wgmma"},  {"wgmma256", "wgmma256"}, {"wgmma64", "wgmma64"}};
  v.insert(v.end(), std::begin(kWsPaths), std::end(kWsPaths));
  for (const BitwisePair& pp : kBitwisePairs) v.push_back(pp.with);
  return v;
}

}  // namespace gather_long

SPARGE_CASES(GatherGpuLong) {
  using namespace gather_long;
  const GCase shapes[] = {
      // hd128, 2048 keys, 4 heads per kv head x 64 positions = 256-row groups, Sq = 130: a
      // 2-position tail group; counts in [1024, 2048], 5% empty rows, rows swap 2% of the keys.
      {1, 8, 2, 130, 4096, 128, 2048, DType::f16, false, false, 0.05, 64, 0.02},
      // hd64 bf16, causal, f32 output, n_max = 2000 (union sizes not multiples of 64).
      {1, 8, 2, 100, 3000, 64, 2000, DType::bf16, true, true, 0.05, 32, 0.05},
      // n_max = 2046: not a multiple of 4, the union kernel's scalar list loads.
      {1, 4, 1, 70, 2500, 128, 2046, DType::f16, false, false, 0.0, 16, 0.1},
      // every row lists the same 2048 keys: every mask word full (the unmasked softmax branch).
      {1, 8, 2, 128, 4096, 128, 2048, DType::f16, false, false, -1.0, 64, 0.0},
  };
  for (const GCase& c : shapes) {
    const std::string name = gname("GATHER_GPU_LONG", c) + "_swap" + std::to_string(c.swap);
    cases.push_back({name, [c, name] {
                       if (!have_gpu()) GTEST_SKIP() << "no GPU";
                       const GProblem g = make_gather(c, name);
                       std::vector<double> o_ref, lse_ref, o_lp, lse_lp;
                       gather_reference(g, false, o_ref, lse_ref);
                       gather_reference(g, true, o_lp, lse_lp);
                       std::vector<float> o_lpf(o_lp.begin(), o_lp.end());
                       const double lowp_err = max_abs_err(o_lpf, o_ref);
                       for (const PathConfig& pc : all_paths()) {
                         PathEnv env(pc);
                         const std::string tag = std::string("path=") + pc.label;
                         check_gather(run_gather(g, Backend::cuda, false), o_ref, lse_ref, lowp_err, tag + " per-row");
                         for (int ur : {64, 7}) {
                           check_gather(run_gather(g, Backend::cuda, true, ur), o_ref, lse_ref, lowp_err,
                                        tag + " group_union ur=" + std::to_string(ur));
                         }
                       }
                       // The union kernel's variants (default attention path).
                       // SPARGE_GATHER_UNION_VARIANT: 0 = the per-list loop with rank + popcount, 1 =
                       // streamed batches, 2 = the position map alone, 3 = both (two reads of the
                       // lists); 4 = per-list bitmaps + ballot masks (one read), 5 = that with streamed
                       // batches (the default), 6 / 7 = 4 / 5 (the position map bit is unused there).
                       // mask_rows only matters to the two-read variants (0..3).
                       struct Knob { const char* ctas; const char* mask_rows; const char* overlap; const char* variant; };
                       for (const Knob k : {Knob{"1", nullptr, nullptr, nullptr}, Knob{"2", nullptr, nullptr, nullptr}, Knob{nullptr, "3", nullptr, "3"},
                                            Knob{nullptr, "0", nullptr, "3"}, Knob{"1", "5", nullptr, "3"}, Knob{nullptr, nullptr, "3", nullptr},
                                            Knob{"1", nullptr, "5", nullptr}, Knob{nullptr, nullptr, nullptr, "0"}, Knob{nullptr, nullptr, nullptr, "1"},
                                            Knob{"1", "3", nullptr, "2"}, Knob{"2", "5", nullptr, "1"}, Knob{nullptr, "0", nullptr, "1"},
                                            Knob{nullptr, nullptr, nullptr, "3"}, Knob{"1", nullptr, nullptr, "4"}, Knob{"8", nullptr, nullptr, "4"},
                                            Knob{"2", nullptr, nullptr, "7"}, Knob{"1", nullptr, "3", "3"}}) {
                         ScopedEnv e1("SPARGE_GATHER_UNION_CTAS", k.ctas);
                         ScopedEnv e2("SPARGE_GATHER_UNION_MASK_ROWS", k.mask_rows);
                         ScopedEnv e3("SPARGE_GATHER_OVERLAP", k.overlap);
                         ScopedEnv e4("SPARGE_GATHER_UNION_VARIANT", k.variant);
                         const std::string tag = std::string("ctas=") + (k.ctas ? k.ctas : "auto") +
                                                 " mask_rows=" + (k.mask_rows ? k.mask_rows : "auto") +
                                                 " overlap=" + (k.overlap ? k.overlap : "off") + " variant=" + (k.variant ? k.variant : "5");
                         check_gather(run_gather(g, Backend::cuda, true, 64), o_ref, lse_ref, lowp_err, tag + " ur=64");
                         check_gather(run_gather(g, Backend::cuda, true, 7), o_ref, lse_ref, lowp_err, tag + " ur=7");
                       }
                       // Prefetch paths bitwise equal to the same path without prefetch.
                       for (const BitwisePair& pp : kBitwisePairs) {
                         for (int ur : {64, 7}) {
                           GOut base;
                           {
                             PathEnv env(pp.without);
                             base = run_gather(g, Backend::cuda, true, ur);
                           }
                           PathEnv env(pp.with);
                           gather_kv::expect_bitwise(base, run_gather(g, Backend::cuda, true, ur),
                                                     std::string(pp.with.label) + " vs " + pp.without.label + " ur=" + std::to_string(ur));
                         }
                       }
                     }});
  }
  // Bitwise determinism over relaunches, per attention path and union-kernel variant.
  cases.push_back({"GATHER_GPU_LONG_RELAUNCH(runs=20,paths+union_ctas)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     const GCase c{1, 8, 2, 96, 4096, 128, 2048, DType::f16, true, false, 0.05, 32, 0.05};
                     const GProblem g = make_gather(c, "GATHER_GPU_LONG_RELAUNCH");
                     for (const PathConfig& pc : all_paths()) {
                       for (const char* ctas : {"1", "8", "overlap"}) {
                         PathEnv env(pc);
                         const char* path = pc.label;
                         const bool ov = std::strcmp(ctas, "overlap") == 0;
                         ScopedEnv e1("SPARGE_GATHER_UNION_CTAS", ov ? nullptr : ctas);
                         ScopedEnv e3("SPARGE_GATHER_OVERLAP", ov ? "4" : nullptr);
                         SCOPED_TRACE(std::string("path=") + path + " ctas=" + ctas);
                         for (bool uni : {false, true}) {
                           const GOut first = run_gather(g, Backend::cuda, uni);
                           ASSERT_TRUE(first.st.ok()) << first.st.message();
                           for (int run = 1; run < 20; ++run) {
                             const GOut again = run_gather(g, Backend::cuda, uni);
                             ASSERT_EQ(std::memcmp(first.o.data(), again.o.data(), first.o.size() * 4), 0) << "run " << run;
                             ASSERT_EQ(std::memcmp(first.lse.data(), again.lse.data(), first.lse.size() * 4), 0) << "run " << run;
                           }
                         }
                       }
                     }
                   }});
  // Bad lists reported exactly under every union-kernel variant (cluster rows split over CTAs).
  cases.push_back({"GATHER_GPU_LONG_BADLIST(union_variants)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     const GCase c{1, 8, 2, 40, 3000, 64, 256, DType::f16, false, false, -1.0, 8, 0.0};  // every row full
                     GProblem g = make_gather(c, "GATHER_GPU_LONG_BADLIST");
                     // Row (0, 5, 33) = linear 5 * 40 + 33 = 233 lists key g.idx[t=0] again at t = 100.
                     const std::int64_t row = 5 * 40 + 33;
                     g.counts[static_cast<size_t>(row)] = 256;
                     const std::int32_t dup = g.idx[static_cast<size_t>(row * 256)];
                     g.idx[static_cast<size_t>(row * 256 + 100)] = dup;
                     const std::string want = "indices[0, 5, 33, 100] = " + std::to_string(dup) + " repeats an earlier entry";
                     for (const char* variant : kUnionVariants)
                     for (const char* ctas : {"1", "2", "8"}) {
                       for (const char* mr : {static_cast<const char*>(nullptr), "0", "3"}) {
                         ScopedEnv e0("SPARGE_GATHER_UNION_VARIANT", variant);
                         ScopedEnv e1("SPARGE_GATHER_UNION_CTAS", ctas);
                         ScopedEnv e2("SPARGE_GATHER_UNION_MASK_ROWS", mr);
                         for (bool uni : {false, true}) {
                           const GOut out = run_gather(g, Backend::cuda, uni, 16);
                           EXPECT_EQ(out.st.code(), StatusCode::invalid_argument) << "ctas=" << ctas << " variant=" << variant;
                           EXPECT_NE(out.st.message().find(want), std::string::npos) << out.st.message();
                         }
                       }
                     }
                   }});
  // Sk = 20000: 625 bitmap words, two per thread of the rank scan, with the group split over a
  // cluster (CTA ranks > 0 rank their words too; before 2026-11-30 s3 only CTA 0 advanced its
  // position past its first word), under each union variant (the position map: Sk <= 32768).
  cases.push_back({"GATHER_GPU_LONG_WIDE_SK(sk=20000,union_variants,ctas,mask_rows)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     const GCase c{1, 8, 2, 64, 20000, 64, 512, DType::f16, false, false, 0.0, 64, 0.3};
                     const GProblem g = make_gather(c, "GATHER_GPU_LONG_WIDE_SK");
                     std::vector<double> o_ref, lse_ref, o_lp, lse_lp;
                     gather_reference(g, false, o_ref, lse_ref);
                     gather_reference(g, true, o_lp, lse_lp);
                     std::vector<float> o_lpf(o_lp.begin(), o_lp.end());
                     const double lowp_err = max_abs_err(o_lpf, o_ref);
                     const GOut first = run_gather(g, Backend::cuda, true, 64);
                     check_gather(first, o_ref, lse_ref, lowp_err, "default");
                     // mask_rows 3: small enough mask batches for the position map to fit (at the
                     // default batch size it exceeds the map's shared-memory cap at this Sk).
                     // (ur = 64: 256 lists per group, too many 2.5 KB list bitmaps for kRowBitmaps at
                     // any cluster size, so variants 4..7 take the two-read path here.)
                     for (const char* variant : kUnionVariants)
                       for (const char* ctas : {"1", "2", "8"})
                       for (const char* mr : {static_cast<const char*>(nullptr), "3"}) {
                         ScopedEnv e0("SPARGE_GATHER_UNION_VARIANT", variant);
                         ScopedEnv e1("SPARGE_GATHER_UNION_CTAS", ctas);
                         ScopedEnv e2("SPARGE_GATHER_UNION_MASK_ROWS", mr);
                         const std::string tag = std::string("variant=") + variant + " ctas=" + ctas + " mask_rows=" + (mr ? mr : "auto");
                         const GOut out = run_gather(g, Backend::cuda, true, 64);
                         check_gather(out, o_ref, lse_ref, lowp_err, tag);
                         ASSERT_TRUE(out.st.ok()) << tag;
                         EXPECT_EQ(std::memcmp(first.o.data(), out.o.data(), first.o.size() * 4), 0) << tag << ": O differs from the default";
                         EXPECT_EQ(std::memcmp(first.lse.data(), out.lse.data(), first.lse.size() * 4), 0) << tag << ": LSE differs";
                       }
                     // ur = 16: 64 lists per group; clusters of 4 or 8 CTAs keep 16 / 8 list bitmaps of
                     // 625 words each, so kRowBitmaps runs with two bitmap words per thread in the OR
                     // and the rank scan. Every variant bitwise equal to the two-read variant 3.
                     GOut first16;
                     {
                       ScopedEnv e0("SPARGE_GATHER_UNION_VARIANT", "3");
                       first16 = run_gather(g, Backend::cuda, true, 16);
                       check_gather(first16, o_ref, lse_ref, lowp_err, "ur=16 variant=3");
                     }
                     for (const char* variant : kUnionVariants)
                       for (const char* ctas : {"1", "2", "4", "8"}) {
                         ScopedEnv e0("SPARGE_GATHER_UNION_VARIANT", variant);
                         ScopedEnv e1("SPARGE_GATHER_UNION_CTAS", ctas);
                         const std::string tag = std::string("ur=16 variant=") + variant + " ctas=" + ctas;
                         const GOut out = run_gather(g, Backend::cuda, true, 16);
                         ASSERT_TRUE(out.st.ok()) << tag;
                         EXPECT_EQ(std::memcmp(first16.o.data(), out.o.data(), first16.o.size() * 4), 0) << tag << ": O differs from variant 3";
                         EXPECT_EQ(std::memcmp(first16.lse.data(), out.lse.data(), first16.lse.size() * 4), 0) << tag << ": LSE differs";
                       }
                   }});
}


// PERF.md's gather shape (hd128, 2048 keys per row, union_rows 64, every row full, swap 0) under
// each attention path and union-kernel cluster size: [perf] lines with the median time and TFLOPS
// on attended keys, a [gather profile] line per variant (union / attention split of the first
// wave), and max |O - O(default path)| as a gross check at full size.
SPARGE_CASES(GatherGpuPerfPaths) {
  cases.push_back({"GATHER_GPU_PERF_PATHS(b=1,hq=32,hk=8,sq=1024,sk=16384,d=128,keys=2048,union_rows=64,swap=0)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     const GCase c{1, 32, 8, 1024, 16384, 128, 2048, DType::f16, false, false, -1.0, 64, 0.0};
                     const GProblem g = make_gather(c, "GATHER_GPU_PERF_PATHS");
                     DeviceGather dg(g, g.idx, g.counts, c.hq, c.t, false);
                     GatherAttentionParams& p = dg.p;
                     auto& o = dg.o;
                     p.group_union = true;
                     p.union_rows = 64;
                     const double flops = 4.0 * c.d * 2048.0 * static_cast<double>(c.b * c.hq * c.sq);
                     ASSERT_TRUE(gather_attention(p).ok());
                     SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
                     const std::vector<unsigned char> ref = o.download();
                     std::vector<PathConfig> paths = {{"mma64", "mma64"}, {"mma128", "mma128"}, {"wgmma", "wgmma"},
                                                      {"wgmma256", "wgmma256"}, {"wgmma64", "wgmma64"}};
                     paths.insert(paths.end(), std::begin(kWsPaths), std::end(kWsPaths));
                     for (const PathConfig s : {PathConfig{"ws stages=3", "ws", nullptr, "3"}, PathConfig{"ws stages=4", "ws", nullptr, "4"},
                                                PathConfig{"ws wg=1 stages=6", "ws", "1", "6"}}) {
                       paths.push_back(s);
                     }
                     for (const PathConfig& pc : paths) {
                       const char* path = pc.label;
                       for (const char* ctas : {"1", "8", "8+overlap4", "8+overlap8"}) {
                         PathEnv env(pc);
                         ScopedEnv e1("SPARGE_GATHER_UNION_CTAS", std::strncmp(ctas, "1", 1) == 0 ? "1" : "8");
                         ScopedEnv e3("SPARGE_GATHER_OVERLAP", std::strlen(ctas) > 1 ? ctas + 9 : nullptr);
                         std::vector<float> ms;
                         ASSERT_NO_FATAL_FAILURE(time_gather(p, 13, &ms));
                         const double med = ms[ms.size() / 2];
                         {
                           ScopedEnv e2("SPARGE_GATHER_PROFILE", "1");
                           ASSERT_TRUE(gather_attention(p).ok());
                         }
                         SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
                         const std::vector<unsigned char> out = o.download();
                         const double diff = max_abs_diff16(out, ref, c.t);
                         std::printf("[perf] gather hd128 keys=2048 union_rows=64 swap=0 path=%s union_ctas=%s: median %.3f ms (min %.3f max %.3f), "
                                     "%.1f TFLOPS on attended keys; max |O - O(default)| = %.2e\n",
                                     path, ctas, med, ms.front(), ms.back(), flops / (med * 1e-3) / 1e12, diff);
                         EXPECT_LE(diff, 2e-2) << path;
                       }
                     }
                   }});
}



SPARGE_CASES(GatherGpuKv) {
  const GCase shapes[] = {
      // G = 1 (Hq == Hk: the two layouts coincide), 2, 4, 8; causal; Sq not a multiple of 64 or 7
      // (tail groups); empty rows; lists shorter than n_max (-1 padding); Sq > Sk.
      {1, 4, 4, 37, 300, 64, 64, DType::f16, false, false, 0.1, 1},
      {2, 8, 4, 113, 203, 128, 96, DType::f16, true, false, 0.1, 8},
      {2, 8, 2, 100, 203, 128, 96, DType::bf16, true, true, 0.2, 8},
      {1, 16, 4, 130, 1000, 128, 256, DType::f16, false, false, 0.05, 64},
      {1, 8, 1, 70, 500, 64, 200, DType::bf16, true, false, 0.1, 16},
      {1, 8, 2, 64, 40, 128, 8, DType::f16, true, false, 0.0, 1},  // Sq > Sk: early rows see nothing
  };
  for (const GCase& c : shapes) {
    const std::string name = gname("GATHER_GPU_KV", c);
    cases.push_back({name, [c, name] { gather_case(c, name, Layout::kv); }});
  }
  cases.push_back({"GATHER_GPU_KV_RELAUNCH(runs=200x2,per_row+union)", [] { relaunch_case("GATHER_GPU_KV_RELAUNCH", Layout::kv); }});
  // Bad lists in the kv layout: list (b, hk, i) = (1, 1, 2) is row 17 of [2, 2, 5]; both backends
  // name the list by its kv head, with the same message.
  for (const BadList& bl : kBadLists) {
    cases.push_back({Name("GATHER_GPU_KV_BADLIST")("what", bl.what), [bl] { badlist_case(bl, "GATHER_GPU_KV_BADLIST", Layout::kv); }});
  }
  // Shapes: indices.shape[1] must be Hq or Hk; counts.shape[1] must equal indices.shape[1].
  cases.push_back({"GATHER_KV_VALIDATION", [] {
                     std::vector<std::uint16_t> q(2 * 3 * 4 * 64), k(2 * 7 * 2 * 64), o(q.size());
                     std::vector<std::int32_t> idx(2 * 4 * 3 * 4, 0), cnt(2 * 4 * 3, 0);
                     auto params = [&](std::int64_t idx_heads, std::int64_t cnt_heads) {
                       GatherAttentionParams p;
                       p.q = make_tensor(q.data(), DType::f16, {2, 3, 4, 64});
                       p.k = make_tensor(k.data(), DType::f16, {2, 7, 2, 64});
                       p.v = p.k;
                       p.o = make_tensor(o.data(), DType::f16, {2, 3, 4, 64});
                       p.indices = make_tensor(idx.data(), DType::i32, {2, idx_heads, 3, 4});
                       p.counts = make_tensor(cnt.data(), DType::i32, {2, cnt_heads, 3});
                       p.exec = cpu_exec();
                       return p;
                     };
                     EXPECT_TRUE(gather_attention(params(4, 4)).ok());
                     EXPECT_TRUE(gather_attention(params(2, 2)).ok());
                     const Status s3 = gather_attention(params(3, 3));
                     EXPECT_EQ(s3.code(), StatusCode::invalid_argument);
                     EXPECT_NE(s3.message().find("indices.shape[1] = 3 (expected 4 = q.shape[2] (Hq)"), std::string::npos) << s3.message();
                     const Status s4 = gather_attention(params(2, 4));
                     EXPECT_EQ(s4.code(), StatusCode::invalid_argument);
                     EXPECT_NE(s4.message().find("counts.shape[1] = 4 (expected 2 = indices.shape[1]"), std::string::npos) << s4.message();
                     const Status s5 = gather_attention(params(4, 2));
                     EXPECT_NE(s5.message().find("counts.shape[1] = 2 (expected 4 = indices.shape[1]"), std::string::npos) << s5.message();
                   }});
  // PERF.md's shape with both list layouts (swap 0: the lists of a group's 4 heads are identical,
  // so both layouts are the same attention): per-row and union, default and wgmma attention, with
  // a [gather profile] line (union / attention split of the first wave) after each timing.
  cases.push_back({"GATHER_GPU_KV_PERF(b=1,hq=32,hk=8,sq=1024,sk=16384,d=128,keys=2048,union_rows=64,swap=0)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     gather_kv::PerfProblem pp;
                     GatherAttentionParams& p = pp.p;
                     const double flops = pp.flops;
                     // Union overlap per 64-position group: union / sum of the distinct lists.
                     const double overlap = gather_kv::union_overlap(pp.kv);
                     std::vector<unsigned char> ref;
                     // union_variant: SPARGE_GATHER_UNION_VARIANT (nullptr: the default, 5; 3 was the
                     // default before kRowBitmaps).
                     // trusted: check_lists = false (no read-back, no host wait): bitwise the first row.
                     struct Variant { const char* layout; bool uni; const char* path; const char* overlap; const char* union_variant = nullptr; const char* ws_pair = nullptr; const char* pdl = nullptr; bool trusted = false; const char* persist = nullptr; };
                     const Variant vs[] = {{"q", true, nullptr, nullptr},   {"kv", true, nullptr, nullptr},  {"q", true, "mma", nullptr},
                                           {"kv", true, "mma", nullptr},    {"q", true, "wgmma", nullptr},   {"kv", true, "wgmma", nullptr},
                                           {"kv", true, nullptr, "4"},      {"kv", true, "wgmma", "4"},      {"q", false, nullptr, nullptr},
                                           {"q", true, "ws", nullptr},      {"kv", true, "ws", nullptr},     {"kv", true, "ws", "4"},
                                           {"kv", false, nullptr, nullptr}, {"q", true, nullptr, nullptr, "0"}, {"kv", true, nullptr, nullptr, "0"},
                                           {"q", true, nullptr, nullptr, "1"}, {"kv", true, nullptr, nullptr, "1"},
                                           {"q", true, nullptr, nullptr, "2"}, {"kv", true, nullptr, nullptr, "2"},
                                           {"q", true, nullptr, nullptr, "3"}, {"kv", true, nullptr, nullptr, "3"},
                                           {"q", true, nullptr, nullptr, "4"}, {"kv", true, nullptr, nullptr, "4"},
                                           {"q", true, nullptr, nullptr, "7"}, {"kv", true, nullptr, nullptr, "7"},
                                           {"q", true, "ws", nullptr, nullptr, "1"}, {"kv", true, "ws", nullptr, nullptr, "1"},
                                           {"kv", true, "wgmma", nullptr}, {"kv", true, "ws", nullptr}, {"kv", true, "ws", nullptr, nullptr, "1"},
                                           {"q", true, nullptr, nullptr, nullptr, nullptr, "1"}, {"kv", true, nullptr, nullptr, nullptr, nullptr, "1"},
                                           {"kv", true, nullptr, nullptr}, {"kv", true, nullptr, nullptr, nullptr, nullptr, nullptr, true},
                                           // The ws kernel's per-tile grid (SPARGE_GATHER_WS_PERSIST=0) next to the
                                           // default (the persistent walk since session 27), alternated.
                                           {"kv", true, nullptr, nullptr, nullptr, nullptr, nullptr, false, "0"}, {"kv", true, nullptr, nullptr},
                                           {"kv", true, nullptr, nullptr, nullptr, nullptr, nullptr, false, "0"}, {"q", true, nullptr, nullptr, nullptr, nullptr, nullptr, false, "0"}};
                     for (const Variant& v : vs) {
                       const bool kvl = std::strcmp(v.layout, "kv") == 0;
                       pp.use_lists(kvl);
                       p.group_union = v.uni;
                       p.check_lists = !v.trusted;
                       ScopedEnv e1("SPARGE_GATHER_PATH", v.path);
                       ScopedEnv e2("SPARGE_GATHER_OVERLAP", v.overlap);
                       ScopedEnv e4("SPARGE_GATHER_UNION_VARIANT", v.union_variant);
                       ScopedEnv e5("SPARGE_GATHER_WS_PAIR", v.ws_pair);
                       ScopedEnv e6("SPARGE_GATHER_PDL", v.pdl);
                       ScopedEnv e7("SPARGE_GATHER_WS_PERSIST", v.persist);
                       RowTiming t;
                       ASSERT_NO_FATAL_FAILURE(measure_row(pp, v.overlap == nullptr && !v.trusted, ref, &t));
                       std::printf("[perf] gather hd128 keys=2048 lists=%s group_union=%d path=%s%s%s%s%s overlap=%s union_variant=%s: median %.3f ms (min %.3f max %.3f), "
                                   "%.1f TFLOPS on attended keys; host %.3f ms in the call; back-to-back %.3f ms per call (%.1f TFLOPS); union overlap (union / sum of distinct lists per group) = %.4f; "
                                   "max |O - O(first)| = %.2e\n",
                                   kvl ? "per-kv-head" : "per-q-head", v.uni, v.path ? v.path : "default", v.ws_pair ? " paired" : "", v.pdl ? " pdl" : "",
                                   v.trusted ? " check_lists=0" : "", v.persist ? (std::strcmp(v.persist, "0") == 0 ? " per-tile" : " persist") : "", v.overlap ? v.overlap : "off",
                                   v.union_variant ? v.union_variant : "5", t.med,
                                   t.min, t.max, flops / (t.med * 1e-3) / 1e12, t.host, t.b2b, flops / (t.b2b * 1e-3) / 1e12, overlap, t.diff);
                       EXPECT_LE(t.diff, 2e-2);
                       if (v.trusted) EXPECT_TRUE(t.out == ref) << "check_lists = false: not bitwise the first row";
                     }
                     p.check_lists = true;
                   }});
}

// Perf rows at PERF.md's gather shape (kv-head lists), one per attention path: median, back-to-back
// and the [gather profile] split, each checked against the first row. GATHER_GPU_KV_PERF_HD64: head
// dim 64, the default (ws since session 12; wgmma before) next to ws alone / paired and wgmma.
// GATHER_GPU_MHA_PERF: the same with Hk = Hq = 32 (one list per head, 64-row groups: BM 64 tiles),
// the default next to mma, ws (one consumer warpgroup, two CTAs per SM) and wgmma.
void perf_rows(std::int64_t d, std::int64_t hk, const char* label, std::initializer_list<std::pair<const char*, const char*>> rows) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  gather_kv::PerfProblem pp(d, hk);
  pp.use_lists(true);
  pp.p.group_union = true;
  std::vector<unsigned char> ref;
  for (const auto& r : rows) {
    ScopedEnv e1("SPARGE_GATHER_PATH", r.first);
    ScopedEnv e2("SPARGE_GATHER_WS_PAIR", r.second);
    RowTiming t;
    ASSERT_NO_FATAL_FAILURE(measure_row(pp, true, ref, &t));
    std::printf("[perf] gather %s keys=2048 group_union=1 path=%s%s: median %.3f ms (min %.3f max %.3f), %.1f TFLOPS "
                "on attended keys; back-to-back %.3f ms per call (%.1f TFLOPS); max |O - O(first)| = %.2e\n",
                label, r.first ? r.first : "default", r.second ? " paired" : "", t.med, t.min, t.max, pp.flops / (t.med * 1e-3) / 1e12,
                t.b2b, pp.flops / (t.b2b * 1e-3) / 1e12, t.diff);
    EXPECT_LE(t.diff, 2e-2);
  }
}

SPARGE_CASES(GatherGpuKvPerf64) {
  cases.push_back({"GATHER_GPU_MHA_PERF(b=1,hq=32,hk=32,sq=1024,sk=16384,d=128,keys=2048,union_rows=64,swap=0)", [] {
                     perf_rows(128, 32, "hd128 mha", {{nullptr, nullptr}, {"mma", nullptr}, {"ws", nullptr}, {"wgmma", nullptr}, {nullptr, nullptr}});
                   }});
  cases.push_back({"GATHER_GPU_KV_PERF_HD64(b=1,hq=32,hk=8,sq=1024,sk=16384,d=64,keys=2048,union_rows=64,swap=0)", [] {
                     perf_rows(64, 8, "hd64 lists=per-kv-head", {{nullptr, nullptr}, {"ws", nullptr}, {"ws", "1"}, {"wgmma", nullptr}, {"ws", nullptr}});
                   }});
}

// PERF.md's gather shape, both list layouts, the paths of session 5's attention work next to the
// default: each row prints the median time, TFLOPS on attended keys, max |O - O(default)| and
// whether the output is bitwise the default's, then a [gather profile] line (union / attention
// split). SPARGE_TEST_GATHER_FAST = comma-separated labels restricts the rows (all when unset).
SPARGE_CASES(GatherGpuFastPerf) {
  cases.push_back({"GATHER_GPU_FAST_PERF(b=1,hq=32,hk=8,sq=1024,sk=16384,d=128,keys=2048,union_rows=64,swap=0)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     gather_kv::PerfProblem pp;
                     const GCase& c = pp.c;
                     const gather_kv::KvLists& kv = pp.kv;
                     GatherAttentionParams& p = pp.p;
                     DeviceGuarded<unsigned char>& o = pp.o;
                     const double flops = pp.flops;
                     p.group_union = true;
                     // Union overlap per 64-position group (kv-head lists; the per-query-head
                     // lists of a position are copies): union size / sum of the distinct lists.
                     const double overlap = gather_kv::union_overlap(kv);
                     std::printf("[perf fast] union overlap (union / sum of distinct lists per 64-position group) = %.4f\n", overlap);
                     const char* only = std::getenv("SPARGE_TEST_GATHER_FAST");
                     const std::string filter = only != nullptr ? std::string(",") + only + "," : "";
                     // The default (wgmma BM 128 + prefetch, union at >= 32 lists per CTA since
                     // session 5's round), the former default (wgmma64 without prefetch, union at
                     // >= 16 lists per CTA: "union_ctas=4" with kv-head lists), and the switches.
                     std::vector<PathConfig> paths = {
                         {"default", nullptr},
                         {"wgmma64 no prefetch (default before)", "wgmma64", nullptr, nullptr, nullptr, nullptr, "0"},
                         {"wgmma no prefetch", "wgmma", nullptr, nullptr, nullptr, nullptr, "0"},
                         {"wgmma64 prefetch", "wgmma64", nullptr, nullptr, nullptr, nullptr, "1"},
                         {"wgmma stages=4", "wgmma", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "4"},
                         {"wgmma pdl", "wgmma", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1"},
                         {"wgmma stages=4 pdl", "wgmma", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "1", "4"},
                         {"ws", "ws"},
                         {"ws no prefetch", "ws", nullptr, nullptr, nullptr, nullptr, "0"},
                     };
                     // The union kernel's cluster size (SPARGE_GATHER_UNION_CTAS) under the default
                     // attention: labels "union_ctas=N".
                     paths.push_back({"union_ctas=2", nullptr});
                     paths.push_back({"union_ctas=4", nullptr});
                     paths.push_back({"union_ctas=8", nullptr});
                     for (const char* layout : {"kv", "q"}) {
                       const bool kvl = std::strcmp(layout, "kv") == 0;
                       pp.use_lists(kvl);
                       std::vector<unsigned char> ref;
                       for (const PathConfig& pc : paths) {
                         if (!filter.empty() && filter.find(std::string(",") + pc.label + ",") == std::string::npos && std::strcmp(pc.label, "default") != 0) continue;
                         PathEnv env(pc);
                         ScopedEnv uctas("SPARGE_GATHER_UNION_CTAS", std::strncmp(pc.label, "union_ctas=", 11) == 0 ? pc.label + 11 : nullptr);
                         std::vector<float> ms;
                         ASSERT_NO_FATAL_FAILURE(time_gather(p, 23, &ms));
                         const double med = ms[ms.size() / 2];
                         {
                           ScopedEnv e3("SPARGE_GATHER_PROFILE", "1");
                           ASSERT_TRUE(gather_attention(p).ok());
                         }
                         SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
                         const std::vector<unsigned char> out = o.download();
                         if (ref.empty()) ref = out;
                         const double diff = max_abs_diff16(out, ref, c.t);
                         const bool same = out == ref;
                         std::printf("[perf fast] gather hd128 keys=2048 lists=%s path=%s: median %.3f ms (min %.3f max %.3f), %.1f TFLOPS on attended keys; "
                                     "max |O - O(default)| = %.2e%s\n",
                                     kvl ? "per-kv-head" : "per-q-head", pc.label, med, ms.front(), ms.back(), flops / (med * 1e-3) / 1e12, diff,
                                     same ? " (bitwise)" : "");
                         std::fflush(stdout);
                         EXPECT_LE(diff, 2e-2) << pc.label;
                       }
                     }
                     // Diagnostic: the same FLOPs and union sizes, but every group's union is a
                     // contiguous window of 2048 keys (random start per group; kv-head lists):
                     // attention time near the random lists' says the scattered K/V rows are not
                     // what bounds it. Outputs are checked against the default path only.
                     std::vector<std::int32_t> widx(kv.idx.size()), wcnt(kv.counts.size(), 2048);
                     {
                       auto rng = rng_for("GATHER_GPU_FAST_PERF_window");
                       std::uniform_int_distribution<std::int32_t> start(0, static_cast<std::int32_t>(c.sk - 2048));
                       for (std::int64_t hk = 0; hk < c.hk; ++hk)
                         for (std::int64_t i0 = 0; i0 < c.sq; i0 += 64) {
                           const std::int32_t w0 = start(rng);
                           for (std::int64_t i = i0; i < i0 + 64; ++i)
                             for (int t = 0; t < 2048; ++t) widx[static_cast<size_t>((hk * c.sq + i) * c.n_max + t)] = w0 + t;
                         }
                     }
                     DeviceGuarded<std::int32_t> dwi(widx.size()), dwc(wcnt.size());
                     dwi.upload(widx);
                     dwc.upload(wcnt);
                     p.indices = make_tensor(dwi.data(), DType::i32, {c.b, c.hk, c.sq, c.n_max});
                     p.counts = make_tensor(dwc.data(), DType::i32, {c.b, c.hk, c.sq});
                     std::vector<unsigned char> wref;
                     for (const PathConfig& pc : {PathConfig{"default", nullptr}, PathConfig{"wgmma64 no prefetch", "wgmma64", nullptr, nullptr, nullptr, nullptr, "0"},
                                                  PathConfig{"ws", "ws"}}) {
                       PathEnv env(pc);
                       std::vector<float> ms;
                       ASSERT_NO_FATAL_FAILURE(time_gather(p, 13, &ms));
                       {
                         ScopedEnv e3("SPARGE_GATHER_PROFILE", "1");
                         ASSERT_TRUE(gather_attention(p).ok());
                       }
                       SPARGE_CUDA_CHECK(cudaDeviceSynchronize());
                       const std::vector<unsigned char> out = o.download();
                       if (wref.empty()) wref = out;
                       std::printf("[perf fast] gather hd128 keys=2048 lists=per-kv-head contiguous-window path=%s: median %.3f ms, %.1f TFLOPS on attended keys%s\n",
                                   pc.label, ms[ms.size() / 2], flops / (ms[ms.size() / 2] * 1e-3) / 1e12, out == wref ? " (bitwise)" : " (DIFFERS from default)");
                       std::fflush(stdout);
                     }
                   }});
}

// The TMA row-gather probe (src/cuda/gather/tma_probe.h; measurement only): whether a TMA box of
// 64 columns x 1 row lands as the kernels' sw128 layout, and the gathered bytes per second of
// 16-byte cp.async against TMA boxes on the same random rows. Prints one line; skips off sm_90
// and unless SPARGE_TMA_PROBE=1 (run it in a process of its own: should a box-of-one-row TMA
// fault on some device, the error would poison the CUDA context of every later case).
SPARGE_CASES(GatherGpuTmaProbe) {
  cases.push_back({"GATHER_GPU_TMA_PROBE(ctas=264,steps=32,rows=64+64,hd128)", [] {
                     if (!have_gpu()) GTEST_SKIP() << "no GPU";
                     const char* on = std::getenv("SPARGE_TMA_PROBE");
                     if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "set SPARGE_TMA_PROBE=1";
                     const ::sparge::cuda::gather::TmaProbe r = ::sparge::cuda::gather::tma_gather_probe();
                     std::printf("[tma probe] ran=%d swizzle mismatches=%d of 1024 chunks (0: TMA rows land as sw128); gathered K+V rows: "
                                 "cp.async %.0f GB/s, TMA %.0f GB/s%s%s\n",
                                 r.ran ? 1 : 0, r.swizzle_mismatches, r.cp_async_gbs, r.tma_gbs, r.note.empty() ? "" : "; ", r.note.c_str());
                     std::fflush(stdout);
                     if (!r.ran) GTEST_SKIP() << r.note;
                   }});
}

}  // namespace
}  // namespace sparge::test
