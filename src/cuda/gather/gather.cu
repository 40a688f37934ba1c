// gather_attention on CUDA (docs/semantics.md, "Stage 3"): each query row attends the keys of its
// own index list. Two kernels per wave of groups (gather_common.cuh):
//   union.cuh      per group: sorted union of the rows' lists + each row's membership mask;
//   attention.cuh  flash attention of BM rows of a group over the union, masked per row
//                  (mma.sync, sm_80+); attention_wgmma.cuh the same walk with wgmma (sm_90a),
//                  attention_ws.cuh warp-specialized (sm_90a; the default for groups of >= 64
//                  rows), chosen per call by SPARGE_GATHER_PATH (select_attention below).
// Tiles: with group_union, a group is the Hq/Hk heads of one kv head x union_rows consecutive query
// positions, so adjacent tokens that select overlapping keys share each K/V load. Without it, a
// group is the Hq/Hk heads of one kv head at ONE query position: the path that always runs, with
// no assumption about how lists overlap (its tile is mostly empty rows when Hq/Hk is small; it is
// memory-bound anyway, one K/V row per listed key).
// Both walk the union in ascending key order, so a row's summation order differs from the CPU's
// list order: results agree within rounding, bitwise only with themselves (deterministic).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/func_attr.h"
#include "cuda/gather/attention.cuh"
#include "cuda/gather/attention_wgmma.cuh"
#include "cuda/gather/attention_ws.cuh"
#include "cuda/gather/union.cuh"
#include "cuda/scratch_pool.h"
#include "cuda/topk/error_flags.cuh"
#include "validate/validate.h"

namespace sparge::cuda {

namespace {

constexpr const char* kOp = "gather_attention";
// The union bitmap and its ranks live in shared memory: 8 bytes per 32 keys.
constexpr std::int64_t kMaxUnionSmem = 160 * 1024;
// Scratch (union lists + masks) per wave of groups; more groups run in several waves.
constexpr std::int64_t kScratchBudget = 256ll << 20;
// Shared memory for the masks of a union CTA's rows (phase B batches rows to fit).
constexpr std::int64_t kMaskSmem = 72 * 1024;
// A union CTA takes the position map only while its whole shared memory stays within this, so
// that two CTAs (the register limit) still fit on an SM of 228 KB.
constexpr std::int64_t kPosMapSmemCap = 112 * 1024;
// The same cap for the list bitmaps of variant kRowBitmaps (Sk = 16384: 2 KB per list; 32 lists
// per CTA at PERF.md's shape), lower by the 4 KB of phase B's static staging rows.
constexpr std::int64_t kRowBitmapSmemCap = 108 * 1024;

using AttnKernel = void (*)(const gather::AttnArgs);

struct GatherPlan {
  Status status;
  DType dtype = DType::f16;
  std::int64_t d = 0;
  // K and V row strides in bytes below 2^31: the ws producer's 32-bit row offsets
  // (attention_ws.cuh, ws_copy_rows); else the ws kernel is not chosen.
  bool rows32 = false;
};

// One attention kernel with its launch shape.
struct AttnChoice {
  AttnKernel kernel = nullptr;
  int threads = 0, smem = 0, tile_rows = 0;
  bool wgmma = false;
  int stages = 0;  // K/V buffers of the wgmma kernel, K/V stages of the warp-specialized one
  const char* name = "mma.sync";
  // The warp-specialized kernel (attention_ws.cuh): its switches, copied into AttnArgs.
  bool ws = false;
  int ws_arrive_wait = 0, ws_pingpong = 1;
  bool prefetch = false;  // SPARGE_GATHER_PREFETCH took effect (the profile line says so)
  bool ws_pair = false;   // the ws consumers take two stages per turn (SPARGE_GATHER_WS_PAIR)
  bool ws_persist = false;  // the persistent ws walk (SPARGE_GATHER_WS_PERSIST): one CTA per SM
};

bool aligned16(const Tensor& t) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (t.stride[i] % 8 != 0) return false;
  }
  return t.stride[3] == 1;
}

template <class T, int D>
AttnChoice pick_kernel(int tile_rows, bool wgmma, int stages = 3, bool prefetch = false) {
  if (wgmma && prefetch && tile_rows <= 128) {
    // SPARGE_GATHER_PREFETCH=1 (attention_wgmma.cuh, "Prefetch"): keys and mask words through
    // shared memory; BM 256 has no such variant.
    if (tile_rows == 64 && stages == 2) {
      return {gather::attention_wgmma_kernel<T, D, 1, 2, true>, gather::WgShape<1, 2, true>::kThreads, gather::WgShape<1, 2, true>::smem_bytes(D), 64, true, 2};
    }
    if (tile_rows == 64) return {gather::attention_wgmma_kernel<T, D, 1, 3, true>, gather::WgShape<1, 3, true>::kThreads, gather::WgShape<1, 3, true>::smem_bytes(D), 64};
    if (stages == 4) {
      return {gather::attention_wgmma_kernel<T, D, 2, 4, true>, gather::WgShape<2, 4, true>::kThreads, gather::WgShape<2, 4, true>::smem_bytes(D), 128, true, 4};
    }
    return {gather::attention_wgmma_kernel<T, D, 2, 3, true>, gather::WgShape<2, 3, true>::kThreads, gather::WgShape<2, 3, true>::smem_bytes(D), 128};
  }
  if (wgmma) {
    if (tile_rows == 64 && stages == 2) {
      return {gather::attention_wgmma_kernel<T, D, 1, 2>, gather::WgShape<1, 2>::kThreads, gather::WgShape<1, 2>::smem_bytes(D), 64, true, 2};
    }
    if (tile_rows == 64) return {gather::attention_wgmma_kernel<T, D, 1>, gather::WgShape<1>::kThreads, gather::WgShape<1>::smem_bytes(D), 64};
    if (tile_rows == 128) return {gather::attention_wgmma_kernel<T, D, 2>, gather::WgShape<2>::kThreads, gather::WgShape<2>::smem_bytes(D), 128};
    return {gather::attention_wgmma_kernel<T, D, 4>, gather::WgShape<4>::kThreads, gather::WgShape<4>::smem_bytes(D), 256};
  }
  if (tile_rows == 64) return {gather::attention_kernel<T, D, 4>, gather::AttnShape<4>::kThreads, gather::AttnShape<4>::smem_bytes(D), 64};
  return {gather::attention_kernel<T, D, 8>, gather::AttnShape<8>::kThreads, gather::AttnShape<8>::smem_bytes(D), 128};
}

