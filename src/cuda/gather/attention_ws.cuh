// gather_attention, step 2 on sm_90a, warp-specialized (SPARGE_GATHER_PATH=ws; the default for hd128
// groups of >= 128 rows since session 11, gather.cu): the tile walk of attention.cuh -- BM rows of
// one group over the group's union, 64 union positions per step, each row masked by its own mask
// word -- split between roles as in the Hopper block-sparse kernel (cuda/attention/sm90/kernel.cuh):
//   * warpgroup 0, the producer (setmaxnreg down to kProducerRegs): its 128 threads load Q once and
//     then gather the K and V rows of each step's 64 union positions with 16-byte cp.async straight
//     into the 128-byte-swizzled layout the wgmma descriptors read (attention_wgmma.cuh, sw128;
//     zero-fill past the union's end), into a ring of `a.ws_stages` stages (a run-time value: as
//     many as the shared memory holds by default). K and V of a stage have their own "full" and
//     "empty" mbarriers, so K of step i + 1 lands while O += P V of step i still reads V.
//   * warpgroups 1 .. C, the consumers (setmaxnreg up), 64 query rows each (BM = 64 C): per step
//     S = Q K^T (wgmma rs: Q in registers since session 27; ss in the paired walk), the
//     online softmax of attention.cuh (softmax_probs: the same masking and
//     exp2 arithmetic; the rescale of O is deferred), O += P V (wgmma rs). As in the dense kernel the
//     step-i turn issues S_i and PV_{i-1} together, waits for S_i only and runs softmax_i while
//     PV_{i-1} is still on the tensor cores; with C = 2 the two warpgroups take turns issuing
//     (pingpong on named barriers 2 and 3), so one's softmax overlaps the other's GEMMs.
// With two consumer warpgroups the grid is persistent by default (kPersist, below): one CTA per SM
// walks several tiles, the next tile's Q and first K/V stages landing while the current one runs.
// C (1 or 2 consumer warpgroups) is a template parameter chosen by the host from the group's rows:
// 2 (BM 128) for groups of more than 64 rows -- PERF.md's 256-row groups are two CTAs that gather
// the same keys (the second from L2); 1 (BM 64, 256 threads, two CTAs per SM: at hd128 2 stages
// with the prefetch buffers, 3 without) for groups of at most 64 rows, where a second warpgroup would only hold rows past the
// group's end (their mask words are 0) and double the MMA work for nothing. SPARGE_GATHER_WS_WG
// overrides it (gather.cu).
//
// The tile invariant is attention.cuh's: one K/V load serves all BM rows because they read the
// same kv head; each row keeps its own mask, so the rows are interchangeable for the loads only.
//
// Session 11 (H200, docs/benchmarks/2026-12-01-h200.md): the producer's rows are kIt consecutive
// rows per thread (ws_copy_rows: 16-byte key copies, one IMAD.WIDE per row, no zero-fill test
// outside the union's last step), the consumers' descriptors a base plus constant offsets, the
// epilogue staged through the warpgroup's Q tile when O allows 16-byte row stores; PERF.md's shape:
// attention step 0.128 -> 0.090 ms together with the softmax changes of attention.cuh.
// racecheck reports WAR hazards between the consumers' mask-word reads from the ring and the
// producer's refill of the stage: they are ordered by the stage's mbarriers (each consumer warp's
// __syncwarp + lane 0's arrive on k_empty, the producer's wait before the refill), which racecheck
// does not model (with prefetch off, masks from global memory, it reports none).
//
// Handing cp.async writes to wgmma (the async proxy). cp.async (the non-bulk one) writes shared
// memory through the generic proxy; wgmma reads its shared-memory operands through the async
// proxy, so between the two there must be (1) a synchronization that makes the copies' writes
// visible to the consuming threads and (2) a fence.proxy.async on the causality path from the
// writes to the wgmma. Two producer modes (a.ws_arrive_wait, SPARGE_GATHER_WS_ARRIVE):
//   * noinc (default): each producer thread issues its copies of a stage and then
//     cp.async.mbarrier.arrive.noinc on the stage's "full" barrier (initialised with 128 = the
//     producer threads; .noinc: the arrival counts as one of those 128, instead of raising the
//     pending count by one). The hardware performs the arrive-on once all of the thread's earlier
//     cp.async have completed, so the phase completes when every copy of the stage has landed, and
//     a consumer thread whose try_wait (acquire) observes the phase sees those writes. The
//     producer does not block on its copies (up to `stages` steps in flight).
//   * wait (fallback, for diagnosis): the copies of K_i and V_i are committed as groups; a thread
//     waits for its K_i group (cp.async.wait_group 1, after V_i is issued) and its V_i group (after
//     K_{i+1} is issued), executes fence.proxy.async.shared::cta and then a plain mbarrier.arrive
//     (release) -- the writer-side fence of attention_wgmma.cuh. At most ~1.5 steps in flight.
// In both modes every consumer thread executes fence.proxy.async.shared::cta right after its wait
// on a "full" barrier and before the wgmmas that read the stage: the PTX memory model orders a
// generic-proxy write before an async-proxy read when a proxy fence lies on the causality path
// between them (here: copy -> arrive-on -> try_wait -> fence -> wgmma), which is what makes the
// noinc mode correct -- no producer thread can fence writes that complete after it has moved on.
// (In the wait mode the consumer fence is redundant and costs one fence per stage and thread.)
// Write-after-read: a stage is refilled only after every consumer warp has arrived on its "empty"
// barrier, which each does after the wgmma_wait that retires its reads of the stage (as the dense
// kernel does with TMA refills).
//
// Barrier phases: use u (0, 1, ...) of ring stage b = u % S waits for parity (u / S) & 1 on "full"
// (consumers) and for the complement on "empty" (producer; a fresh barrier's preceding phase counts
// as complete, so the first S uses do not wait): the Ring of cuda/attention/sm90/kernel.cuh.
// Deadlock freedom (S >= 2): the producer's wait for "empty" of step i needs PV of step i - S, which
// the consumers issue in step i - S + 1, after "full" of K_{i-S+1} and V_{i-S}; both were completed
// (noinc) or arrived (wait mode: V_{i-S} after K_{i-S+1} is issued, K_{i-S+1} at the end of its
// iteration) in producer iterations <= i - 1.
#pragma once

