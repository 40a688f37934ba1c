// `sparge topk`: times topk_select on random normal scores [R, N] and, with -v=1, checks every row
// against the rule of docs/semantics.md (lut.cpp's topk_reference) and, on cuda, against the CPU
// backend.
#include <cstdio>
#include <cstring>

#include "commands.h"
#include "common.h"
#include "device.h"
#include "lut.h"

namespace sparge::tool {

int run_topk(Args& a) {
  const std::string backend_s = a.get_choice("backend", cuda_available() ? "cuda" : "cpu", {"cpu", "cuda"});
  const Backend be = backend_s == "cuda" ? Backend::cuda : Backend::cpu;
  const std::int64_t r = a.get_int("r", 512, 1, std::int64_t{1} << 31);
  const std::int64_t n = a.get_int("n", 131072, 1, std::int64_t{1} << 31);
  const int k = static_cast<int>(a.get_int("k", std::min<std::int64_t>(2048, n), 1, n));
  const DType dt = parse_dtype(a.get_choice("dtype", "fp32", {"fp32", "fp16"}));
  const bool validate = a.get_bool("v", false);
  const bool cpu = be == Backend::cpu;
  const int warmup = static_cast<int>(a.get_int("warmup", cpu ? 1 : 2, 0, 100000));
  const int repeat = static_cast<int>(a.get_int("repeat", cpu ? 3 : 10, 1, 100000));
  const int threads = static_cast<int>(a.get_int("threads", 0, 0, 4096));
  const bool seed_given = a.has("seed");
  const std::uint64_t seed = seed_given ? a.get_u64("seed", 0) : fresh_seed();
  a.finish();

  std::printf("sparge topk: backend=%s (%s) dtype=%s r=%lld n=%lld k=%d seed=%llu%s\n", to_string(be),
              device_description(be, threads).c_str(), dtype_flag(dt), (long long)r, (long long)n, k,
              (unsigned long long)seed, seed_given ? "" : " (fresh; pass -seed to reproduce)");
  HostArray scores(dt, r * n);
  fill_normal(scores, mix_seed(seed, 7), threads);
  DeviceBuffer ds = DeviceBuffer::mirror(be, scores.data(), scores.bytes(), "scores");
  DeviceBuffer di(be, static_cast<size_t>(r * k) * 4, "indices"), dc(be, static_cast<size_t>(r) * 4, "counts");
  Stream stream(be);
  Timer timer(be, stream);
  TopkSelectParams p;
  p.scores = make_tensor(ds.data(), dt, {r, n});
  p.k = k;
  p.indices = make_tensor(di.data(), DType::i32, {r, k});
  p.maybe_counts = make_tensor(dc.data(), DType::i32, {r});
  p.exec = {be, stream.handle(), threads};
  check(supported(p), "topk_select on backend " + std::string(to_string(be)));

  std::vector<double> ms;
  for (int i = 0; i < warmup + repeat; ++i) {
    const double t = timer.time_ms([&] { return topk_select(p); }, "topk_select");
    if (i >= warmup) ms.push_back(t);
  }
  const Timing t = summarize(ms);
  const double gbs = t.median > 0 ? static_cast<double>(scores.bytes()) / (t.median * 1e-3) / 1e9 : 0.0;
  std::printf("timing: %d warmup + %d timed runs, %s\n", warmup, repeat, cpu ? "steady_clock" : "CUDA events");
  std::printf("topk_select: median %.3f ms (min %.3f, max %.3f), %.3g GB/s of scores read, %.3g Mrows/s\n",
              t.median, t.min, t.max, gbs, t.median > 0 ? static_cast<double>(r) / (t.median * 1e-3) / 1e6 : 0.0);
  if (!validate) return 0;

  std::vector<std::int32_t> idx(static_cast<size_t>(r * k)), cnt(static_cast<size_t>(r));
  di.download(idx.data(), idx.size() * 4);
  dc.download(cnt.data(), cnt.size() * 4);
  std::vector<std::int32_t> cpu_idx, cpu_cnt;
  if (!cpu) {
    cpu_idx.resize(idx.size());
    cpu_cnt.resize(cnt.size());
    TopkSelectParams c = p;
    c.scores = make_tensor(scores.data(), dt, {r, n});
    c.indices = make_tensor(cpu_idx.data(), DType::i32, {r, k});
    c.maybe_counts = make_tensor(cpu_cnt.data(), DType::i32, {r});
    c.exec = {Backend::cpu, nullptr, threads};
    check(topk_select(c), "cpu topk_select (reference)");
  }
  std::int64_t bad = 0, bad_cpu = 0, first = -1;
  std::vector<float> row(static_cast<size_t>(n));
  std::vector<std::int32_t> want(static_cast<size_t>(k));
  for (std::int64_t i = 0; i < r; ++i) {
    for (std::int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = scores.get(i * n + j);
    const std::int32_t wc = topk_reference(row.data(), n, k, want.data());
    const std::int32_t* got = idx.data() + i * k;
    if (cnt[static_cast<size_t>(i)] != wc || std::memcmp(got, want.data(), static_cast<size_t>(k) * 4) != 0) {
      if (first < 0) first = i;
      ++bad;
    }
    if (!cpu && (cpu_cnt[static_cast<size_t>(i)] != cnt[static_cast<size_t>(i)] ||
                 std::memcmp(got, cpu_idx.data() + i * k, static_cast<size_t>(k) * 4) != 0)) {
      ++bad_cpu;
    }
  }
  std::printf("%-10s %s  %lld of %lld rows differ from the rule (exact indices and counts)%s\n", "topk:",
              bad == 0 && bad_cpu == 0 ? "PASS" : "FAIL", (long long)bad, (long long)r,
              cpu ? "" : (", " + std::to_string(bad_cpu) + " rows differ from the cpu backend").c_str());
  if (first >= 0) std::printf("           first bad row: %lld\n", (long long)first);
  return bad == 0 && bad_cpu == 0 ? 0 : kExitFail;
}

}  // namespace sparge::tool