// The warp-specialized kernel with C consumer warpgroups and `stages` K/V stages; kPair: its
// paired consumers (hd128, C = 2 only: the instantiations that exist); kPersist: its persistent
// walk (C = 2, unpaired, prefetch).
template <class T, int D, int C, bool kPair = false, bool kPersist = false>
AttnChoice pick_ws(int stages, bool prefetch) {
  AttnChoice c{gather::attention_ws_kernel<T, D, C, kPair, kPersist>, gather::WsShape<C>::kThreads,
               gather::WsShape<C>::smem_bytes(D, stages, prefetch, kPersist), gather::WsShape<C>::kBM, true, stages};
  c.name = "ws";
  c.ws = true;
  c.prefetch = prefetch;
  c.ws_pair = kPair;
  c.ws_persist = kPersist;
  return c;
}
template <class T, int D>
AttnChoice pick_ws(int consumers, int stages, bool prefetch, bool pair, bool persist) {
  if constexpr (D == 128) {
    if (pair && consumers == 2) return pick_ws<T, D, 2, true>(stages, prefetch);
  }
  if (persist && consumers == 2) return pick_ws<T, D, 2, false, true>(stages, true);
  return consumers == 1 ? pick_ws<T, D, 1>(stages, prefetch) : pick_ws<T, D, 2>(stages, prefetch);
}

int env_int(const char* name, int fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return end != nullptr && *end == '\0' ? static_cast<int>(v) : fallback;
}

// SPARGE_GATHER_PREFETCH (read on every call; default on since the H200 round of 2026-11-30
// session 5, =0 turns it off): the wgmma kernels (BM 64 / 128) and the ws kernel's noinc
// producer take the union keys and mask words through shared memory, several steps ahead, with
// cp.async (attention_wgmma.cuh and attention_ws.cuh, "Prefetch"). Same keys, masks and
// arithmetic: bitwise the same output (tested). H200, PERF.md shape: wgmma BM 128 attention
// 0.133 ms with it (~0.155 without); wgmma64 and ws unchanged (0.145-0.148, 0.168-0.170).
bool prefetch_on() { return env_int("SPARGE_GATHER_PREFETCH", 1) != 0; }

// SPARGE_GATHER_PATH=ws (sm_90a; the default for groups of >= 64 rows): the warp-specialized
// kernel. Its switches, read on every call (every variant walks the union in the same order with the same per-row
// arithmetic, so the results are expected to be bitwise the same; the tests check each variant
// against the fp64 oracle, not against each other):
//   SPARGE_GATHER_WS_WG = 1 | 2      consumer warpgroups (BM 64 / 128); default 2 for groups of
//                                    more than 64 rows, else 1 (a second warpgroup would hold only
//                                    rows past the group's end);
//   SPARGE_GATHER_WS_STAGES = 2..8   K/V ring stages, clamped to what 227 KB hold; default: the
//                                    most that fit (BM 128 at hd128: 5 with prefetch), with BM 64 the
//                                    most that let two CTAs share an SM (3 at hd128, 6 at hd64);
//   SPARGE_GATHER_WS_ARRIVE = wait   producer threads wait for their copies, fence and arrive
//                                    (default noinc: cp.async.mbarrier.arrive.noinc; attention_ws.cuh);
//   SPARGE_GATHER_WS_PINGPONG = 0    the two consumer warpgroups issue without taking turns;
//   SPARGE_GATHER_WS_PAIR = 1        hd128, BM 128, prefetch, >= 3 stages: the consumers take two
//                                    stages (128 union positions) per turn: one max, one O rescale,
//                                    one pair of waits and turns per 128 keys (session 11; not
//                                    bitwise the unpaired result: the running max moves per 128;
//                                    H200 s11r6 / s11r7: attention step 0.088 ms against 0.090,
//                                    whole call 1-2%: kept opt-in).
AttnChoice select_ws(const GatherPlan& plan, int group_rows) {
  int consumers = group_rows > 64 ? 2 : 1;
  const int wg_req = env_int("SPARGE_GATHER_WS_WG", 0);
  if (wg_req == 1 || wg_req == 2) consumers = wg_req;
  const int d = static_cast<int>(plan.d);
  const int tile = 64 * d * 2;
  const char* arrive = std::getenv("SPARGE_GATHER_WS_ARRIVE");
  const bool arrive_wait = arrive != nullptr && std::strcmp(arrive, "wait") == 0;
  // SPARGE_GATHER_PREFETCH=1 with the noinc producer only (the wait mode counts commit groups).
  const bool pf = prefetch_on() && !arrive_wait;
  // Prefetch buffers: the per-thread key ring (fixed) + BM mask words per stage.
  const int pf_fixed = pf ? gather::WsShape<1>::pf_key_bytes() : 0;
  const int pf_stage = pf ? 64 * consumers * 8 : 0;
  constexpr int kSmemMax = 227 * 1024;     // one CTA per SM
  constexpr int kSmemHalf = 113 * 1024;    // two CTAs per SM (228 KB less 1 KB per CTA, halved)
  // The persistent walk (attention_ws.cuh, kPersist; session 27, the default since its H200 round s27r2: attention
  // step 0.088 -> 0.082-0.084 ms, 0.124-0.125 -> 0.119-0.120 ms per call back to back at PERF.md's shape), two Q
  // buffers, so one K/V stage fewer at hd128 (4); with two consumer warpgroups, the noinc producer with prefetch,
  // unpaired. SPARGE_GATHER_WS_PERSIST=0: the one-tile-per-CTA grid.
  const bool pair_req = env_int("SPARGE_GATHER_WS_PAIR", 0) == 1;
  const bool persist = env_int("SPARGE_GATHER_WS_PERSIST", 1) == 1 && consumers == 2 && pf && !pair_req;
  const int q_tiles = (persist ? 2 : 1) * consumers;
  const int max_stages = std::min(gather::kWsMaxStages, (kSmemMax - 1024 - pf_fixed - q_tiles * tile) / (2 * tile + pf_stage));
  const int two_cta_stages = std::min(gather::kWsMaxStages, (kSmemHalf - 1024 - pf_fixed - tile) / (2 * tile + pf_stage));
  int stages = consumers == 1 ? two_cta_stages : max_stages;
  const int st_req = env_int("SPARGE_GATHER_WS_STAGES", 0);
  if (st_req >= 2) stages = std::min(st_req, max_stages);
  stages = std::max(stages, 2);
  // Paired consumers need the mask words in the ring (prefetch) and at least 3 stages (a turn
  // holds the previous pair's two V stages while it waits for its two K stages).
  const bool pair = pair_req && pf && stages >= 3;
  const bool f16 = plan.dtype == DType::f16;
  AttnChoice c = d == 64 ? (f16 ? pick_ws<__half, 64>(consumers, stages, pf, pair, persist) : pick_ws<__nv_bfloat16, 64>(consumers, stages, pf, pair, persist))
                         : (f16 ? pick_ws<__half, 128>(consumers, stages, pf, pair, persist) : pick_ws<__nv_bfloat16, 128>(consumers, stages, pf, pair, persist));
  c.ws_arrive_wait = arrive_wait ? 1 : 0;
  c.ws_pingpong = env_int("SPARGE_GATHER_WS_PINGPONG", 1) != 0 ? 1 : 0;
  return c;
}