#include "cuda/attention/sm90/pipeline.cuh"
#include "cuda/attention/sm90/wgmma.cuh"
#include "cuda/gather/attention_wgmma.cuh"

namespace sparge::cuda::gather {

constexpr int kWsMaxStages = 8;
// Prefetch: the union keys of step s are copied at step s - kWsKeyAhead into a ring of
// kWsKeyAhead + 1 slots (the slot written at step blk is the one read at step blk - 1).
constexpr int kWsKeyAhead = 4;
constexpr int kWsKeySlots = kWsKeyAhead + 1;

// Launch shape of the warp-specialized kernel with C consumer warpgroups.
template <int C>
struct WsShape {
  static_assert(C == 1 || C == 2, "one or two consumer warpgroups");
  static constexpr int kConsumers = C;
  static constexpr int kThreads = 128 * (C + 1);
  static constexpr int kBM = 64 * C;
  // BM 64: two CTAs per SM (registers and, at hd128, 2 stages of shared memory each with the
  // prefetch buffers, 3 without).
  static constexpr int kMinBlocks = C == 1 ? 2 : 1;
  // setmaxnreg budgets (as Traits in sm90/kernel.cuh): the CTA's launch registers, the producer
  // keeps kProducerRegs (it computes 16 addresses per stage and prefetches the next step's union
  // keys), the consumers share the rest (at most 240): hd128 BM 128 216, BM 64 184.
  static constexpr int kProducerRegs = 72;  // 56 and 64 spilled (ptxas, hd128)
  static constexpr int kLaunchRegs = (65536 / (kThreads * kMinBlocks)) / 8 * 8;
  static constexpr int kConsumerRegsRaw = ((kLaunchRegs * kThreads - kProducerRegs * 128) / (128 * C)) / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsRaw > 240 ? 240 : kConsumerRegsRaw;
  static constexpr int tile_bytes(int d) { return 64 * d * 2; }
  // Q's barriers: q_full, or with the persistent walk q_full[2] and q_empty[2]; then four per stage.
  static constexpr int q_barriers(bool persist) { return persist ? 4 : 1; }
  static constexpr int barrier_bytes(int stages, bool persist = false) { return 8 * (q_barriers(persist) + 4 * stages); }
  // Prefetch (a.ws_prefetch): the union keys, kWsKeyAhead steps ahead, in kWsKeySlots slots of a
  // step's 64 ints; the BM rows' mask words per stage.
  static constexpr int pf_key_bytes() { return kWsKeySlots * kBN * 4; }
  static constexpr int pf_bytes(int stages) { return pf_key_bytes() + stages * kBM * 8; }
  // Q (C tiles, two sets of them with the persistent walk) + stages x (K, V), plus 1024 bytes: the
  // slack that aligns the tiles to the 1024-byte swizzle atom also holds the barriers when it is
  // large enough, else they follow the tiles (barrier_bytes <= 288 < 1024, so the sum is enough
  // either way). With prefetch, its buffers follow the tiles, 512 bytes further when the barriers
  // are there (pad < 288, so pad + 512 < 1024).
  static constexpr int smem_bytes(int d, int stages, bool prefetch = false, bool persist = false) {
    return ((persist ? 2 : 1) * C + 2 * stages) * tile_bytes(d) + 1024 + (prefetch ? pf_bytes(stages) : 0);
  }
};

__device__ __forceinline__ void cp_async_arrive_noinc(std::uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Waits for every cp.async of the thread, committed to a group or not (cp.async.wait_group only
// covers committed groups; noinc-mode copies are in none).
__device__ __forceinline__ void cp_async_wait_every() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Keeps the compiler from moving writes of P (the A operand of an in-flight wgmma) above the wait.
template <int N>
__device__ __forceinline__ void fence_regs(std::uint32_t (&p)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(p[i][e])::"memory");
}

// This warp's 16 rows of its warpgroup's Q tile (64 x D, 128-byte swizzled slabs of 64 columns) as wgmma A
// fragments, one ldmatrix.x4 per 16-column k-step: matrix i of the x4 is rows (i & 1) * 8 .. + 7, columns
// (i >> 1) * 8 .. + 7 of the k-step, so register i holds the A fragment's element pair i.
template <int D>
__device__ __forceinline__ void ws_load_q(std::uint32_t (&qa)[D / 16][4], const unsigned char* q_tile, int warp, int lane) {
  const int row = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(qa[ks], q_tile + sw128(row, 2 * ks + (lane >> 4)));
}

// The producer's rows (session 11): thread pt copies 16-byte chunk c = pt % kChunks of the kIt
// consecutive rows rg * kIt .. rg * kIt + kIt - 1 of a step, rg = pt / kChunks (kIt = D / 16: 8
// rows at hd128, 4 at hd64), so its union keys are kIt consecutive ints (one or two 16-byte
// reads) and a warp's copies still cover whole 256-byte (128-byte) rows. A row's address is one
// IMAD.WIDE.U32: `base` is the thread's chunk in row 0 of the (b, kv head) slice, `row_bytes` the
// row stride in bytes (the host keeps it below 2^31). kTail: the step may run past the union's
// end, where key < 0 and the copy zero-fills (no read); other steps copy without the test.
template <int D, bool kTail>
__device__ __forceinline__ void ws_copy_rows(const char* base, unsigned row_bytes, const int (&key)[D / 16],
                                             unsigned char* dst, int rg, int c) {
  constexpr int kIt = D / 16;
#pragma unroll
  for (int it = 0; it < kIt; ++it) {
    const bool valid = !kTail || key[it] >= 0;
    const unsigned j = valid ? static_cast<unsigned>(key[it]) : 0u;
    const char* src = base + static_cast<unsigned long long>(j) * row_bytes;
    if (kTail) {
      cp_async16(dst + sw128(rg * kIt + it, c), src, valid);
    } else {
      cp_async16_full(dst + sw128(rg * kIt + it, c), src);
    }
  }
}

// The epilogue of one consumer warpgroup through shared memory (a.o_vec16: O of Q's dtype with
// contiguous, 16-byte aligned rows): each thread writes its rows' normalised values as packed
// pairs into `stage` (the warpgroup's 64 x D Q tile, chunk c of row r at (c ^ (r & 7)) * 16:
// conflict-free for the accumulator layout), the warpgroup meets at named barrier `bar`, then
// every thread stores whole 16-byte chunks of rows (kChunks per row, consecutive threads on
// consecutive chunks). The values and LSE are the register epilogue's (attention.cuh, epilogue),
// bit for bit: the same products, the same round-to-nearest packing. Rows past the group's end
// are not stored. wr0: the group row of the warpgroup's first row; ct: thread within it.
template <class T, int D>
__device__ __forceinline__ void epilogue_staged(const AttnArgs& a, const GroupPos& gp, const float (&o)[D / 8][4],
                                                const float (&m)[2], const float (&l)[2], unsigned char* stage, int wr0,
                                                int warp, int lane, int ct, int bar) {
  constexpr int kDT = D / 8, kChunks = D / 8, kRowBytes = D * 2;
  const int tq = lane & 3;
#pragma unroll
  for (int hrow = 0; hrow < 2; ++hrow) {
    const float sum = quad_sum(l[hrow]);
    const int r = warp * 16 + (lane >> 2) + 8 * hrow;  // row within the warpgroup's 64
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int d = 0; d < kDT; ++d) {
      const std::uint32_t v = Mma<T>::pack(o[d][hrow * 2] * inv, o[d][hrow * 2 + 1] * inv);
      *reinterpret_cast<std::uint32_t*>(stage + r * kRowBytes + ((d ^ (r & 7)) << 4) + tq * 4) = v;
    }
    const int gr = wr0 + r;
    if (a.lse != nullptr && tq == 0 && gr < gp.rows) store_lse(a, gp, row_pos(a.geo, gp, gr), m[hrow], sum);
  }
  ::sparge::cuda::attn::sm90::named_barrier_sync(bar, 128);
#pragma unroll
  for (int it = 0; it < 64 * kChunks / 128; ++it) {
    const int idx = ct + it * 128;
    const int r = idx / kChunks, c = idx % kChunks;
    const int gr = wr0 + r;
    if (gr >= gp.rows) continue;
    const int4 v = *reinterpret_cast<const int4*>(stage + r * kRowBytes + ((c ^ (r & 7)) << 4));
    const RowPos rp = row_pos(a.geo, gp, gr);
    *reinterpret_cast<int4*>(static_cast<T*>(a.o) + gp.b * a.o0 + rp.i * a.o1 + rp.h * a.o2 + c * 8) = v;
  }
}

// kPair (SPARGE_GATHER_WS_PAIR, with prefetch and at least 3 stages; "Paired steps" above): the
// consumers take two ring stages (128 union positions) per turn.
// kPersist (SPARGE_GATHER_WS_PERSIST=1; two consumer warpgroups, noinc producer with prefetch, no
// pairing): a persistent grid; each CTA walks the tiles t = blockIdx.x, + gridDim.x, ... of the
// wave (row tile t % a.ws_row_tiles of group t / a.ws_row_tiles), so the tile order, and with it
// every tile's arithmetic, is the one-tile-per-CTA grid's: bitwise the same output. What carries
// over from tile to tile: the K/V ring (stage and parity counters never restart, on both sides),
// the pingpong turns (opened once by warpgroup 1, closed once by warpgroup 0: both warpgroups take
// nblk + 1 turns per tile, so the alternation runs on across tiles), and Q in two buffers, tile j
// in buffer j % 2 with its own full / empty barriers: the producer loads tile j + 1's Q (after the
// consumers' epilogue of tile j - 1, which wrote O through that buffer, arrived on its empty
// barrier) and gathers its first K/V stages while the consumers still run tile j, so a tile's
// prologue (Q, the first gathers) and the previous tile's epilogue overlap the GEMMs.
template <class T, int D, int C, bool kPair = false, bool kPersist = false>
__global__ void __launch_bounds__(WsShape<C>::kThreads, WsShape<C>::kMinBlocks) attention_ws_kernel(const AttnArgs a) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace wg = ::sparge::cuda::attn::sm90;
  using Sh = WsShape<C>;
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static_assert(!kPersist || (C == 2 && !kPair), "the persistent walk: two consumer warpgroups, unpaired");
  constexpr int kChunks = D / 8;
  constexpr int kIt = D / 16;                   // 16-byte chunks per producer thread and tile
  constexpr int kNT = kBN / 8;                  // n-tiles of S
  constexpr int kDT = D / 8;                    // n-tiles of O
  constexpr std::uint32_t kTile = 64 * D * 2;   // bytes of a 64-row tile (Q per warpgroup, K, V)
  constexpr std::uint32_t kSlab = 8192;         // 64 rows x 128 bytes
  constexpr int kTurnBarrier = 2;               // named barriers 2, 3: the consumers' pingpong turns
  extern __shared__ unsigned char smem_raw[];

