// Where a query tile's time goes in the Hopper attention kernel: per-tile clock stamps of every CTA's
// producer and consumer warpgroups (trace_mark in src/cuda/attention/sm90/kernel.cuh), on a random
// LUT of a given density at b2 h32 s16384 d128 fp16 (the benchmark shape; SPARGE_TRACE_SHAPE=b,hq,hk,sq,sk sets
// another, d 128; NHD, or HND with SPARGE_TRACE_HND=1; SPARGE_TRACE_STEADY=N also times N launches back to back).
//
//   sparge_sm90_trace [density=0.1] [blkk=128|64|176] [timed runs=20] [mode=0]
//
// SPARGE_TRACE_NOEPI=1: a what-if, the tiles without their O / LSE stores (register epilogue; session 26).
// SPARGE_TRACE_FP8=1: the fp8 recipe's kernels instead (blkk 128 or 64, paired; modes 0, 1, 4), on random e4m3 Q, K and
// V^T of magnitude < 2 with unit scales in the recipe's own layouts (no prepass: the kernel alone; session 25).
//
// Runs a Traits with kTrace = true (a distinct kernel; the library's kernels compile no stamps),
// times it without stamps (P.trace = nullptr: only the stamps' branches), then once with them, and
// prints the median of each interval per tile in SM cycles. SPARGE_SM90_VARIANT applies as in the
// library. A development probe, not a test (docs/attention_sm90.md, "Session 17").
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda/attention/sm90/kernel.cuh"
#include "cuda/attention/sm90/tensor_map.h"
#include "sparge/types.h"

namespace sm90 = sparge::cuda::attn::sm90;
using sparge::cuda::attn::KernelParams;

namespace {

// The flips of mode bits 1 and 3 (the fp8 kernels have neither: their softmax reads no kRowStagger, and nvcc warns
// about a member no instantiation reads).
template <class Base, bool kFlip, bool kQRegsFlip, bool = Base::kFp8>
struct Flipped : Base {
  static constexpr bool kRowStagger = Base::kRowStagger != kFlip;
  static constexpr bool kQRegs = Base::kQRegs != kQRegsFlip;
};
template <class Base, bool kFlip, bool kQRegsFlip>
struct Flipped<Base, kFlip, kQRegsFlip, true> : Base {
  static_assert(!kFlip && !kQRegsFlip, "mode bits 1 and 3 do not apply to the fp8 kernels");
};
template <class Base, bool kTraceLoop_ = false, bool kFlip = false, bool kTrace_ = true, bool kQRegsFlip = false>
struct Traced : Flipped<Base, kFlip, kQRegsFlip> {
  static constexpr bool kTrace = kTrace_;
  static constexpr bool kTraceLoop = kTraceLoop_;
};
// The Traced kernel that mode M selects (bits as in main).
template <class Base, int M>
using ByMode = Traced<Base, (M & 1) != 0, (M & 2) != 0, (M & 4) == 0, (M & 8) != 0>;

// x[i] = f(i) over n elements (grid-stride), for the harness's inputs.
template <class T, class F>
__global__ void fill(T* x, long long n, F f) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    x[i] = f(i);
  }
}
__device__ __forceinline__ unsigned index_hash(long long i, unsigned seed) {
  unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return h;
}
// Uniform halves in [-1, 1).
struct RandomHalf {
  unsigned seed;
  __device__ __half operator()(long long i) const {
    return __float2half(static_cast<float>(index_hash(i, seed) & 0xFFFF) / 32768.0f - 1.0f);
  }
};
// Random e4m3 bytes of magnitude < 2 (exponent field 0..7: never the NaN pattern), for the fp8 kernels' Q, K and V^T.
struct RandomE4m3 {
  unsigned seed;
  __device__ std::uint8_t operator()(long long i) const {
    const unsigned h = index_hash(i, seed);
    return static_cast<std::uint8_t>((h & 0x80u) | (((h >> 8) & 7u) << 3) | ((h >> 16) & 7u));
  }
};
struct Constant {
  float v;
  __device__ float operator()(long long) const { return v; }
};

