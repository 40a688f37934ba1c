// `sparge bench`: block map + block-sparse attention + the dense baseline (same kernel, full LUT),
// timed, with optional validation against the CPU backend and the fp64 dense oracle (-v=1).
#pragma once

#include <cstdint>
#include <vector>

#include "args.h"
#include "sparge/ops.h"

namespace sparge::tool {

struct BenchConfig {
  std::int64_t b = 2, hq = 32, hk = 32, sq = 16384, sk = 16384, d = 128;
  DType dtype = DType::f16;
  Backend backend = Backend::cpu;
  bool hnd = false, causal = false, sink = false, smooth_k = true, validate = false;
  int blkq = 128, blkk = 64;
  float scale = 0.0f;
  Recipe recipe = Recipe::none;  // -recipe=fp8: the quantized recipe of block_sparse_attention (docs/quantized.md)
  // PerHead values (one value each, or empty); the params structs point into these vectors.
  std::vector<float> topk, cdf, simthreshd1, pv_threshold;
  int warmup = 2, repeat = 10, threads = 0;
  std::uint64_t seed = 0;
  bool seed_given = false;
  double oracle_gflop = 100;  // budget of the fp64 oracle in validation

  BlockMapParams block_map_params(void* q, void* k, void* lut, void* counts, void* stream) const;
  BlockSparseAttentionParams attention_params(void* q, void* k, void* v, void* o, void* lse, void* lut,
                                              void* counts, void* stream) const;
  // supported() of both operations on this shape, without allocating anything.
  Status precheck() const;
};

// Reads the bench flags (UsageError on bad ones). Backend default: cuda when usable, else cpu.
BenchConfig parse_bench(Args& a);
int run_bench(const BenchConfig& cfg);

// The -v=1 part of bench (bench_check.cpp). Host copies of the inputs, the backend's outputs
// downloaded to the host, and the LUT the attention ran on. Returns true when every part passes.
struct BenchHostData {
  const void* q;
  const void* k;
  const void* v;
  const void* o;            // backend output, dtype cfg.dtype, same layout as q
  const float* lse;         // [B, Hq, Sq]
  const std::int32_t* lut;  // [B, Hq, NQ, NK]
  const std::int32_t* counts;
};
bool validate_bench(const BenchConfig& cfg, const BenchHostData& h);

}  // namespace sparge::tool