// Whether the device runs `fn` from code compiled for sm_90 or later (clusters, wgmma), rather
// than from older PTX compiled just in time.
// (Read once per device and kernel: cuda/func_attr.h.)
bool sm90_binary(const void* fn) { return func_ptx_version(fn) >= 90; }

// The attention kernel of a call. SPARGE_GATHER_PATH (read on every call, so one process can
// compare them):
//   mma64, mma128   the portable mma.sync kernel (attention.cuh) with 64- / 128-row tiles;
//   wgmma           the sm_90a kernel (attention_wgmma.cuh), 64-row tiles for groups of at most 64
//                   rows, else 128; wgmma256: 256-row tiles for groups of more than 128 rows;
//   wgmma64         64-row tiles with 2 K/V stages (84 KB at hd128: two CTAs per SM that are not
//                   in lockstep, so one's softmax overlaps the other's MMAs; each CTA gathers
//                   the group's K/V itself, twice the L2 reads of 128-row tiles);
//   mma             the portable kernel, 128-row tiles for groups of at least 128 rows, else 64;
//   ws              the warp-specialized sm_90a kernel (attention_ws.cuh, select_ws above; since
//                   session 10 its attention step is 0.126-0.127 ms at PERF.md's shape against
//                   0.131-0.133 for wgmma, s10r9 / s10r10);
//   unset           on sm_90: "ws" for groups of at least 64 rows (hd128 groups of >= 128 rows
//                   since session 11; session 12: hd64, 0.068 ms against wgmma's 0.139, and groups of
//                   64..127 rows, 0.101 ms against mma's 0.175 with one list per head), else "mma";
//                   elsewhere "mma".
//                   Another value: as unset without the ws default, i.e. "wgmma" (BM 128, 3 stages,
//                   with the default prefetch) for groups of at least 128 rows (H200 2026-11-30
//                   session 5, 256-row groups: 0.133 ms against 0.145 for wgmma64, 0.154-0.156 for
//                   wgmma without prefetch, 0.179 / 0.190 mma64 / mma128), else "mma".
// The wgmma kernels exist for sm_90 only; elsewhere a wgmma request takes the portable default.
// (A per-row group is Hq/Hk rows, so a taller tile than the group is empty rows.)
// The smallest group that takes the ws kernel by default on sm_90 (64: one consumer warpgroup, BM 64,
// for groups of up to 64 rows, e.g. one list per head with union_rows 64).
constexpr int kWsDefaultRows = 64;

AttnChoice select_attention(const GatherPlan& plan, int group_rows, int major) {
  const char* e = std::getenv("SPARGE_GATHER_PATH");
  std::string req = e != nullptr ? e : "";
  // Unset on sm_90, groups of at least kWsDefaultRows rows: ws (hd128 groups of >= 128 rows since
  // session 11; hd64 since session 12, s12r6: attention step 0.068 ms against wgmma's 0.139 at
  // PERF.md's shape with d = 64; 64-row groups since s12r8: 0.101 ms against mma's 0.175).
  const bool ws_default = e == nullptr && major == 9 && group_rows >= kWsDefaultRows;
  if ((req == "ws" || ws_default) && major == 9 && plan.rows32) {
    const AttnChoice c = select_ws(plan, group_rows);
    if (sm90_binary(reinterpret_cast<const void*>(c.kernel))) return c;
  }
  if (req != "mma" && req != "mma64" && req != "mma128" && req != "wgmma" && req != "wgmma256" && req != "wgmma64") {
    req = group_rows >= 128 ? "wgmma" : "mma";
  }
  bool wgmma = false;
  int tile = group_rows >= 128 ? 128 : 64;
  if (req == "mma64") tile = 64;
  if (req == "mma128") tile = 128;
  int stages = 3;
  if ((req == "wgmma" || req == "wgmma256" || req == "wgmma64") && major == 9) {
    wgmma = true;
    tile = group_rows <= 64 ? 64 : (req == "wgmma256" && group_rows > 128 ? 256 : 128);
    if (req == "wgmma64") {
      tile = 64;
      stages = 2;
    }
    // SPARGE_GATHER_WGMMA_STAGES=4 (opt-in, session 5): BM 128 with prefetch and 4 K/V buffers
    // (three steps in flight; 167 KB at hd128, one CTA per SM).
    if (tile == 128 && prefetch_on() && env_int("SPARGE_GATHER_WGMMA_STAGES", 3) == 4) stages = 4;
  }
  const bool f16 = plan.dtype == DType::f16;
  if (wgmma) {
    // Only an sm_90a build has the wgmma body (a compute_80 PTX JIT-compiled for the device
    // would trap): take the portable kernel otherwise.
    const bool pf = prefetch_on() && tile <= 128;
    const AttnChoice c = plan.d == 64 ? (f16 ? pick_kernel<__half, 64>(tile, true, stages, pf) : pick_kernel<__nv_bfloat16, 64>(tile, true, stages, pf))
                                      : (f16 ? pick_kernel<__half, 128>(tile, true, stages, pf) : pick_kernel<__nv_bfloat16, 128>(tile, true, stages, pf));
    if (sm90_binary(reinterpret_cast<const void*>(c.kernel))) {
      AttnChoice r{c.kernel, c.threads, c.smem, c.tile_rows, true, c.stages > 0 ? c.stages : stages};
      r.name = "wgmma";
      r.prefetch = pf;
      return r;
    }
    wgmma = false;
    tile = group_rows >= 128 ? 128 : 64;
  }
  if (plan.d == 64) return f16 ? pick_kernel<__half, 64>(tile, wgmma) : pick_kernel<__nv_bfloat16, 64>(tile, wgmma);
  return f16 ? pick_kernel<__half, 128>(tile, wgmma) : pick_kernel<__nv_bfloat16, 128>(tile, wgmma);
}