void check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "line %d: %s: %s\n", line, what, cudaGetErrorString(e));
    std::exit(1);
  }
}
#define CHECK(x) check((x), #x, __LINE__)

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The shape: b2 h32 s16384 unless SPARGE_TRACE_SHAPE="b,hq,hk,sq,sk" (NHD, d 128; e.g. compare.py's gather shape
// 1,32,8,1024,16384).
struct Shape {
  int b = 2, hq = 32, hk = 32, sq = 16384, sk = 16384;
};
Shape shape_from_env() {
  Shape sh;
  if (const char* e = std::getenv("SPARGE_TRACE_SHAPE")) {
    if (std::sscanf(e, "%d,%d,%d,%d,%d", &sh.b, &sh.hq, &sh.hk, &sh.sq, &sh.sk) != 5 || sh.b < 1 || sh.hk < 1 ||
        sh.hq < sh.hk || sh.hq % sh.hk != 0 || sh.sq < 1 || sh.sk < 1) {
      std::fprintf(stderr, "SPARGE_TRACE_SHAPE=%s: expected b,hq,hk,sq,sk with hq a multiple of hk\n", e);
      std::exit(2);
    }
  }
  return sh;
}

template <class Tr>
int run(double density, int timed) {
  const Shape sh = shape_from_env();
  const int B = sh.b, H = sh.hq, HK = sh.hk, S = sh.sq, SK = sh.sk;
  constexpr int D = 128, BQ = Tr::kBlockQ, BK = Tr::kBlockK;
  const int NQ = (S + BQ - 1) / BQ, NK = (SK + BK - 1) / BK;
  // The dense-only 176-key tile walks every key (no LUT): density 1.
  if (Tr::kDenseOnly) density = 1.0;
  const long long n = static_cast<long long>(B) * S * H * D, nk = static_cast<long long>(B) * SK * HK * D;
  __half *q, *k, *v, *o;
  CHECK(cudaMalloc(&q, n * 2));
  CHECK(cudaMalloc(&k, nk * 2));
  CHECK(cudaMalloc(&v, nk * 2));
  CHECK(cudaMalloc(&o, n * 2));
  fill<<<1024, 256>>>(q, n, RandomHalf{1u});
  fill<<<1024, 256>>>(k, nk, RandomHalf{2u});
  fill<<<1024, 256>>>(v, nk, RandomHalf{3u});
  // LUT rows: round(density * NK) distinct random blocks each (at least one), ascending.
  const int count = std::max(1, static_cast<int>(density * NK + 0.5));
  std::vector<std::int32_t> lut(static_cast<std::size_t>(B) * H * NQ * NK, -1);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(B) * H * NQ, count);
  std::mt19937 rng(7);
  std::vector<std::int32_t> perm(NK);
  for (std::size_t r = 0; r < counts.size(); ++r) {
    for (int i = 0; i < NK; ++i) perm[i] = i;
    for (int i = 0; i < count; ++i) std::swap(perm[i], perm[i + rng() % (NK - i)]);
    std::sort(perm.begin(), perm.begin() + count);
    std::copy(perm.begin(), perm.begin() + count, lut.begin() + static_cast<std::ptrdiff_t>(r * NK));
  }
  std::int32_t *dlut, *dcounts;
  CHECK(cudaMalloc(&dlut, lut.size() * 4));
  CHECK(cudaMalloc(&dcounts, counts.size() * 4));
  CHECK(cudaMemcpy(dlut, lut.data(), lut.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dcounts, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));

  sm90::Sm90Params P;
  // Element strides of batch, sequence, head: NHD ([b, s, h, d]) or, SPARGE_TRACE_HND=1, HND ([b, h, s, d]: compare.py's).
  const char* hnd_env = std::getenv("SPARGE_TRACE_HND");
  const bool hnd = hnd_env != nullptr && hnd_env[0] == '1';
  const std::int64_t qs[3] = {static_cast<std::int64_t>(S) * H * D, hnd ? D : static_cast<std::int64_t>(H) * D,
                              hnd ? static_cast<std::int64_t>(S) * D : D};
  const std::int64_t ks[3] = {static_cast<std::int64_t>(SK) * HK * D, hnd ? D : static_cast<std::int64_t>(HK) * D,
                              hnd ? static_cast<std::int64_t>(SK) * D : D};
  const sparge::Tensor tq = sparge::make_tensor(q, sparge::DType::f16, {B, S, H, D}, {qs[0], qs[1], qs[2], 1});
  const sparge::Tensor tk = sparge::make_tensor(k, sparge::DType::f16, {B, SK, HK, D}, {ks[0], ks[1], ks[2], 1});
  const sparge::Tensor tv = sparge::make_tensor(v, sparge::DType::f16, {B, SK, HK, D}, {ks[0], ks[1], ks[2], 1});
  if (!Tr::kFp8 && (!sm90::encode_tensor_map(&P.q_map, tq, BQ) || !sm90::encode_tensor_map(&P.k_map, tk, BK) ||
                    !sm90::encode_tensor_map(&P.v_map, tv, BK))) {
    std::fprintf(stderr, "tensor maps refused\n");
    return 1;
  }
  // The fp8 recipe's kernels read Q, K (rows of 128 bytes, [b, h, s, 128]) and V^T ([b, hk, 128, sk padded to 128])
  // in e4m3 through their own maps, with per-row Q, per-block K and per-channel V scales (quant.h's layouts).
  std::vector<void*> fp8_buffers;
  if constexpr (Tr::kFp8) {
    if (hnd) {
      std::fprintf(stderr, "SPARGE_TRACE_HND does not apply to the fp8 kernels (their layouts are fixed)\n");
      return 2;
    }
    const long long sk_pad = (SK + 127) / 128 * 128, nkb = (SK + BK - 1) / BK;
    const long long nv8 = static_cast<long long>(B) * HK * D * sk_pad;  // bytes of V^T
    // Scales: per Q row, per K block, per V channel.
    const long long nqs = static_cast<long long>(B) * H * S, nks = static_cast<long long>(B) * HK * nkb,
                    nvs = static_cast<long long>(B) * HK * D;
    std::uint8_t *q8, *k8, *v8t;
    float *q_scale, *k_scale, *v_scale;
    CHECK(cudaMalloc(&q8, n));
    CHECK(cudaMalloc(&k8, nk));
    CHECK(cudaMalloc(&v8t, nv8));
    CHECK(cudaMalloc(&q_scale, nqs * 4));
    CHECK(cudaMalloc(&k_scale, nks * 4));
    CHECK(cudaMalloc(&v_scale, nvs * 4));
    fill<<<1024, 256>>>(q8, n, RandomE4m3{4u});
    fill<<<1024, 256>>>(k8, nk, RandomE4m3{5u});
    fill<<<1024, 256>>>(v8t, nv8, RandomE4m3{6u});
    fill<<<256, 256>>>(q_scale, nqs, Constant{1.0f});
    fill<<<256, 256>>>(k_scale, nks, Constant{1.0f});
    fill<<<256, 256>>>(v_scale, nvs, Constant{1.0f});
    if (!sm90::encode_fp8_rows_map(&P.q_map, q8, B, H, S, 128) ||
        !sm90::encode_fp8_rows_map(&P.k_map, k8, B, HK, SK, BK) || !sm90::encode_fp8_vt_map(&P.v_map, v8t, B, HK, sk_pad)) {
      std::fprintf(stderr, "fp8 tensor maps refused\n");
      return 1;
    }
    P.q_scale = q_scale, P.k_scale = k_scale, P.v_scale = v_scale, P.lse_shift = nullptr;
    P.nkb = static_cast<int>(nkb);
    fp8_buffers = {q8, k8, v8t, q_scale, k_scale, v_scale};
  }
  const sparge::Tensor to = sparge::make_tensor(o, sparge::DType::f16, {B, S, H, D}, {qs[0], qs[1], qs[2], 1});
  P.o_tma = sm90::encode_tensor_map(&P.o_map, to, 64) ? 1 : 0;
  KernelParams& kp = P.p;
  kp = KernelParams{};
  kp.q = q, kp.k = k, kp.v = v, kp.o = o;
  for (std::int64_t* st : {kp.q_stride, kp.o_stride}) std::copy(qs, qs + 3, st);
  for (std::int64_t* st : {kp.k_stride, kp.v_stride}) std::copy(ks, ks + 3, st);
  kp.lut = Tr::kDenseOnly ? nullptr : dlut;
  kp.counts = Tr::kDenseOnly ? nullptr : dcounts;
  kp.lut_stride[3] = 1, kp.lut_stride[2] = NK, kp.lut_stride[1] = static_cast<std::int64_t>(NQ) * NK;
  kp.lut_stride[0] = static_cast<std::int64_t>(H) * NQ * NK;
  kp.counts_stride[2] = 1, kp.counts_stride[1] = NQ, kp.counts_stride[0] = static_cast<std::int64_t>(H) * NQ;
  kp.nk_lut = Tr::kDenseOnly ? 0 : NK;
  kp.seq_q = S, kp.seq_k = SK;
  kp.batch = B, kp.hq = H, kp.hk = HK, kp.nq = NQ;
  kp.scale_log2 = 1.4426950408889634f / 11.313708498984761f;
  kp.lazy_rescale = true;
  // As the launchers (KernelFp8::launch for the fp8 kernels).
  P.variant = Tr::kFp8 ? sm90::fp8_variant_bits() : sm90::variant_bits();
  // SPARGE_TRACE_NOEPI=1: the what-if of session 26 (no O / LSE stores: the O digest is then meaningless).
  if (const char* e = std::getenv("SPARGE_TRACE_NOEPI"); e != nullptr && std::atoi(e) != 0) {
    P.variant |= sm90::kVariantTraceNoEpilogue;
  }
  const int tiles = B * H * NQ;

  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 10; ++i) CHECK(sm90::launch_kernel<Tr>(P, tiles, nullptr));
  const auto timed_launch = [&] {  // milliseconds of one launch between two events
    CHECK(cudaEventRecord(e0));
    CHECK(sm90::launch_kernel<Tr>(P, tiles, nullptr));
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    return static_cast<double>(t);
  };
  std::vector<double> ms;
  for (int i = 0; i < timed; ++i) ms.push_back(timed_launch());
  const double flops = 4.0 * B * H * static_cast<double>(S) * (Tr::kDenseOnly ? SK : count * BK) * D;
  const double med = median(ms);
  std::printf("%s%sblk 128x%d density %.3f (%d blocks per row), variant %d: %.3f ms (median of %d), %.1f TFLOPS on the "
              "selected blocks\n", Tr::kFp8 ? "fp8 " : "", hnd ? "HND " : "", BK, static_cast<double>(count) / NK, count,
              P.variant, med, timed, flops / med / 1e9);
  // SPARGE_TRACE_STEADY=N: also N launches back to back between two events (no host synchronisation between
  // them: the GPU's sustained clock and power, as in a benchmark loop), their mean.
  if (const char* e = std::getenv("SPARGE_TRACE_STEADY")) {
    const int reps = std::atoi(e);
    if (reps > 0) {
      CHECK(cudaEventRecord(e0));
      for (int i = 0; i < reps; ++i) CHECK(sm90::launch_kernel<Tr>(P, tiles, nullptr));
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, e0, e1));
      const double mean = static_cast<double>(t) / reps;
      std::printf("steady: %.3f ms per launch over %d back-to-back launches, %.1f TFLOPS\n", mean, reps, flops / mean / 1e9);
    }
  }
  {  // A digest of O (FNV-1a over its bytes) and its mean |O|: modes that must give the same bits can be compared.
    std::vector<__half> ho(static_cast<std::size_t>(n));
    CHECK(cudaMemcpy(ho.data(), o, n * 2, cudaMemcpyDeviceToHost));
    std::uint64_t h = 1469598103934665603ull;
    double sum = 0;
    for (const __half x : ho) {
      const auto bits = __half_as_ushort(x);
      h = (h ^ (bits & 0xFF)) * 1099511628211ull;
      h = (h ^ (bits >> 8)) * 1099511628211ull;
      sum += std::fabs(static_cast<double>(__half2float(x)));
    }
    std::printf("O digest %016llx, mean |O| %.6g\n", static_cast<unsigned long long>(h), sum / static_cast<double>(n));
  }
  if (!Tr::kTrace) return 0;  // mode bit 2: the kernel without stamps, timed only

  const std::size_t words = static_cast<std::size_t>(tiles) * 3 * sm90::kTraceTiles * sm90::kTraceEvents;
  long long* dtrace;
  CHECK(cudaMalloc(&dtrace, words * 8));
  CHECK(cudaMemset(dtrace, 0, words * 8));
  P.trace = dtrace;
  const double traced_ms = timed_launch();
  std::vector<long long> tr(words);
  CHECK(cudaMemcpy(tr.data(), dtrace, words * 8, cudaMemcpyDeviceToHost));
  const auto at = [&](int cta, int role, int nt, int ev) {
    return tr[((static_cast<std::size_t>(cta) * 3 + role) * sm90::kTraceTiles + nt) * sm90::kTraceEvents + ev];
  };
  int ctas = 0;  // CTAs of the launch: those with a stamp
  while (ctas < tiles && at(ctas, 1, 0, 0) != 0) ++ctas;
  long long span = 0;
  for (int c = 0; c < ctas; ++c) {
    long long last = 0;
    for (int nt = 0; nt < sm90::kTraceTiles && at(c, 1, nt, 0) != 0; ++nt) last = std::max(last, at(c, 1, nt, 8));
    span = std::max(span, last - at(c, 1, 0, 0));
  }
  std::printf("traced run %.3f ms; %d CTAs; longest CTA %lld cycles (%.2f GHz if it spans the launch)\n", traced_ms,
              ctas, span, static_cast<double>(span) / (traced_ms * 1e6));

  // Consumer intervals per tile (tiles 1.. with a next tile; event 9 = key tiles walked).
  const char* names[] = {"ctor + walk (e1-e0)", "Q wait (e2-e1)", "first K wait (e3-e2)", "turn wait (e4-e3)",
                         "first QK + softmax (e5-e4)", "loop (e6-e5)", "last PV (e7-e6)", "epilogue (e8-e7)",
                         "to next tile (e0'-e8)", "tile (e0'-e0)", "per key tile in the loop",
                         "tile - n x per key tile"};
  for (int role = 1; role <= 2; ++role) {
    std::vector<std::vector<double>> d(12);
    std::vector<double> nkts;
    for (int c = 0; c < ctas; ++c) {
      for (int nt = 1; nt + 1 < sm90::kTraceTiles; ++nt) {
        if (at(c, role, nt + 1, 0) == 0 || at(c, role, nt, 8) == 0) break;
        const long long nkt = at(c, role, nt, 9);
        if (nkt < 2) continue;
        nkts.push_back(static_cast<double>(nkt));
        for (int e = 0; e < 8; ++e) d[e].push_back(static_cast<double>(at(c, role, nt, e + 1) - at(c, role, nt, e)));
        d[8].push_back(static_cast<double>(at(c, role, nt + 1, 0) - at(c, role, nt, 8)));
        const double tile = static_cast<double>(at(c, role, nt + 1, 0) - at(c, role, nt, 0));
        const double per = static_cast<double>(at(c, role, nt, 6) - at(c, role, nt, 5)) / static_cast<double>(nkt - 1);
        d[9].push_back(tile);
        d[10].push_back(per);
        d[11].push_back(tile - static_cast<double>(nkt) * per);
      }
    }
    std::printf("consumer warpgroup %d (%zu tiles, median %.0f key tiles each), median cycles:\n", role - 1,
                d[0].size(), median(nkts));
    for (int e = 0; e < 12; ++e) std::printf("  %-28s %9.0f\n", names[e], median(d[e]));
  }
  // Inside the loop's key tile kTraceKeyTile (events first = kTraceLoopFirst .. last), per
  // consumer warpgroup: the kTraceLoopEvents - 1 intervals between them, then the whole (last - first).
  constexpr int first = sm90::kTraceLoopFirst, last = first + sm90::kTraceLoopEvents - 1, gaps = last - first;
  const char* loop_names[gaps] = {"K/V waits + decide", "turn wait", "GEMM issue", "S wait", "softmax", "PV wait",
                                  "rescale + pack"};
  for (int role = 1; role <= 2; ++role) {
    std::vector<std::vector<double>> d(gaps + 1);
    for (int c = 0; c < ctas; ++c) {
      for (int nt = 0; nt < sm90::kTraceTiles; ++nt) {
        if (at(c, role, nt, 0) == 0) break;
        if (at(c, role, nt, first) == 0 || at(c, role, nt, last) == 0) continue;
        for (int e = 0; e < gaps; ++e) {
          d[e].push_back(static_cast<double>(at(c, role, nt, first + e + 1) - at(c, role, nt, first + e)));
        }
        d[gaps].push_back(static_cast<double>(at(c, role, nt, last) - at(c, role, nt, first)));
      }
    }
    if (d[gaps].empty()) continue;  // no loop stamps (Traits::kTraceLoop false)
    std::printf("consumer warpgroup %d, key tile %u of the loop (%zu samples), median cycles:", role - 1,
                sm90::kTraceKeyTile, d[gaps].size());
    for (int e = 0; e < gaps; ++e) {
      std::printf("%s %s (e%d-e%d) %.0f", e == 0 ? "" : ",", loop_names[e], first + e + 1, first + e, median(d[e]));
    }
    std::printf("; whole %.0f\n", median(d[gaps]));
  }
  // Producer: tile start -> Q issued -> first K/V stage issued -> all issued; and how far ahead of the
  // consumers it runs (its first stage of tile nt against consumer 0's epilogue end of tile nt - 1).
  std::vector<double> pq, pfirst, pall, ahead;
  for (int c = 0; c < ctas; ++c) {
    for (int nt = 1; nt < sm90::kTraceTiles && at(c, 0, nt, 3) != 0; ++nt) {
      pq.push_back(static_cast<double>(at(c, 0, nt, 1) - at(c, 0, nt, 0)));
      pfirst.push_back(static_cast<double>(at(c, 0, nt, 2) - at(c, 0, nt, 1)));
      pall.push_back(static_cast<double>(at(c, 0, nt, 3) - at(c, 0, nt, 0)));
      if (at(c, 1, nt - 1, 8) != 0) ahead.push_back(static_cast<double>(at(c, 1, nt - 1, 8) - at(c, 0, nt, 2)));
    }
  }
  std::printf("producer, median cycles: Q issued %.0f after the tile's start, first K/V stage %.0f after Q, whole "
              "tile %.0f;\n  the first K/V stage of tile n issued %.0f cycles before consumer 0 ends tile n - 1\n",
              median(pq), median(pfirst), median(pall), median(ahead));
  CHECK(cudaFree(dtrace));
  for (void* ptr : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                    static_cast<void*>(dlut), static_cast<void*>(dcounts)}) {
    CHECK(cudaFree(ptr));
  }
  for (void* ptr : fp8_buffers) CHECK(cudaFree(ptr));
  return 0;
}

