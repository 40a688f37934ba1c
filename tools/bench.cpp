#include "bench.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "common.h"
#include "device.h"
#include "lut.h"

namespace sparge::tool {

namespace {

// A non-null address for supported() checks that read no memory.
void* fake_ptr() { return reinterpret_cast<void*>(std::uintptr_t{1} << 24); }

std::string per_head_str(const std::vector<float>& v) {
  if (v.empty()) return "off";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v[0]));
  return buf;
}

double tflops(std::int64_t pairs, std::int64_t d, double ms) {
  return ms > 0 ? 4.0 * static_cast<double>(pairs) * static_cast<double>(d) / (ms * 1e-3) / 1e12 : 0.0;
}

// Warmup runs, then `repeat` timed runs; CPU runs report progress on stderr.
Timing time_runs(Timer& timer, const BenchConfig& cfg, const std::string& label,
                 const std::function<Status()>& call) {
  std::vector<double> ms;
  std::unique_ptr<Heartbeat> hb;
  if (cfg.backend == Backend::cpu) hb = std::make_unique<Heartbeat>("bench " + label, cfg.warmup + cfg.repeat);
  for (int i = 0; i < cfg.warmup + cfg.repeat; ++i) {
    const double t = timer.time_ms(call, label);
    if (i >= cfg.warmup) ms.push_back(t);
    if (hb) hb->add();
  }
  return summarize(ms);
}

void print_row(const char* stage, const Timing& t, double tf, const std::string& note) {
  char tfs[32] = "-";
  if (tf > 0) std::snprintf(tfs, sizeof tfs, tf >= 10 ? "%.1f" : "%.3g", tf);
  std::printf("%-20s %10.3f %10.3f %10.3f %10s  %s\n", stage, t.median, t.min, t.max, tfs, note.c_str());
}

}  // namespace

BlockMapParams BenchConfig::block_map_params(void* q, void* k, void* lut, void* counts, void* stream) const {
  BlockMapParams p;
  p.q = bshd_view(q, dtype, b, sq, hq, d, hnd);
  p.k = bshd_view(k, dtype, b, sk, hk, d, hnd);
  p.blkq = blkq;
  p.blkk = blkk;
  p.scale = scale;
  p.topk = topk;
  p.cdfthreshd = cdf;
  p.simthreshd1 = simthreshd1;
  p.is_causal = causal;
  p.attention_sink = sink;
  p.smooth_k = smooth_k;
  const std::int64_t nq = num_blocks(sq, blkq), nk = num_blocks(sk, blkk);
  p.lut = make_tensor(lut, DType::i32, {b, hq, nq, nk});
  p.counts = make_tensor(counts, DType::i32, {b, hq, nq});
  p.exec = {backend, stream, threads};
  return p;
}

BlockSparseAttentionParams BenchConfig::attention_params(void* q, void* k, void* v, void* o, void* lse, void* lut,
                                                         void* counts, void* stream) const {
  BlockSparseAttentionParams p;
  p.q = bshd_view(q, dtype, b, sq, hq, d, hnd);
  p.k = bshd_view(k, dtype, b, sk, hk, d, hnd);
  p.v = bshd_view(v, dtype, b, sk, hk, d, hnd);
  p.o = bshd_view(o, dtype, b, sq, hq, d, hnd);
  p.maybe_lse = make_tensor(lse, DType::f32, {b, hq, sq});
  const std::int64_t nq = num_blocks(sq, blkq), nk = num_blocks(sk, blkk);
  p.lut = make_tensor(lut, DType::i32, {b, hq, nq, nk});
  p.counts = make_tensor(counts, DType::i32, {b, hq, nq});
  p.blkq = blkq;
  p.blkk = blkk;
  p.scale = scale;
  p.is_causal = causal;
  p.pv_threshold = pv_threshold;
  p.recipe = recipe;
  p.smooth_k = smooth_k;
  p.exec = {backend, stream, threads};
  return p;
}

Status BenchConfig::precheck() const {
  // Tensors the host validation never reads get a fake address; the CPU backend's validation reads
  // the LUT and counts, so those are real (an empty LUT: counts 0, -1 padding).
  void* f = fake_ptr();
  const Status a = supported(block_map_params(f, f, f, f, nullptr));
  if (!a.ok()) return a;
  std::vector<std::int32_t> lut(static_cast<size_t>(b * hq * num_blocks(sq, blkq) * num_blocks(sk, blkk)), -1);
  std::vector<std::int32_t> counts(static_cast<size_t>(b * hq * num_blocks(sq, blkq)), 0);
  return supported(attention_params(f, f, f, f, f, lut.data(), counts.data(), nullptr));
}