  const int stages = a.ws_stages;
  constexpr int kQBufs = kPersist ? 2 : 1;
  constexpr int kQBars = Sh::q_barriers(kPersist);  // q_full[kQBufs] (+ q_empty[kQBufs])
  const std::uint32_t pad = (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u;
  unsigned char* sq = smem_raw + pad;           // [kQBufs][C][64 rows][D]
  unsigned char* skv = sq + kQBufs * C * kTile;  // stage b: K at skv + 2 b kTile, V right after
  const std::uint32_t bar_bytes = static_cast<std::uint32_t>(Sh::barrier_bytes(stages, kPersist));
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(pad >= bar_bytes ? smem_raw : skv + 2 * stages * kTile);
  std::uint64_t* q_full = bars;
  std::uint64_t* q_empty = bars + kQBufs;  // kPersist only
  std::uint64_t* k_full = bars + kQBars;
  std::uint64_t* v_full = bars + kQBars + stages;
  std::uint64_t* k_empty = bars + kQBars + 2 * stages;
  std::uint64_t* v_empty = bars + kQBars + 3 * stages;
  // Prefetch buffers (a.ws_prefetch): the union keys [kWsKeySlots][64], then the mask words
  // [stages][BM].
  const bool prefetch = kPersist || a.ws_prefetch != 0;
  std::int32_t* pf_keys = reinterpret_cast<std::int32_t*>(skv + 2 * stages * kTile + (pad >= bar_bytes ? 0 : 512));
  unsigned long long* pf_masks = reinterpret_cast<unsigned long long*>(pf_keys + kWsKeySlots * kBN);

  const Geometry& geo = a.geo;
  // The CTA's tiles, the same walk for both roles: (group slot w, first row row0) and what the
  // union kernel left for the group. Tiles whose rows were cut off by Sq (a group's last
  // positions) are skipped.
  struct Tile {
    int w, row0;
    GroupPos gp;
    int U, nblk;
    const std::int32_t* keys;
  };
  auto tile_from = [&](std::int64_t w, int row0, Tile& x) {
    x.w = static_cast<int>(w);
    x.row0 = row0;
    x.gp = group_pos(geo, a.first_group + w);
    if (row0 >= x.gp.rows) return false;
    x.U = a.scratch.union_size[w];
    x.keys = a.scratch.union_keys + w * a.scratch.ucap;
    x.nblk = (x.U + kBN - 1) / kBN;
    return true;
  };
  // Tile cursor t: the next tile index to try (kPersist), else 0 before and 1 after the CTA's tile.
  auto next_tile = [&](std::int64_t& t, Tile& x) {
    if constexpr (kPersist) {
      for (; t < a.ws_tiles; t += gridDim.x) {
        if (tile_from(t / a.ws_row_tiles, static_cast<int>(t % a.ws_row_tiles) * Sh::kBM, x)) {
          t += gridDim.x;
          return true;
        }
      }
      return false;
    } else {
      if (t++ > 0) return false;
      return tile_from(blockIdx.y, static_cast<int>(blockIdx.x) * Sh::kBM, x);
    }
  };
  const std::int64_t t0 = kPersist ? static_cast<std::int64_t>(blockIdx.x) : 0;
  const int tid = static_cast<int>(threadIdx.x);
  pdl_wait();  // the union kernel's outputs (SPARGE_GATHER_PDL)

  if (tid == 0) {
    for (int qb = 0; qb < kQBufs; ++qb) {
      wg::barrier_init(q_full + qb, 128);
      if (kPersist) wg::barrier_init(q_empty + qb, C * 4);
    }
    for (int b = 0; b < stages; ++b) {
      wg::barrier_init(k_full + b, 128);
      wg::barrier_init(v_full + b, 128);
      wg::barrier_init(k_empty + b, C * 4);
      wg::barrier_init(v_empty + b, C * 4);
    }
    wg::barrier_init_fence();
  }
  __syncthreads();

  const int role = __shfl_sync(0xffffffffu, tid / 128, 0);  // warpgroup, provably warp-uniform
  if (role == 0) {
    // ---- producer ------------------------------------------------------------------------------
    wg::registers_release<Sh::kProducerRegs>();
    const int pt = tid;
    const bool wait_mode = !kPersist && a.ws_arrive_wait != 0;
    const int c = pt % kChunks, rg = pt / kChunks;
    const unsigned k_row = static_cast<unsigned>(a.k1 * static_cast<std::int64_t>(sizeof(T)));
    const unsigned v_row = static_cast<unsigned>(a.v1 * static_cast<std::int64_t>(sizeof(T)));
    const int u_mine = rg * kIt;  // this thread's first row (union position) within a step
    int b = 0, b_prev = 0;  // the K/V ring: runs on across the CTA's tiles
    std::uint32_t phase = 0;
    Tile x;
    std::int64_t t = t0;
#pragma unroll 1
    for (int j = 0; next_tile(t, x); ++j) {
      const GroupPos& gp = x.gp;
      const int U = x.U, nblk = x.nblk, row0 = x.row0;
      const std::int32_t* keys = x.keys;
      // Q rows of the tile (zero past the group's rows) into buffer j % kQBufs, completed on its
      // q_full; with kPersist once the consumers' epilogue of tile j - 2 has left that buffer.
      const int qb = kPersist ? (j & 1) : 0;
      if constexpr (kPersist) wg::barrier_wait(q_empty + qb, ((j >> 1) & 1) ^ 1);
      load_q_sw<T, D, Sh::kBM, 128, 4>(a, gp, row0, sq + qb * C * kTile, pt);
      if (wait_mode) {
        cp_async_wait_every();
        fence_proxy_async_smem();
        wg::barrier_arrive(q_full + qb);
      } else {
        cp_async_arrive_noinc(q_full + qb);
      }
      const char* kb = reinterpret_cast<const char*>(static_cast<const T*>(a.k) + gp.b * a.k0 + gp.hk * a.k2 + c * 8);
      const char* vb = reinterpret_cast<const char*>(static_cast<const T*>(a.v) + gp.b * a.v0 + gp.hk * a.v2 + c * 8);
      // Prefetch: the 64 union keys of step s into ring slot `slot`, 16 bytes per copy, each copied
      // by a lane of the warp whose rows they are (lanes with c < kIt / 4), so that the warp's own
      // wait + __syncwarp hands them over (no cross-warp barrier). Zero-filled from U on (the reader
      // tests u < U); a chunk that starts below U stays within the group's row of union_keys (ucap
      // is a multiple of 4). One commit group per step; steps past the tile's last copy nothing
      // (an empty group keeps the count), so no key copy of a tile is in flight when the next
      // tile's copies reuse the slots.
      auto copy_keys = [&](int s, int slot) {
        if (c < kIt / 4 && s < nblk) {
          const int u0 = s * kBN + u_mine + 4 * c;
          const bool valid = u0 < U;
          cp_async16(pf_keys + slot * kBN + u_mine + 4 * c, keys + (valid ? u0 : 0), valid);
        }
      };
      int rk = 0, wk = kWsKeyAhead;  // prefetch: the slots read and written this step
      if (prefetch) {
        // kPersist: the previous tile's last steps read these slots in other lanes of this warp;
        // their reads come before this tile's copies only with a warp barrier in between (racecheck,
        // session 28: a WAR hazard at the tile boundary without it).
        if constexpr (kPersist) __syncwarp();
        for (int s = 0; s < kWsKeyAhead; ++s) {
          copy_keys(s, s);
          cp_async_commit();
        }
      }
#pragma unroll 1
      for (int blk = 0; blk < nblk; ++blk) {
        // This thread's keys of step blk (-1 past the union's end, only in the last step).
        int key[kIt];
        const bool tail = (blk + 1) * kBN > U;
        if (prefetch) {
          // Committed so far in this tile: kWsKeyAhead + blk groups (earlier tiles' groups are older
          // and complete first); all but the newest kWsKeyAhead - 1 complete = the keys of steps
          // 0 .. blk; the warp's barrier makes its lanes' copies visible to it.
          cp_async_wait<kWsKeyAhead - 1>();
          __syncwarp();
          const int* slot = pf_keys + rk * kBN + u_mine;
#pragma unroll
          for (int q4 = 0; q4 < kIt / 4; ++q4) {
            const int4 k4 = *reinterpret_cast<const int4*>(slot + 4 * q4);
            key[4 * q4 + 0] = k4.x;
            key[4 * q4 + 1] = k4.y;
            key[4 * q4 + 2] = k4.z;
            key[4 * q4 + 3] = k4.w;
          }
        } else {
          // (The diagnostic path: a dependent read of the keys right before their copies.)
#pragma unroll
          for (int it = 0; it < kIt; ++it) key[it] = keys[min(blk * kBN + u_mine + it, U - 1)];
        }
        if (tail) {
#pragma unroll
          for (int it = 0; it < kIt; ++it) key[it] = blk * kBN + u_mine + it < U ? key[it] : -1;
        }
        unsigned char* sk = skv + b * 2 * kTile;
        wg::barrier_wait(k_empty + b, phase ^ 1);
        // Prefetch: the rows' mask words of step blk into the stage, completed with K on k_full.
        if (prefetch) copy_step_masks(a.scratch.masks + x.w * a.scratch.words_cap * geo.rows, geo, gp, nblk, row0, Sh::kBM, blk, pf_masks + b * Sh::kBM, pt);
        if (tail) {
          ws_copy_rows<D, true>(kb, k_row, key, sk, rg, c);
        } else {
          ws_copy_rows<D, false>(kb, k_row, key, sk, rg, c);
        }
        if (wait_mode) {
          cp_async_commit();
          if (blk > 0) {  // V of the previous step: every group but K_blk has landed
            cp_async_wait<1>();
            fence_proxy_async_smem();
            wg::barrier_arrive(v_full + b_prev);
          }
        } else {
          cp_async_arrive_noinc(k_full + b);
        }
        wg::barrier_wait(v_empty + b, phase ^ 1);
        if (tail) {
          ws_copy_rows<D, true>(vb, v_row, key, sk + kTile, rg, c);
        } else {
          ws_copy_rows<D, false>(vb, v_row, key, sk + kTile, rg, c);
        }
        if (wait_mode) {
          cp_async_commit();
          cp_async_wait<1>();  // K_blk has landed (V_blk may still be in flight)
          fence_proxy_async_smem();
          wg::barrier_arrive(k_full + b);
        } else {
          cp_async_arrive_noinc(v_full + b);
        }
        if (prefetch) {
          copy_keys(blk + kWsKeyAhead, wk);
          cp_async_commit();
          rk = rk == kWsKeySlots - 1 ? 0 : rk + 1;
          wk = wk == kWsKeySlots - 1 ? 0 : wk + 1;
        }
        b_prev = b;
        if (++b == stages) {
          b = 0;
          phase ^= 1;
        }
      }
      if (wait_mode && nblk > 0) {
        cp_async_wait<0>();
        fence_proxy_async_smem();
        wg::barrier_arrive(v_full + b_prev);
      }
    }
    cp_async_wait_every();  // no copy outlives its thread
  } else {
    // ---- consumers -----------------------------------------------------------------------------
    wg::registers_claim<Sh::kConsumerRegs>();
    const int cw = role - 1;                    // consumer warpgroup
    const int ct = tid - 128 * role;            // thread within it
    const int lane = ct & 31, warp = ct >> 5;   // warp within the warpgroup
    const bool pingpong = C == 2 && a.ws_pingpong != 0;
    const int tq = lane & 3;
    // Pingpong turns: each warpgroup takes nblk + 1 turns per tile (or none when the union is
    // empty); warpgroup 1 opens with an arrive on warpgroup 0's barrier before the CTA's first
    // tile, warpgroup 0 closes with a sync on it after the last, so both named barriers are
    // balanced at exit (and the alternation runs on across tiles).
    auto turn_begin = [&] {
      if (pingpong) wg::named_barrier_sync(kTurnBarrier + cw, 256);
    };
    auto turn_end = [&] {
      if (pingpong) wg::named_barrier_arrive(kTurnBarrier + (cw ^ 1), 256);
    };
    auto release = [&](std::uint64_t* bar) {
      __syncwarp();
      if (lane == 0) wg::barrier_arrive(bar);
    };
    // Wait for a "full" barrier, then the proxy fence (see the header: copies -> wgmma).
    auto acquire = [&](std::uint64_t* bar, std::uint32_t parity) {
      wg::barrier_wait(bar, parity);
      fence_proxy_async_smem();
    };

    if (pingpong && cw == 1) wg::named_barrier_arrive(kTurnBarrier + 0, 256);  // warpgroup 0 goes first
    int rb = 0;  // the K/V ring position of the next tile's first step: runs on across tiles
    std::uint32_t rph = 0;
    Tile x;
    std::int64_t t = t0;
#pragma unroll 1
    for (int j = 0; next_tile(t, x); ++j) {
      const GroupPos& gp = x.gp;
      const int w = x.w, row0 = x.row0, nblk = x.nblk;
      // This thread's two rows: r = lane / 4 and r + 8 of the warp's 16 rows of the warpgroup's 64.
      const int gr_lo = row0 + cw * 64 + warp * 16 + (lane >> 2);
      const int gr_hi = gr_lo + 8;
      const unsigned long long* masks = a.scratch.masks + w * a.scratch.words_cap * geo.rows;
      auto mask_word = [&](int blk, int gr) {
        return blk < nblk && gr < gp.rows ? masks[static_cast<std::int64_t>(blk) * geo.rows + gr] : 0ull;
      };
      float o[kDT][4];
#pragma unroll
      for (int d = 0; d < kDT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
      float m[2] = {-INFINITY, -INFINITY};
      float l[2] = {0.0f, 0.0f};
      float alpha[2];
      // The tile's Q buffer (kPersist: tile j in buffer j % 2, its barriers' phase j / 2).
      const int qb = kPersist ? (j & 1) : 0;
      const std::uint32_t q_parity = kPersist ? static_cast<std::uint32_t>((j >> 1) & 1) : 0u;
      unsigned char* q_tile = sq + (qb * C + cw) * kTile;
      // Descriptors as a base per tile plus each k-step's constant offset (sm90/wgmma.cuh, DescBase:
      // the same bits as k_major_desc / mn_major_desc). The unpaired walk holds Q in registers (QK^T
      // by Wgmma<T, 64>::rs_kmajor): loaded once per tile, after its copies have landed (ldmatrix
      // reads through the generic proxy: no proxy fence). The paired walk's 64 score registers leave
      // no room for it (ptxas serialized its wgmmas, C7512), so it keeps Q in shared memory.
      constexpr bool kQRegs = !kPair;
      const wg::DescBase qd = wg::k_major_base(smem_addr(q_tile));
      std::uint32_t qa[kQRegs ? D / 16 : 1][4];
      if constexpr (kQRegs) {
        wg::barrier_wait(q_full + qb, q_parity);
        ws_load_q<D>(qa, q_tile, warp, lane);
      } else {
        acquire(q_full, 0);
      }
      if constexpr (kPair) {
        // ---- paired steps: stages j0 = 2 t and j1 = 2 t + 1 of the ring per turn (128 positions) ----
        // A half pair (odd nblk, the last turn) reads stage j0 in both halves with the second half's
        // mask words 0: its scores are -inf, its P 0, so it adds nothing (0 x the finite V of j0).
        constexpr int kNT2 = 2 * kNT;
        constexpr int kKK = kBN / 16;  // k-steps of PV per stage
        float s[kNT2][4];
        std::uint32_t p[2 * kKK][4];
        auto half = [&](int h) -> float(&)[kNT][4] { return *reinterpret_cast<float(*)[kNT][4]>(&s[h * kNT][0]); };
        auto issue_qk2 = [&](int st0, int st1) {
          const wg::DescBase kd0 = wg::k_major_base(smem_addr(skv + st0 * 2 * kTile));
          const wg::DescBase kd1 = wg::k_major_base(smem_addr(skv + st1 * 2 * kTile));
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) {
            wg::Wgmma<T, 64>::ss(half(0), qd.at(wg::k_major_offset(kSlab, ks)), kd0.at(wg::k_major_offset(kSlab, ks)), ks > 0 ? 1 : 0);
          }
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) {
            wg::Wgmma<T, 64>::ss(half(1), qd.at(wg::k_major_offset(kSlab, ks)), kd1.at(wg::k_major_offset(kSlab, ks)), ks > 0 ? 1 : 0);
          }
          wg::wgmma_commit();
        };
        auto issue_pv2 = [&](int st0, int st1) {
          const wg::DescBase vd0 = wg::mn_major_base(smem_addr(skv + st0 * 2 * kTile + kTile), kSlab);
          const wg::DescBase vd1 = wg::mn_major_base(smem_addr(skv + st1 * 2 * kTile + kTile), kSlab);
#pragma unroll
          for (int kk = 0; kk < kKK; ++kk) wg::Wgmma<T, D>::rs(o, p[kk], vd0.at(wg::mn_major_offset(kk)));
#pragma unroll
          for (int kk = 0; kk < kKK; ++kk) wg::Wgmma<T, D>::rs(o, p[kKK + kk], vd1.at(wg::mn_major_offset(kk)));
          wg::wgmma_commit();
        };
        auto rescale_and_pack2 = [&] {
          rescale_o<kDT, true>(o, alpha);
#pragma unroll
          for (int kk = 0; kk < 2 * kKK; ++kk) pack_p<T>(s, kk, p[kk]);
        };
        const int lr = cw * 64 + warp * 16 + (lane >> 2);  // the thread's low row within the tile
        unsigned long long mk[2][2];
        // A pair's two ring positions (stage, "full" parity); has1 false: a half pair (odd nblk, the
        // last turn), whose second half reads stage b0 again under zero mask words.
        struct Pair {
          int b0, b1;
          std::uint32_t ph0, ph1;
          bool has1;
        };
        int b = 0;
        std::uint32_t ph = 0;
        auto advance = [&] {
          if (++b == stages) {
            b = 0;
            ph ^= 1;
          }
        };
        auto next_pair = [&](int t) {
          Pair q;
          q.b0 = b;
          q.ph0 = ph;
          advance();
          q.has1 = 2 * t + 1 < nblk;
          q.b1 = q.has1 ? b : q.b0;
          q.ph1 = ph;
          if (q.has1) advance();
          return q;
        };
        auto wait_pair = [&](std::uint64_t* full, const Pair& q) {
          wg::barrier_wait(full + q.b0, q.ph0);
          if (q.has1) wg::barrier_wait(full + q.b1, q.ph1);
        };
        auto release_pair = [&](std::uint64_t* empty, const Pair& q) {
          release(empty + q.b0);
          if (q.has1) release(empty + q.b1);
        };
        // The mask words of the pair's stages from the ring, then the warp's `full`.
        auto read_masks = [&](const Pair& q) {
          mk[0][0] = pf_masks[q.b0 * Sh::kBM + lr];
          mk[1][0] = pf_masks[q.b0 * Sh::kBM + lr + 8];
          mk[0][1] = q.has1 ? pf_masks[q.b1 * Sh::kBM + lr] : 0ull;
          mk[1][1] = q.has1 ? pf_masks[q.b1 * Sh::kBM + lr + 8] : 0ull;
          return __all_sync(0xffffffffu, (mk[0][0] & mk[1][0] & mk[0][1] & mk[1][1]) == ~0ull);
        };
        const int npair = (nblk + 1) / 2;
        if (npair > 0) {
          // Turn 0: S of the first pair alone.
          Pair prev = next_pair(0);
          wait_pair(k_full, prev);
          fence_proxy_async_smem();
          bool full = read_masks(prev);
          turn_begin();
          wg::wgmma_fence();
          wg::fence_accumulator(s);
          issue_qk2(prev.b0, prev.b1);
          turn_end();
          wg::wgmma_wait<0>();
          wg::fence_accumulator(s);
          release_pair(k_empty, prev);
          softmax_probs<kNT2, true>(s, m, l, alpha, mk, full, a.scale_log2, tq);
          rescale_and_pack2();
#pragma unroll 1
          for (int t = 1; t < npair; ++t) {
            const Pair cur = next_pair(t);
            wait_pair(k_full, cur);
            wait_pair(v_full, prev);
            fence_proxy_async_smem();
            full = read_masks(cur);
            turn_begin();
            wg::wgmma_fence();
            wg::fence_accumulator(s);
            wg::fence_accumulator(o);
            issue_qk2(cur.b0, cur.b1);
            issue_pv2(prev.b0, prev.b1);
            turn_end();
            wg::wgmma_wait<1>();  // S of this pair (PV of the previous one may still run)
            wg::fence_accumulator(s);
            release_pair(k_empty, cur);
            softmax_probs<kNT2, true>(s, m, l, alpha, mk, full, a.scale_log2, tq);
            wg::wgmma_wait<0>();
            wg::fence_accumulator(o);
            fence_regs(p);
            release_pair(v_empty, prev);
            rescale_and_pack2();
            prev = cur;
          }
          // PV of the last pair.
          wait_pair(v_full, prev);
          fence_proxy_async_smem();
          turn_begin();
          wg::wgmma_fence();
          wg::fence_accumulator(o);
          issue_pv2(prev.b0, prev.b1);
          turn_end();
          wg::wgmma_wait<0>();
          wg::fence_accumulator(o);
          fence_regs(p);
          release_pair(v_empty, prev);
        }
      } else {
        float s[kNT][4];
        std::uint32_t p[kBN / 16][4];
        auto issue_qk = [&](int st) {
          const wg::DescBase kd = wg::k_major_base(smem_addr(skv + st * 2 * kTile));
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks) wg::Wgmma<T, 64>::rs_kmajor(s, qa[ks], kd.at(wg::k_major_offset(kSlab, ks)), ks > 0 ? 1 : 0);
          wg::wgmma_commit();
        };
        auto issue_pv = [&](int st) {
          const wg::DescBase vd = wg::mn_major_base(smem_addr(skv + st * 2 * kTile + kTile), kSlab);
#pragma unroll
          for (int kk = 0; kk < kBN / 16; ++kk) wg::Wgmma<T, D>::rs(o, p[kk], vd.at(wg::mn_major_offset(kk)));
          wg::wgmma_commit();
        };
        // O *= alpha (after the previous PV has retired), then P packed (per warp the A-fragment layout
        // of m64nNk16) for the next turn's PV.
        auto rescale_and_pack = [&] {
          rescale_o<kDT, true>(o, alpha);
#pragma unroll
          for (int kk = 0; kk < kBN / 16; ++kk) {
            pack_p<T>(s, kk, p[kk]);
          }
        };

        if (nblk > 0) {
          // The rows' mask words (L2) two steps ahead: a step of the pingpong pair is about as long as
          // an L2 round trip under load.
          // Prefetch: the producer put them into the stage (read after its "full" wait, before
          // the "empty" release).
          unsigned long long mask_lo = 0, mask_hi = 0, next_lo = 0, next_hi = 0, next2_lo = 0, next2_hi = 0;
          const int lr = cw * 64 + warp * 16 + (lane >> 2);  // the thread's low row within the tile
          if (!prefetch) {
            mask_lo = mask_word(0, gr_lo);
            mask_hi = mask_word(0, gr_hi);
            next_lo = mask_word(1, gr_lo);
            next_hi = mask_word(1, gr_hi);
            next2_lo = mask_word(2, gr_lo);
            next2_hi = mask_word(2, gr_hi);
          }
          // Step 0: S_0 alone, at the ring position the previous tile left (stage 0 on the first).
          int b_prev = rb;
          std::uint32_t ph_prev = rph;
          int b = rb + 1 == stages ? 0 : rb + 1;
          std::uint32_t ph = rb + 1 == stages ? rph ^ 1u : rph;
          acquire(k_full + b_prev, ph_prev);
          if (prefetch) {
            mask_lo = pf_masks[b_prev * Sh::kBM + lr];
            mask_hi = pf_masks[b_prev * Sh::kBM + lr + 8];
          }
          turn_begin();
          wg::wgmma_fence();
          wg::fence_accumulator(s);
          issue_qk(b_prev);
          turn_end();
          wg::wgmma_wait<0>();
          wg::fence_accumulator(s);
          release(k_empty + b_prev);
          {
            // Warp-uniform: all 16 rows of the warp list all 64 positions (no per-element select).
            const bool full = __all_sync(0xffffffffu, (mask_lo & mask_hi) == ~0ull);
            softmax_probs<kNT, true>(s, m, l, alpha, mask_lo, mask_hi, full, a.scale_log2, tq);
          }
          rescale_and_pack();
#pragma unroll 1
          for (int blk = 1; blk < nblk; ++blk) {
            if (!prefetch) {
              mask_lo = next_lo;
              mask_hi = next_hi;
              next_lo = next2_lo;
              next_hi = next2_hi;
              next2_lo = mask_word(blk + 2, gr_lo);
              next2_hi = mask_word(blk + 2, gr_hi);
            }
            if (prefetch) {
              // Both waits, then one proxy fence for K_blk and V_{blk-1} (it orders every write the
              // two waits made visible; the default path fences after each wait).
              wg::barrier_wait(k_full + b, ph);
              wg::barrier_wait(v_full + b_prev, ph_prev);
              fence_proxy_async_smem();
              mask_lo = pf_masks[b * Sh::kBM + lr];
              mask_hi = pf_masks[b * Sh::kBM + lr + 8];
            } else {
              acquire(k_full + b, ph);
              acquire(v_full + b_prev, ph_prev);
            }
            turn_begin();
            wg::wgmma_fence();
            wg::fence_accumulator(s);
            wg::fence_accumulator(o);
            issue_qk(b);
            issue_pv(b_prev);
            turn_end();
            wg::wgmma_wait<1>();  // S_blk (PV_{blk-1}, committed after it, may still run)
            wg::fence_accumulator(s);
            release(k_empty + b);
            const bool full = __all_sync(0xffffffffu, (mask_lo & mask_hi) == ~0ull);
            softmax_probs<kNT, true>(s, m, l, alpha, mask_lo, mask_hi, full, a.scale_log2, tq);
            wg::wgmma_wait<0>();
            wg::fence_accumulator(o);
            fence_regs(p);
            release(v_empty + b_prev);
            rescale_and_pack();
            b_prev = b;
            ph_prev = ph;
            if (++b == stages) {
              b = 0;
              ph ^= 1;
            }
          }
          // PV of the last step.
          acquire(v_full + b_prev, ph_prev);
          turn_begin();
          wg::wgmma_fence();
          wg::fence_accumulator(o);
          issue_pv(b_prev);
          turn_end();
          wg::wgmma_wait<0>();
          wg::fence_accumulator(o);
          fence_regs(p);
          release(v_empty + b_prev);
          rb = b;
          rph = ph;
        }
      }
      if (a.o_vec16) {
        // O through the warpgroup's own Q tile (its wgmmas are done with it): 16-byte row stores.
        epilogue_staged<T, D>(a, gp, o, m, l, q_tile, row0 + cw * 64, warp, lane, ct, 4 + cw);
      } else {
        epilogue<T, kDT>(a, gp, o, m, l, gr_lo, tq);
      }
      // kPersist: this warp is done with the Q buffer (its ldmatrix, the staged epilogue's writes and
      // reads): the producer may load tile j + 2's Q into it.
      if constexpr (kPersist) release(q_empty + qb);
    }
    if (pingpong && cw == 0) wg::named_barrier_sync(kTurnBarrier + 0, 256);  // warpgroup 1's last turn_end
  }
#else
  __trap();  // the host selects this kernel on sm_90 only
#endif
}

}  // namespace sparge::cuda::gather