// CTAs per group of the union kernel: a cluster of up to 8 on sm_90 (see the default below),
// 1 elsewhere. SPARGE_GATHER_UNION_CTAS = 1, 2, 4 or 8 overrides it (at least one list per CTA;
// values above 1 on sm_90 only). group_rows counts the group's lists (units).
// Default (2026-11-30 session 5): at least 32 lists (two per warp) per CTA, the fewer CTAs that
// still take the row-bitmap path (the host falls back to `fallback` = at least 16 lists per CTA,
// the rule before, when those bitmaps do not fit). H200, PERF.md shape: kv-head lists (64 per
// group) union 0.047 ms with 2 CTAs against 0.063 with 4 and 0.083 with 8; per-query-head lists
// (256 per group) 0.167 with 8 (= 32 per CTA) against 0.230 with 2 (the bitmaps do not fit).
int union_ctas(int group_rows, int major, int* fallback) {
  *fallback = 0;
  if (major < 9 || !sm90_binary(reinterpret_cast<const void*>(gather::union_kernel<false>))) return 1;
  if (const char* e = std::getenv("SPARGE_GATHER_UNION_CTAS")) {
    int v = std::atoi(e);
    if (v == 1 || v == 2 || v == 4 || v == 8) {
      while (v > 1 && v > group_rows) v /= 2;  // at least one row per CTA
      return v;
    }
  }
  // A per-row group (Hq/Hk rows) stays on one CTA.
  auto most = [&](int per_cta) {
    int want = gather::kUnionMaxCtas;
    while (want > 1 && want * per_cta > group_rows) want /= 2;
    return want;
  };
  const int want = most(2 * (gather::kUnionThreads / 32));
  const int before = most(gather::kUnionThreads / 32);
  if (before != want) *fallback = before;
  return want;
}

// SPARGE_GATHER_UNION_VARIANT = bits of gather::UnionVariant (0..7): 1 = kStream (vec4 lists
// streamed with the next batch in flight), 2 = kPosMap (phase B's key -> position map of the
// two-read path), 4 = kRowBitmaps (lists read once into per-list bitmaps, masks by ballot; falls
// back to the two-read path where it does not fit); unset or invalid: 5 = kStream | kRowBitmaps.
// Every value gives the same bits (unions, masks, flags' rows).
int union_variant() {
  constexpr int kDefault = gather::kStream | gather::kRowBitmaps;
  const char* e = std::getenv("SPARGE_GATHER_UNION_VARIANT");
  if (e == nullptr || *e == '\0') return kDefault;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  if (*end != '\0' || v < 0 || v > 7) return kDefault;
  return static_cast<int>(v);
}

// The one selection function of gather_attention (run and supported() share it).
GatherPlan select_gather(const GatherAttentionParams& p) {
  GatherPlan plan;
  auto fail = [](Status s) { return GatherPlan{std::move(s)}; };
  if (p.q.ndim != 4 || p.k.ndim != 4 || p.v.ndim != 4 || p.o.ndim != 4 || p.indices.ndim != 4 || p.counts.ndim != 3) {
    return fail(detail::bad(kOp, "q, k, v, o and indices must be 4-d and counts 3-d"));
  }
  if (p.q.dtype != DType::f16 && p.q.dtype != DType::bf16) {
    return fail(unsupported(detail::cat(kOp, ": q.dtype = ", to_string(p.q.dtype), " is not supported on cuda (expected f16 or bf16)")));
  }
  if (p.k.dtype != p.q.dtype || p.v.dtype != p.q.dtype) {
    return fail(detail::bad(kOp, "k.dtype = ", to_string(p.k.dtype), ", v.dtype = ", to_string(p.v.dtype), " differ from q.dtype = ", to_string(p.q.dtype)));
  }
  if (p.o.dtype != p.q.dtype && p.o.dtype != DType::f32) {
    return fail(unsupported(detail::cat(kOp, ": o.dtype = ", to_string(p.o.dtype), " is not supported on cuda (expected q.dtype or f32)")));
  }
  const std::int64_t d = p.q.shape[3];
  plan.d = d;
  plan.dtype = p.q.dtype;
  const std::int64_t el = p.q.dtype == DType::f32 ? 4 : 2;
  plan.rows32 = p.k.stride[1] * el < (std::int64_t{1} << 31) && p.v.stride[1] * el < (std::int64_t{1} << 31);
  if (d != 64 && d != 128) {
    return fail(unsupported(detail::cat(kOp, ": head dim q.shape[3] = ", d, " is not supported on cuda (expected 64 or 128)")));
  }
  const char* names[3] = {"q", "k", "v"};
  const Tensor* ts[3] = {&p.q, &p.k, &p.v};
  for (int i = 0; i < 3; ++i) {
    if (!aligned16(*ts[i])) {
      return fail(unsupported(detail::cat(kOp, ": ", names[i], " must have a contiguous head dim (", names[i], ".stride[3] = ", ts[i]->stride[3],
                                          ") and 16-byte aligned rows (data and strides 0..2 multiples of 8 elements) on cuda")));
    }
  }
  const std::int64_t sk = p.k.shape[1];
  if (sk > INT32_MAX || p.indices.shape[3] > INT32_MAX) return fail(detail::bad(kOp, "k.shape[1] = ", sk, " exceeds 2^31 - 1"));
  const std::int64_t union_smem = 8 * ((sk + 31) / 32);
  if (union_smem > kMaxUnionSmem) {
    return fail(unsupported(detail::cat(kOp, ": Sk = ", sk, " is too long for the cuda union bitmap (at most ", kMaxUnionSmem / 8 * 32, " keys)")));
  }
  if (p.group_union && (p.union_rows < 1 || p.union_rows > 4096)) {
    return fail(detail::bad(kOp, "union_rows = ", p.union_rows, " (expected 1..4096 with group_union)")); 
  }
  return plan;
}

