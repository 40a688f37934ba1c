// mbarrier and TMA helpers of the Hopper attention kernel, thin names over CCCL's cuda::ptx.
//
// A pipeline stage has a "full" barrier (count 1: the producer's arrive.expect_tx, completed by the
// TMA's transaction bytes) and an "empty" barrier (count = consumer warps: each consumer warp
// arrives once it has finished reading the stage). Stage use u (0, 1, 2, ...) of a stage waits for
// phase parity u & 1 on "full"; the producer's u-th refill waits for parity (u & 1) ^ 1 on "empty",
// which a fresh barrier satisfies immediately (the phase before the first counts as complete).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace sparge::cuda::attn::sm90 {

namespace ptx = ::cuda::ptx;

__device__ __forceinline__ void barrier_init(std::uint64_t* bar, int count) {
  ptx::mbarrier_init(bar, static_cast<std::uint32_t>(count));
}

// Makes the initializations visible to the async proxy (TMA) and the other threads; followed by a
// CTA barrier.
__device__ __forceinline__ void barrier_init_fence() { ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster); }

// Waits until the phase of this parity has completed. The try_wait carries a suspend-time hint (ns),
// so a thread whose phase is not complete yet is suspended by the hardware until it completes (or
// the hint elapses) instead of spinning: without it the sm90 attention producer's spin on an "empty"
// barrier was 9% of all warp instructions of the dense kernel (ncu, session 13), issue slots taken
// from the consumer warps of its SM sub-partition (neutral in time, session 13).
__device__ __forceinline__ void barrier_wait(std::uint64_t* bar, std::uint32_t parity) {
  constexpr std::uint32_t kSuspendHintNs = 0x989680;  // 10 ms: in practice until the phase completes
  while (!ptx::mbarrier_try_wait_parity(bar, parity, kSuspendHintNs)) {
  }
}

__device__ __forceinline__ void barrier_arrive(std::uint64_t* bar) {
  (void)ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar);
}

// `n` arrivals at once (one thread releasing for its warpgroup's warps).
__device__ __forceinline__ void barrier_arrive_n(std::uint64_t* bar, std::uint32_t n) {
  (void)ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, n);
}
// The producer's arrival announcing `bytes` of TMA transactions on this phase.
__device__ __forceinline__ void barrier_expect_bytes(std::uint64_t* bar, std::uint32_t bytes) {
  (void)ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
}

// One 4-D TMA tile load (coordinates innermost first: column, row, head, batch) into shared memory,
// completing `bytes` of transactions on `bar`. Rows outside the tensor are zero-filled.
__device__ __forceinline__ void tma_load_4d(void* dst, const void* tensor_map, int c0, int c1, int c2, int c3,
                                            std::uint64_t* bar) {
  const std::int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, tensor_map, coords, bar);
}

// One box from shared memory to global memory (TMA store, this thread's bulk group; the shared
// memory must have been written before a fence_smem_async by its writers and a barrier). Then
// bulk_commit, and bulk_wait_read before the shared memory is reused (or before exit).
__device__ __forceinline__ void tma_store_4d(const void* tensor_map, const void* src, int c0, int c1, int c2, int c3) {
  const std::int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, tensor_map, coords, src);
}
__device__ __forceinline__ void bulk_commit() { ptx::cp_async_bulk_commit_group(); }
__device__ __forceinline__ void bulk_wait_read() { ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{}); }
__device__ __forceinline__ void shared_store(std::uint32_t addr, std::uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
// This thread's generic-proxy writes to shared memory made visible to the async proxy (TMA).
__device__ __forceinline__ void fence_smem_async() { ptx::fence_proxy_async(ptx::space_shared); }

// A hint: the same box fetched into L2 only (no shared memory, no barrier; PTX
// cp.async.bulk.prefetch.tensor, which CCCL's cuda::ptx does not wrap).
__device__ __forceinline__ void tma_prefetch_4d(const void* tensor_map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];" ::"l"(tensor_map), "r"(c0),
               "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// Hints: the 128-byte line at p, and `bytes` (a multiple of 16, p 16-byte aligned) from p, into L2.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, std::uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// The same load multicast to the CTAs of `cta_mask` in this cluster: the box lands at dst's offset in
// each one's shared memory and completes its bytes on the barrier at bar's offset in each.
__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const void* tensor_map, int c0, int c1, int c2, int c3,
                                                      std::uint64_t* bar, std::uint16_t cta_mask) {
  const std::int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, tensor_map, coords, bar, cta_mask);
}

// Clusters (multicast variant): this CTA's rank, an arrival on the barrier at the same offset in
// CTA `peer`'s shared memory, and a barrier of every thread of the cluster (release / acquire;
// not .aligned: threads of a warp may arrive from different branches).
__device__ __forceinline__ std::uint32_t cluster_rank() {
  std::uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void barrier_arrive_peer(std::uint64_t* bar, std::uint32_t peer) {
  const std::uint32_t local = static_cast<std::uint32_t>(__cvta_generic_to_shared(bar));
  std::uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(peer));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// Register budget of a warpgroup (setmaxnreg): the producer gives registers back, the consumers
// take them.
template <int kRegs>
__device__ __forceinline__ void registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void registers_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// AND of `pred` over the `threads` threads that use named barrier `id` (threads: a multiple of 32).
__device__ __forceinline__ bool named_barrier_and(int id, int threads, bool pred) {
  std::uint32_t out;
  asm volatile(
      "{\n.reg .pred q, p;\nsetp.ne.u32 q, %1, 0;\nbar.red.and.pred p, %2, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(out)
      : "r"(static_cast<std::uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return out != 0;
}

// Number of the `threads` threads on named barrier `id` whose `pred` is true (barrier.red.popc,
// not .aligned: the warps of one warpgroup may reach it from different (masked / unmasked) copies
// of the softmax). The result is the same in every participating thread.
__device__ __forceinline__ std::uint32_t named_barrier_popc(int id, int threads, bool pred) {
  std::uint32_t out;
  asm volatile(
      "{\n.reg .pred q;\nsetp.ne.u32 q, %1, 0;\nbarrier.red.popc.u32 %0, %2, %3, q;\n}\n"
      : "=r"(out)
      : "r"(static_cast<std::uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return out;
}

// One 32-bit word of shared memory written and read by different warpgroups without a barrier
// between them (the pv_threshold vote ring: a word carries its own tag, so no other data needs
// ordering). Atomic instructions: strong operations in the PTX memory model, which
// compute-sanitizer's racecheck also recognises (plain volatile accesses, morally strong too, were
// reported as hazards on the H200, 2026-11-30). The load is an atomic OR of 0; both run once per
// key tile and warpgroup (the load only when the warpgroup's own rows all vote to skip).
// The store returns the word it replaced (callers ignore it; returning it keeps the front end from
// warning about a variable set but never used).
__device__ __forceinline__ std::uint32_t shared_store_atomic(std::uint32_t addr, std::uint32_t v) {
  std::uint32_t old;
  asm volatile("atom.shared.exch.b32 %0, [%1], %2;\n" : "=r"(old) : "r"(addr), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ std::uint32_t shared_load_atomic(std::uint32_t addr) {
  std::uint32_t v;
  asm volatile("atom.shared.or.b32 %0, [%1], 0;\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Named-barrier halves for the consumer warpgroups' pingpong: one warpgroup waits (sync) until the
// other has signalled (arrive); `threads` counts both sides.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace sparge::cuda::attn::sm90