BenchConfig parse_bench(Args& a) {
  BenchConfig c;
  constexpr std::int64_t kMaxDim = std::int64_t{1} << 31;
  const std::string backend = a.get_choice("backend", cuda_available() ? "cuda" : "cpu", {"cpu", "cuda"});
  c.backend = backend == "cuda" ? Backend::cuda : Backend::cpu;
  c.b = a.get_int("b", c.b, 1, kMaxDim);
  c.hq = a.get_int("h", c.hq, 1, kMaxDim);
  c.hk = a.get_int("hk", c.hq, 1, c.hq);
  if (c.hq % c.hk != 0) {
    throw UsageError("sparge bench: -hk=" + std::to_string(c.hk) + ": must divide -h=" + std::to_string(c.hq));
  }
  c.sq = a.get_int("s", c.sq, 1, kMaxDim);
  c.sk = a.get_int("sk", c.sq, 1, kMaxDim);
  c.d = a.get_int("d", c.d, 1, 1024);
  const auto topk = a.get_optional_float("topk", 0.0, 1.0, true);
  const auto cdf = a.get_optional_float("cdf", 0.0, 1.0, true);
  if (topk && cdf) throw UsageError("sparge bench: -topk and -cdf exclude each other (give one)");
  if (cdf) c.cdf = {static_cast<float>(*cdf)};
  else c.topk = {static_cast<float>(topk ? *topk : 0.4)};
  // Negative = no similarity test (every block self-similar).
  const double sim = a.get_float("simthreshd1", 0.001, -1.0, 1.0);
  if (sim >= 0) c.simthreshd1 = {static_cast<float>(sim)};
  if (const auto pv = a.get_optional_float("pvthreshd", 0.0, 1e6)) c.pv_threshold = {static_cast<float>(*pv)};
  c.causal = a.get_bool("causal", false);
  c.sink = a.get_bool("sink", false);
  c.smooth_k = a.get_bool("smoothk", true);
  c.validate = a.get_bool("v", false);
  c.blkq = static_cast<int>(a.get_int("blkq", 128, 1, 1024));
  if (c.blkq != 64 && c.blkq != 128) throw UsageError("sparge bench: -blkq=" + std::to_string(c.blkq) + ": expected 64 or 128");
  c.blkk = static_cast<int>(a.get_int("blkk", 64, 1, 1024));
  if (c.blkk != 64 && c.blkk != 128) throw UsageError("sparge bench: -blkk=" + std::to_string(c.blkk) + ": expected 64 or 128");
  c.scale = static_cast<float>(a.get_float("scale", 0.0, 0.0, 1e6));
  c.dtype = parse_dtype(a.get_choice("dtype", "fp16", {"fp16", "bf16", "fp32"}));
  c.hnd = a.get_choice("layout", "nhd", {"nhd", "hnd"}) == "hnd";
  c.recipe = a.get_choice("recipe", "none", {"none", "fp8"}) == "fp8" ? Recipe::fp8 : Recipe::none;
  const bool cpu = c.backend == Backend::cpu;
  c.warmup = static_cast<int>(a.get_int("warmup", cpu ? 1 : 2, 0, 100000));
  c.repeat = static_cast<int>(a.get_int("repeat", cpu ? 3 : 10, 1, 100000));
  c.threads = static_cast<int>(a.get_int("threads", 0, 0, 4096));
  c.seed_given = a.has("seed");
  c.seed = c.seed_given ? a.get_u64("seed", 0) : fresh_seed();
  c.oracle_gflop = a.get_float("oracle_gflop", 100.0, 0.0, 1e9, true);
  a.finish();
  return c;
}