// The modes compiled for tile Base (bits as in main): has() says whether `mode` is one, run() runs its kernel.
template <class Base, int... Ms>
struct Modes {
  static bool has(int mode) { return ((mode == Ms) || ...); }
  static int run_mode(int mode, double density, int timed) {
    int rc = 2;
    (void)((mode == Ms && (rc = run<ByMode<Base, Ms>>(density, timed), true)) || ...);
    return rc;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const double density = argc > 1 ? std::atof(argv[1]) : 0.1;
  const int blkk = argc > 2 ? std::atoi(argv[2]) : 128;
  const int timed = argc > 3 ? std::atoi(argv[3]) : 20;
  const int mode = argc > 4 ? std::atoi(argv[4]) : 0;
  // mode bit 0: stamps inside key tile kTraceKeyTile of the loop; bit 1: Traits::kRowStagger flipped; bit 2: no stamps
  // at all (kTrace false, the kernel timed only); bit 3: Traits::kQRegs flipped (Q in registers or not). Each tile
  // compiles the modes its Modes list names. blkk 176: the dense-only 128 x 176 tile (no LUT, density 1, with the
  // launcher's multicast and persistence).
  using M176 = Modes<sm90::Traits<__half, 128, 128, 176>, 0, 2, 4, 6>;
  using M128 = Modes<sm90::Traits<__half, 128, 128, 128>, 0, 1, 2, 3, 4, 6, 8, 12>;
  using M64 = Modes<sm90::Traits<__half, 128, 128, 64, true>, 0, 2, 4>;
  // SPARGE_TRACE_FP8=1: the fp8 recipe's kernels (sm90::Fp8Traits: 128 x 128, and 128 x 64 paired), f16 output.
  using F128 = Modes<sm90::Traits<__half, 128, 128, 128, false, true>, 0, 1, 4>;
  using F64 = Modes<sm90::Traits<__half, 128, 128, 64, true, true>, 0, 1, 4>;
  const char* fp8_env = std::getenv("SPARGE_TRACE_FP8");
  const bool fp8 = fp8_env != nullptr && fp8_env[0] == '1';
  const bool known_f16 = blkk == 176 ? M176::has(mode) : blkk == 128 ? M128::has(mode) : blkk == 64 && M64::has(mode);
  const bool known = fp8 ? (blkk == 128 ? F128::has(mode) : blkk == 64 && F64::has(mode)) : known_f16;
  if (!(density > 0.0 && density <= 1.0) || timed < 1 || !known) {
    std::fprintf(stderr, "usage: sparge_sm90_trace [density in (0, 1]] [blkk 64|128|176] [timed runs >= 1] [mode: "
                         "bit 0 also stamps inside key tile %u of the loop, bit 1 flips Traits::kRowStagger, bit 2 no "
                         "stamps, bit 3 flips Traits::kQRegs; blkk 176: 0, 2, 4, 6; 128: 0..4, 6, 8, 12; 64: 0, 2, 4; "
                         "with SPARGE_TRACE_FP8=1: blkk 128 or 64, modes 0, 1, 4]\n",
                 sm90::kTraceKeyTile);
    return 2;
  }
  std::printf("mode %d%s\n", mode, fp8 ? " (fp8 recipe kernel)" : "");
  if (fp8) return blkk == 128 ? F128::run_mode(mode, density, timed) : F64::run_mode(mode, density, timed);
  if (blkk == 176) return M176::run_mode(mode, density, timed);
  if (blkk == 128) return M128::run_mode(mode, density, timed);
  return M64::run_mode(mode, density, timed);
}