// The error of list `row` (linear (b * L + h) * Sq + i, L = indices.shape[1]), found the way the
// CPU backend finds it. (With kv-head lists the lowest failing list is the list of the lowest
// failing query row, the one the CPU backend reports.)
Status describe_bad_row(const GatherAttentionParams& p, const gather::Geometry& geo, std::uint64_t row) {
  const std::int64_t heads = p.indices.shape[1];
  const auto i = static_cast<std::int64_t>(row % static_cast<std::uint64_t>(geo.sq));
  const auto h = static_cast<std::int64_t>((row / static_cast<std::uint64_t>(geo.sq)) % static_cast<std::uint64_t>(heads));
  const auto b = static_cast<std::int64_t>(row / static_cast<std::uint64_t>(geo.sq * heads));
  const std::int64_t n_max = p.indices.shape[3];
  std::int32_t n = 0;
  if (cudaMemcpy(&n, p.counts.ptr<std::int32_t>() + p.counts.offset(b, h, i), 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return runtime_error(detail::cat(kOp, ": cannot read counts back to report an error"));
  }
  if (n < 0 || n > n_max) {
    return detail::bad(kOp, "counts[", b, ", ", h, ", ", i, "] = ", n, " is out of range (expected 0..", n_max, " = indices.shape[3])");
  }
  std::vector<std::int32_t> seen_list;
  for (std::int32_t t = 0; t < n; ++t) {
    std::int32_t j = 0;
    if (cudaMemcpy(&j, p.indices.ptr<std::int32_t>() + p.indices.offset(b, h, i, t), 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return runtime_error(detail::cat(kOp, ": cannot read indices back to report an error"));
    }
    if (j < 0 || j >= geo.sk) {
      return detail::bad(kOp, "indices[", b, ", ", h, ", ", i, ", ", t, "] = ", j, " is out of range (expected 0..", geo.sk - 1,
                         " = Sk - 1; b = ", b, ", h = ", h, ", i = ", i, ", within counts = ", n, ")");
    }
    if (std::find(seen_list.begin(), seen_list.end(), j) != seen_list.end()) {
      return detail::bad(kOp, "indices[", b, ", ", h, ", ", i, ", ", t, "] = ", j, " repeats an earlier entry of the same list (b = ", b,
                         ", h = ", h, ", i = ", i, "); a key may be listed once per row");
    }
    seen_list.push_back(j);
  }
  return runtime_error(detail::cat(kOp, ": the kernel flagged row (", b, ", ", h, ", ", i, ") but its list reads back valid"));
}

// SPARGE_GATHER_OVERLAP = N (2..64): run the groups in N waves with the unions on a side stream;
// unset, < 2 or invalid: one stream, as many waves as the scratch budget needs.
int overlap_waves() {
  const char* e = std::getenv("SPARGE_GATHER_OVERLAP");
  if (e == nullptr) return 0;
  const int v = std::atoi(e);
  return v >= 2 ? std::min(v, 64) : 0;
}

// The side stream of the overlap mode. init() creates it and makes it wait for everything the
// caller's stream holds so far (inputs, scratch allocation, flag reset); join() makes the caller's
// stream wait for everything the side stream was given. The destructor joins as well, so that on
// an early error return no scratch buffer is freed (stream-ordered, on the caller's stream) while
// a union kernel may still use it.
struct SideStream {
  cudaStream_t main;
  cudaStream_t s = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  cudaEvent_t union_done[2] = {}, attn_done[2] = {};
  bool joined = true;
  explicit SideStream(cudaStream_t m) : main(m) {}
  cudaError_t init() {
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEvent_t* evs[6] = {&start, &end, &union_done[0], &union_done[1], &attn_done[0], &attn_done[1]};
    for (cudaEvent_t* ev : evs) {
      if (e == cudaSuccess) e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) e = cudaEventRecord(start, main);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, start, 0);
    if (e == cudaSuccess) joined = false;
    return e;
  }
  void join() {
    if (joined || s == nullptr) return;
    if (cudaEventRecord(end, s) == cudaSuccess) cudaStreamWaitEvent(main, end, 0);
    joined = true;
  }
  ~SideStream() {
    join();
    cudaEvent_t evs[6] = {start, end, union_done[0], union_done[1], attn_done[0], attn_done[1]};
    for (cudaEvent_t ev : evs) {
      if (ev != nullptr) cudaEventDestroy(ev);
    }
    if (s != nullptr) cudaStreamDestroy(s);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
};

// SPARGE_GATHER_PROFILE=1: times the first wave's union and attention kernels with events and
// prints one line to stderr (synchronises the stream; measurement only).
struct Profile {
  bool on = false;
  cudaStream_t stream;
  cudaEvent_t ev[3] = {};
  explicit Profile(cudaStream_t s) : stream(s) {
    const char* e = std::getenv("SPARGE_GATHER_PROFILE");
    on = e != nullptr && std::strcmp(e, "1") == 0;
    for (int i = 0; on && i < 3; ++i) on = cudaEventCreate(&ev[i]) == cudaSuccess;
  }
  ~Profile() {
    for (cudaEvent_t x : ev) {
      if (x != nullptr) cudaEventDestroy(x);
    }
  }
  void report(int ctas, int mask_rows, int variant, bool pos_map, bool row_bitmaps, int tile_rows, const AttnChoice& ac, int list_rep,
              std::int64_t groups, std::int64_t wave, bool l2_256) {
    float u = 0, a = 0;
    if (cudaEventSynchronize(ev[2]) != cudaSuccess || cudaEventElapsedTime(&u, ev[0], ev[1]) != cudaSuccess ||
        cudaEventElapsedTime(&a, ev[1], ev[2]) != cudaSuccess) {
      return;
    }
    // The attention kernel's switches: "2 stages" (wgmma64), the ws ring, prefetch, L2 hint.
    std::string sw;
    if (ac.wgmma && !ac.ws && (ac.stages == 2 || ac.stages == 4)) sw += std::string(", ") + std::to_string(ac.stages) + " stages";
    if (ac.ws) sw += std::string(", ") + std::to_string(ac.stages) + " stages, arrive " + (ac.ws_arrive_wait ? "wait" : "noinc") + (ac.ws_pingpong ? "" : ", no pingpong") + (ac.ws_pair ? ", paired" : "") + (ac.ws_persist ? ", persistent" : "");
    if (ac.prefetch) sw += ", prefetch";
    if (l2_256) sw += ", L2::256B";
    std::fprintf(stderr,
                 "[gather profile] wave 0 of %lld groups (wave %lld): union %.3f ms (ctas %d, mask_rows %d, variant %d%s, %s lists), attention %.3f ms "
                 "(%s, BM %d%s)\n",
                 static_cast<long long>(groups), static_cast<long long>(wave), u, ctas, row_bitmaps ? 0 : mask_rows, variant,
                 row_bitmaps ? " row bitmaps" : (pos_map ? " pos map" : ""), list_rep > 1 ? "kv-head" : "per-row", a, ac.name, tile_rows, sw.c_str());
  }
};

}  // namespace

Status supported(const GatherAttentionParams& p) { return select_gather(p).status; }

Status gather_attention(const GatherAttentionParams& p) {
  const GatherPlan plan = select_gather(p);
  SPARGE_RETURN_IF_ERROR(plan.status);
  auto stream = static_cast<cudaStream_t>(p.exec.stream);
  auto cuda_fail = [](const char* what, cudaError_t e) {
    return runtime_error(detail::cat(kOp, ": ", what, ": ", cudaGetErrorString(e)));
  };
  if (p.check_lists) {
    // The checked call reads the flags back to the host, which a stream capture cannot contain.
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(stream, &cs);
    if (e != cudaSuccess) return cuda_fail("cannot query the stream's capture status", e);
    if (cs != cudaStreamCaptureStatusNone) {
      return detail::bad(kOp, "check_lists = true on a stream that is being captured (the list check reads its result back to the "
                              "host; set check_lists = false to capture gather_attention in a CUDA graph)");
    }
  }

  gather::Geometry geo{};
  geo.batch = p.q.shape[0];
  geo.sq = p.q.shape[1];
  geo.hq = p.q.shape[2];
  geo.sk = p.k.shape[1];
  geo.hk = p.k.shape[2];
  geo.g = static_cast<int>(geo.hq / geo.hk);
  geo.ur = p.group_union ? static_cast<int>(std::min<std::int64_t>(p.union_rows, std::max<std::int64_t>(geo.sq, 1))) : 1;
  geo.rows = geo.g * geo.ur;
  geo.chunks = (geo.sq + geo.ur - 1) / geo.ur;
  geo.causal = p.is_causal;
  const std::int64_t total_groups = geo.batch * geo.hk * geo.chunks;
  if (total_groups == 0) return {};

  const int n_max = static_cast<int>(p.indices.shape[3]);
  // One list per query head (rep 1) or per kv head (rep G: the G rows of a position share it).
  const int list_rep = p.indices.shape[1] != geo.hq ? geo.g : 1;
  const int units = geo.rows / list_rep;  // lists per group
  gather::Scratch sc{};
  // Rounded up to a multiple of 4: each group's row of union keys is then 16-byte aligned, so the
  // prefetching attention kernels copy keys in 16-byte chunks (words_cap does not change).
  sc.ucap = (std::min<std::int64_t>(geo.sk, static_cast<std::int64_t>(units) * n_max) + 3) / 4 * 4;
  sc.words_cap = (sc.ucap + 63) / 64;
  const std::int64_t per_group = 4 + sc.ucap * 4 + sc.words_cap * geo.rows * 8;
  std::int64_t wave = std::clamp<std::int64_t>(kScratchBudget / per_group, 1, std::min<std::int64_t>(total_groups, 65535));
  // Overlap (SPARGE_GATHER_OVERLAP = N >= 2): N waves over two scratch slots; wave k + 1's union
  // runs on a side stream while wave k attends on the caller's stream.
  const int ov = overlap_waves();
  const int slots = ov >= 2 && total_groups >= 2 ? 2 : 1;
  if (slots == 2) {
    wave = std::clamp<std::int64_t>((total_groups + ov - 1) / ov, 1,
                                    std::min<std::int64_t>(65535, std::max<std::int64_t>(1, kScratchBudget / 2 / per_group)));
  }

  // One scratch allocation (a pool call each costs host time before the first kernel): the masks
  // first (8-byte words), then the union keys from a 16-byte boundary (ucap is a multiple of 4:
  // every group's row of keys stays 16-byte aligned), then the union sizes.
  const std::int64_t mask_words = slots * wave * sc.words_cap * geo.rows;
  const std::int64_t key_ints = slots * wave * sc.ucap;
  const std::int64_t keys_at = (8 * mask_words + 15) / 16 * 16;
  ScopedScratch scratch(stream);
  cudaError_t e = scratch.alloc(static_cast<std::size_t>(keys_at + 4 * key_ints + 4 * slots * wave));
  if (e != cudaSuccess) return cuda_fail("scratch allocation failed", e);
  sc.masks = scratch.as<unsigned long long>();
  sc.union_keys = reinterpret_cast<std::int32_t*>(scratch.as<unsigned char>() + keys_at);
  sc.union_size = sc.union_keys + key_ints;
  flags::DeviceFlags<gather::kNumFlags> fl(stream);
  e = fl.init();
  if (e != cudaSuccess) return cuda_fail("flag allocation failed", e);

  gather::UnionArgs ua{};
  ua.geo = geo;
  ua.indices = p.indices.ptr<std::int32_t>();
  ua.x0 = p.indices.stride[0];
  ua.x1 = p.indices.stride[1];
  ua.x2 = p.indices.stride[2];
  ua.x3 = p.indices.stride[3];
  ua.counts = p.counts.ptr<std::int32_t>();
  ua.n0 = p.counts.stride[0];
  ua.n1 = p.counts.stride[1];
  ua.n2 = p.counts.stride[2];
  ua.list_heads = p.indices.shape[1];
  ua.list_rep = list_rep;
  ua.n_max = n_max;
  ua.words_k = static_cast<int>((geo.sk + 31) / 32);
  ua.scratch = sc;
  ua.flags = fl.device();
  {
    const bool x_align = reinterpret_cast<std::uintptr_t>(ua.indices) % 16 == 0 && ua.x0 % 4 == 0 && ua.x1 % 4 == 0 && ua.x2 % 4 == 0;
    ua.vec4 = x_align && ua.x3 == 1 && n_max % 4 == 0;
  }
  // Shared memory of a union CTA: bitmap + ranks (8 bytes per 32 keys), then as many of its rows'
  // masks (words_cap + 1 words each: the odd stride) as kMaskSmem and kMaxUnionSmem allow; when
  // none fit, phase B uses global atomics.
  ua.mask_off = static_cast<int>((8 * static_cast<std::int64_t>(ua.words_k) + 15) / 16 * 16);
  int union_smem = 0;
  auto set_ctas = [&](int ctas) {
    ua.ctas = ctas;
    ua.rows_per_cta = (units + ctas - 1) / ctas;
    const std::int64_t mask_row_bytes = (sc.words_cap + 1) * 8;
    const std::int64_t budget = std::min<std::int64_t>(kMaskSmem, kMaxUnionSmem - ua.mask_off);
    ua.mask_rows = static_cast<int>(std::clamp<std::int64_t>(budget / mask_row_bytes, 0, ua.rows_per_cta));
    // SPARGE_GATHER_UNION_MASK_ROWS = n caps the rows per shared-memory batch (0: global atomics),
    // so that tests reach every phase-B path at small sizes; results do not depend on it.
    if (const char* env = std::getenv("SPARGE_GATHER_UNION_MASK_ROWS")) {
      const int cap = std::atoi(env);
      if (cap >= 0) ua.mask_rows = std::min(ua.mask_rows, cap);
    }
    union_smem = ua.mask_off + static_cast<int>(ua.mask_rows * mask_row_bytes);
    // The key -> union position map of variant kPosMap (2 bytes per key, after the masks): only
    // for the shared-memory mask batches, Sk <= kPosMapMaxKeys (positions fit 16 bits) and within
    // kPosMapSmemCap (two CTAs of 512 threads still share an SM).
    ua.pos_off = -1;
    ua.rowbm_off = -1;
    ua.ukeys_off = -1;
    // Variant kRowBitmaps: one bitmap over the Sk keys per list of the CTA, then the union as u16
    // keys; no mask batches, no position map. Only when Sk <= kRowBitmapMaxKeys and the CTA stays
    // within kRowBitmapSmemCap; otherwise the two-read path below (variant bits 1 and 2).
    if ((ua.variant & gather::kRowBitmaps) != 0 && geo.sk <= gather::kRowBitmapMaxKeys) {
      const std::int64_t rowbm_bytes = (static_cast<std::int64_t>(ua.rows_per_cta) * ua.words_k * 4 + 15) / 16 * 16;
      const std::int64_t ukeys_off = ua.mask_off + rowbm_bytes;
      const std::int64_t total = ukeys_off + 2 * sc.ucap;
      if (total <= kRowBitmapSmemCap) {
        ua.rowbm_off = ua.mask_off;
        ua.ukeys_off = static_cast<int>(ukeys_off);
        union_smem = static_cast<int>(total);
        return;
      }
    }
    const std::int64_t pos_off = (union_smem + 15) / 16 * 16;
    if ((ua.variant & gather::kPosMap) != 0 && ua.mask_rows > 0 && geo.sk <= gather::kPosMapMaxKeys &&
        pos_off + 2 * geo.sk <= kPosMapSmemCap) {
      ua.pos_off = static_cast<int>(pos_off);
      union_smem = static_cast<int>(pos_off + 2 * geo.sk);
    }
  };
  ua.variant = union_variant();
  const int major = current_device_major();
  {
    int fallback = 0;
    set_ctas(union_ctas(units, major, &fallback));
    if (fallback > 0 && ua.rowbm_off < 0 && (ua.variant & gather::kRowBitmaps) != 0) set_ctas(fallback);
  }

  gather::AttnArgs aa{};
  aa.geo = geo;
  aa.q = p.q.data;
  aa.k = p.k.data;
  aa.v = p.v.data;
  aa.q0 = p.q.stride[0]; aa.q1 = p.q.stride[1]; aa.q2 = p.q.stride[2];
  aa.k0 = p.k.stride[0]; aa.k1 = p.k.stride[1]; aa.k2 = p.k.stride[2];
  aa.v0 = p.v.stride[0]; aa.v1 = p.v.stride[1]; aa.v2 = p.v.stride[2];
  aa.o = p.o.data;
  aa.o_f32 = p.o.dtype == DType::f32;
  aa.o0 = p.o.stride[0]; aa.o1 = p.o.stride[1]; aa.o2 = p.o.stride[2]; aa.o3 = p.o.stride[3];
  aa.lse = p.maybe_lse.present() ? p.maybe_lse.ptr<float>() : nullptr;
  if (aa.lse != nullptr) {
    aa.l0 = p.maybe_lse.stride[0]; aa.l1 = p.maybe_lse.stride[1]; aa.l2 = p.maybe_lse.stride[2];
  }
  const float scale = p.scale == 0.0f ? 1.0f / std::sqrt(static_cast<float>(p.q.shape[3])) : p.scale;
  aa.scale_log2 = scale * 1.4426950408889634f;
  aa.scratch = sc;

  const AttnChoice ac = select_attention(plan, geo.rows, major);
  aa.ws_stages = ac.ws ? ac.stages : 0;
  aa.ws_arrive_wait = ac.ws_arrive_wait;
  aa.ws_pingpong = ac.ws_pingpong;
  aa.ws_prefetch = ac.ws && ac.prefetch ? 1 : 0;
  // The ws kernel's staged epilogue: O of Q's dtype, head dim contiguous, 16-byte aligned rows.
  aa.o_vec16 = ac.ws && p.o.dtype == p.q.dtype && aligned16(p.o) ? 1 : 0;
  // SPARGE_GATHER_L2PF=256 (read per call; opt-in, measured against the same path without it):
  // the .L2::256B hint on the K/V gathers of the prefetching wgmma kernels (the others ignore it;
  // in the ws producer the second copy loop cost spills at its 72 registers). A hint: same bytes,
  // same output.
  aa.l2_256 = !ac.ws && ac.prefetch && env_int("SPARGE_GATHER_L2PF", 0) == 256 ? 1 : 0;
  const AttnKernel attn = ac.kernel;
  const int attn_threads = ac.threads, attn_smem = ac.smem, tile_rows = ac.tile_rows;
  // The union kernel of the path set_ctas chose (re-picked by the 1-CTA fallback below).
  auto union_fn = [&ua] { return ua.rowbm_off >= 0 ? gather::union_kernel<true> : gather::union_kernel<false>; };
  e = cudaFuncSetAttribute(union_fn(), cudaFuncAttributeMaxDynamicSharedMemorySize, union_smem);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(attn, cudaFuncAttributeMaxDynamicSharedMemorySize, attn_smem);
  // A hint (two 84 KB CTAs of the 2-stage wgmma kernel per SM need the largest carveout); its
  // failure would only cost occupancy, so it is cleared rather than reported.
  if (e == cudaSuccess && cudaFuncSetAttribute(attn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  if (e != cudaSuccess) return cuda_fail("cannot configure shared memory", e);
  const unsigned row_tiles = static_cast<unsigned>((geo.rows + tile_rows - 1) / tile_rows);
  // The persistent ws walk: one CTA per SM (at most one per tile), each walking the wave's tiles
  // with stride gridDim.x (attention_ws.cuh, kPersist). SPARGE_GATHER_WS_PERSIST_CTAS=n (tests): at
  // most n CTAs, so small problems walk several tiles each.
  int ctas = 0;
  if (ac.ws_persist) {
    ctas = current_device_sms();
    if (ctas <= 0) return cuda_fail("cannot read the SM count", cudaErrorInvalidDevice);
    const int cap = env_int("SPARGE_GATHER_WS_PERSIST_CTAS", 0);
    if (cap > 0) ctas = std::min(cap, ctas);
    aa.ws_row_tiles = static_cast<int>(row_tiles);
  }
  auto attn_grid = [&](unsigned n) {
    if (!ac.ws_persist) return dim3(row_tiles, n);
    const std::int64_t tiles = static_cast<std::int64_t>(row_tiles) * n;
    aa.ws_tiles = tiles;
    return dim3(static_cast<unsigned>(std::min<std::int64_t>(tiles, ctas)));
  };
  Profile prof(stream);
  SideStream side(stream);  // after the buffers: destroyed first, so the caller's stream waits for it
  if (slots == 2) {
    e = side.init();
    if (e != cudaSuccess) return cuda_fail("cannot create the side stream", e);
    prof.on = false;  // the split is not measurable with events on one stream
  }
  const cudaStream_t ustream = slots == 2 ? side.s : stream;
  // SPARGE_GATHER_PDL=1 (read per call; opt-in: measured even with ws, s11r6 / s11r7): the wgmma /
  // ws attention kernel (which waits for the union kernel's outputs with griddepcontrol.wait) is launched with
  // programmatic stream serialization right after its union kernel on the same stream, so its
  // launch and first CTAs overlap the union's last ones. Not with the overlap mode (the union is
  // on another stream) or the profile (events between the kernels).
  const bool pdl = env_int("SPARGE_GATHER_PDL", 0) == 1 && ac.wgmma && major >= 9 && slots == 1 && !prof.on;
  for (std::int64_t g0 = 0, k = 0; g0 < total_groups; g0 += wave, ++k) {
    if (prof.on && g0 == 0) cudaEventRecord(prof.ev[0], stream);
    const auto n = static_cast<unsigned>(std::min(wave, total_groups - g0));
    const int slot = static_cast<int>(k % slots);
    gather::Scratch sw = sc;
    sw.union_size += slot * wave;
    sw.union_keys += slot * wave * sc.ucap;
    sw.masks += slot * wave * sc.words_cap * geo.rows;
    ua.scratch = sw;
    aa.scratch = sw;
    ua.first_group = g0;
    aa.first_group = g0;
    // The slot's previous user (the attention of wave k - 2) must be done before its union is rebuilt.
    if (slots == 2 && k >= 2) {
      e = cudaStreamWaitEvent(side.s, side.attn_done[slot], 0);
      if (e != cudaSuccess) return cuda_fail("cannot order the side stream", e);
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(n * static_cast<unsigned>(ua.ctas));
    cfg.blockDim = dim3(gather::kUnionThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(union_smem);
    cfg.stream = ustream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(ua.ctas);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = ua.ctas > 1 ? 1 : 0;
    e = cudaLaunchKernelEx(&cfg, union_fn(), ua);
    if (e != cudaSuccess && ua.ctas > 1 && g0 == 0) {
      // The cluster could not be launched (a launch-configuration error, not sticky): one CTA per
      // group instead, for this and every later wave.
      (void)cudaGetLastError();
      set_ctas(1);
      e = cudaFuncSetAttribute(union_fn(), cudaFuncAttributeMaxDynamicSharedMemorySize, union_smem);
      if (e != cudaSuccess) return cuda_fail("cannot configure shared memory", e);
      cfg.gridDim = dim3(n);
      cfg.dynamicSmemBytes = static_cast<size_t>(union_smem);
      cfg.numAttrs = 0;
      e = cudaLaunchKernelEx(&cfg, union_fn(), ua);
    }
    if (e != cudaSuccess) return cuda_fail("union kernel launch failed", e);
    // The flags are complete once the last union kernel is: their read-back waits for it alone, so
    // the host's wait and the list checks overlap the attention kernels enqueued below.
    if (p.check_lists && g0 + wave >= total_groups) {
      e = fl.fork(ustream);
      if (e != cudaSuccess) return cuda_fail("cannot fork the flags' read-back", e);
    }
    if (slots == 2) {
      e = cudaEventRecord(side.union_done[slot], side.s);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, side.union_done[slot], 0);
      if (e != cudaSuccess) return cuda_fail("cannot order the union and attention kernels", e);
    }
    if (prof.on && g0 == 0) cudaEventRecord(prof.ev[1], stream);
    if (pdl) {
      cudaLaunchConfig_t acfg{};
      acfg.gridDim = attn_grid(n);
      acfg.blockDim = dim3(static_cast<unsigned>(attn_threads));
      acfg.dynamicSmemBytes = static_cast<size_t>(attn_smem);
      acfg.stream = stream;
      cudaLaunchAttribute aattr[1];
      aattr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      aattr[0].val.programmaticStreamSerializationAllowed = 1;
      acfg.attrs = aattr;
      acfg.numAttrs = 1;
      e = cudaLaunchKernelEx(&acfg, attn, aa);
      if (e != cudaSuccess) return cuda_fail("attention kernel launch failed", e);
    } else {
      const dim3 grid = attn_grid(n);
      attn<<<grid, attn_threads, attn_smem, stream>>>(aa);
    }
    if (prof.on && g0 == 0) cudaEventRecord(prof.ev[2], stream);
    if (slots == 2) {
      e = cudaEventRecord(side.attn_done[slot], stream);
      if (e != cudaSuccess) return cuda_fail("cannot order the union and attention kernels", e);
    }
  }
  side.join();  // the caller's stream waits for the unions of the side stream
  if (prof.on) prof.report(ua.ctas, ua.mask_rows, ua.variant, ua.pos_off >= 0, ua.rowbm_off >= 0, tile_rows, ac, list_rep, total_groups, wave, aa.l2_256 != 0);
  e = cudaGetLastError();
  if (e != cudaSuccess) return cuda_fail("kernel launch failed", e);
  if (!p.check_lists) return {};  // trusted lists: bad entries were skipped on the device, nothing to report
  e = fl.fetch_forked();
  if (e != cudaSuccess) return cuda_fail("kernel failed", e);

  // The kernels only say which rows failed; the lowest one is re-read here and checked entry by
  // entry in list order, so the message names the same entry as the CPU backend's.
  std::uint64_t bad_row = flags::kNone;
  for (int f = 0; f < gather::kNumFlags; ++f) {
    if (fl[f] != flags::kNone) bad_row = std::min<std::uint64_t>(bad_row, flags::row_of(fl[f]));
  }
  if (bad_row != flags::kNone) return describe_bad_row(p, geo, bad_row);
  return {};
}

}  // namespace sparge::cuda