int run_bench(const BenchConfig& cfg) {
  const std::int64_t nq = num_blocks(cfg.sq, cfg.blkq), nk = num_blocks(cfg.sk, cfg.blkk);
  std::printf("sparge bench: backend=%s (%s) dtype=%s b=%lld hq=%lld hk=%lld sq=%lld sk=%lld d=%lld layout=%s "
              "causal=%d blkq=%d blkk=%d %s=%s simthreshd1=%s pvthreshd=%s sink=%d smoothk=%d recipe=%s seed=%llu%s\n",
              to_string(cfg.backend), device_description(cfg.backend, cfg.threads).c_str(), dtype_flag(cfg.dtype),
              (long long)cfg.b, (long long)cfg.hq, (long long)cfg.hk, (long long)cfg.sq, (long long)cfg.sk,
              (long long)cfg.d, cfg.hnd ? "hnd" : "nhd", cfg.causal, cfg.blkq, cfg.blkk,
              cfg.cdf.empty() ? "topk" : "cdf", per_head_str(cfg.cdf.empty() ? cfg.topk : cfg.cdf).c_str(),
              per_head_str(cfg.simthreshd1).c_str(), per_head_str(cfg.pv_threshold).c_str(), cfg.sink, cfg.smooth_k,
              to_string(cfg.recipe), (unsigned long long)cfg.seed, cfg.seed_given ? "" : " (fresh; pass -seed to reproduce)");
  check(cfg.precheck(), "checking the shape on backend " + std::string(to_string(cfg.backend)));

  // Inputs: random normal on the host (kept for validation), uploaded for CUDA.
  const std::int64_t nqel = cfg.b * cfg.sq * cfg.hq * cfg.d, nkel = cfg.b * cfg.sk * cfg.hk * cfg.d;
  HostArray q(cfg.dtype, nqel), k(cfg.dtype, nkel), v(cfg.dtype, nkel);
  fill_normal(q, mix_seed(cfg.seed, 1), cfg.threads);
  fill_normal(k, mix_seed(cfg.seed, 2), cfg.threads);
  fill_normal(v, mix_seed(cfg.seed, 3), cfg.threads);
  const Backend be = cfg.backend;
  DeviceBuffer dq = DeviceBuffer::mirror(be, q.data(), q.bytes(), "q");
  DeviceBuffer dk = DeviceBuffer::mirror(be, k.data(), k.bytes(), "k");
  DeviceBuffer dv = DeviceBuffer::mirror(be, v.data(), v.bytes(), "v");
  const std::size_t lut_n = static_cast<size_t>(cfg.b * cfg.hq * nq * nk), rows = static_cast<size_t>(cfg.b * cfg.hq * nq);
  const std::size_t lse_bytes = static_cast<size_t>(cfg.b * cfg.hq * cfg.sq) * 4;
  DeviceBuffer dlut(be, lut_n * 4, "lut"), dcounts(be, rows * 4, "counts");
  DeviceBuffer dout(be, q.bytes(), "o"), dlse(be, lse_bytes, "lse");
  Stream stream(be);
  Timer timer(be, stream);

  const BlockMapParams bm = cfg.block_map_params(dq.data(), dk.data(), dlut.data(), dcounts.data(), stream.handle());
  const Timing t_map = time_runs(timer, cfg, "block map", [&] { return build_block_map(bm); });
  std::vector<std::int32_t> lut(lut_n), counts(rows);
  dlut.download(lut.data(), lut_n * 4);
  dcounts.download(counts.data(), rows * 4);

  const BlockSparseAttentionParams ap = cfg.attention_params(dq.data(), dk.data(), dv.data(), dout.data(), dlse.data(),
                                                             dlut.data(), dcounts.data(), stream.handle());
  dout.fill_bytes(0xff);  // NaN in every float dtype: an unwritten element fails validation
  const Timing t_attn = time_runs(timer, cfg, "sparse attention", [&] { return block_sparse_attention(ap); });

  // Validation reads the sparse outputs; fetch them before the dense run reuses nothing of them.
  HostArray o_host;
  std::vector<float> lse_host;
  if (cfg.validate) {
    o_host = HostArray(cfg.dtype, nqel);
    dout.download(o_host.data(), o_host.bytes());
    lse_host.resize(lse_bytes / 4);
    dlse.download(lse_host.data(), lse_bytes);
  }

  // Dense baseline: the same kernel on a LUT that selects every visible block.
  const BlockGeom g{cfg.sq, cfg.sk, cfg.blkq, cfg.blkk, cfg.causal};
  std::vector<std::int32_t> full, full_counts;
  full_lut(g, static_cast<std::int64_t>(rows), full, full_counts);
  DeviceBuffer dfull = DeviceBuffer::mirror(be, full.data(), lut_n * 4, "full lut");
  DeviceBuffer dfull_counts = DeviceBuffer::mirror(be, full_counts.data(), rows * 4, "full counts");
  const BlockSparseAttentionParams dp = cfg.attention_params(dq.data(), dk.data(), dv.data(), dout.data(), dlse.data(),
                                                             dfull.data(), dfull_counts.data(), stream.handle());
  const Timing t_dense = time_runs(timer, cfg, "dense attention", [&] { return block_sparse_attention(dp); });

  // The device's copy rate in this run (CUDA): Q and K copied once each, device to device, i.e. the
  // time to read them once and write as much. Issue #3's bound for the block map: at most 2x one
  // read of Q and K at the copy bandwidth (read + write), which is this copy's time.
  // And a plain streaming read of Q and K (read_probe): the rate the block map's passes could read
  // at. The block map reads Q once and K twice with smooth_k.
  Timing t_copy{}, t_read{};
  if (be == Backend::cuda) {
    DeviceBuffer cq(be, q.bytes(), "copy of q"), ck(be, k.bytes(), "copy of k");
    t_copy = time_runs(timer, cfg, "device copy", [&]() -> Status {
      const Status a = cq.copy_from(dq, q.bytes(), stream);
      return a.ok() ? ck.copy_from(dk, k.bytes(), stream) : a;
    });
    if (q.bytes() % 16 == 0 && k.bytes() % 16 == 0) {
      DeviceBuffer sink(be, 16, "read sink");
      t_read = time_runs(timer, cfg, "device read", [&]() -> Status {
        const Status a = dq.read_once(q.bytes(), sink, stream);
        return a.ok() ? dk.read_once(k.bytes(), sink, stream) : a;
      });
    }
  }

  const auto pairs = pair_table(g);
  const LutStats s = lut_stats(g, pairs, lut.data(), counts.data(), static_cast<std::int64_t>(rows));
  const LutStats sd = lut_stats(g, pairs, full.data(), full_counts.data(), static_cast<std::int64_t>(rows));
  const double total_ms = t_map.median + t_attn.median;
  Timing t_total{total_ms, t_map.min + t_attn.min, t_map.max + t_attn.max};

  std::printf("density: %.4f of visible blocks (%lld / %lld), %.4f of the full grid (%lld blocks); "
              "%.4f of the dense query-key pairs\n",
              s.sum_visible ? double(s.sum_counts) / double(s.sum_visible) : 0.0, (long long)s.sum_counts,
              (long long)s.sum_visible, s.grid ? double(s.sum_counts) / double(s.grid) : 0.0, (long long)s.grid,
              sd.pairs ? double(s.pairs) / double(sd.pairs) : 0.0);
  std::printf("timing: %d warmup + %d timed runs each, %s\n", cfg.warmup, cfg.repeat,
              be == Backend::cuda ? "CUDA events" : "steady_clock");
  std::printf("%-20s %10s %10s %10s %10s  %s\n", "stage", "median_ms", "min_ms", "max_ms", "TFLOPS", "note");
  char note[160];
  std::snprintf(note, sizeof note, "%.1f%% of total", total_ms > 0 ? 100.0 * t_map.median / total_ms : 0.0);
  print_row("block map", t_map, 0, note);
  std::snprintf(note, sizeof note, "computed blocks; dense-equivalent %.3g TFLOPS", tflops(sd.pairs, cfg.d, t_attn.median));
  print_row("sparse attention", t_attn, tflops(s.pairs, cfg.d, t_attn.median), note);
  std::snprintf(note, sizeof note, "map + attention; dense-equivalent %.3g TFLOPS", tflops(sd.pairs, cfg.d, total_ms));
  print_row("sparse total", t_total, tflops(s.pairs, cfg.d, total_ms), note);
  print_row("dense (full LUT)", t_dense, tflops(sd.pairs, cfg.d, t_dense.median), "same kernel, every visible block");
  if (t_copy.median > 0) {
    const double qk_bytes = static_cast<double>(q.bytes() + k.bytes());
    std::snprintf(note, sizeof note, "Q and K read once, written once: %.2f TB/s (read + write)",
                  2.0 * qk_bytes / (t_copy.median * 1e-3) / 1e12);
    print_row("device copy", t_copy, 0, note);
    std::printf("block map / device copy of Q and K = %.3f (at most 2x one read of Q and K at the copy bandwidth "
                "means <= 1)\n",
                t_map.median / t_copy.median);
  }
  if (t_read.median > 0) {
    const double q_bytes = static_cast<double>(q.bytes()), k_bytes = static_cast<double>(k.bytes());
    const double rate = (q_bytes + k_bytes) / (t_read.median * 1e-3);
    std::snprintf(note, sizeof note, "Q and K read once by a plain streaming kernel: %.2f TB/s", rate / 1e12);
    print_row("device read", t_read, 0, note);
    const double floor_ms = (q_bytes + (cfg.smooth_k ? 2.0 : 1.0) * k_bytes) / rate * 1e3;
    std::printf("block map / its reads at that rate (Q once, K %s) = %.3f (%.3f ms)\n", cfg.smooth_k ? "twice" : "once",
                t_map.median / floor_ms, floor_ms);
  }
  std::printf("speedup over dense: attention %.2fx, total (block map included) %.2fx\n",
              t_attn.median > 0 ? t_dense.median / t_attn.median : 0.0, total_ms > 0 ? t_dense.median / total_ms : 0.0);
  std::fflush(stdout);

  if (!cfg.validate) return 0;
  const BenchHostData hd{q.data(), k.data(), v.data(), o_host.data(), lse_host.data(), lut.data(), counts.data()};
  return validate_bench(cfg, hd) ? 0 : kExitFail;
}

}  // namespace sparge::tool
