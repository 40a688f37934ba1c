// dist::sparse_attention over NCCL (docs/context_parallel.md). In order, on exec.stream unless said:
//   1. The block map rows of this rank's query blocks, equal bit for bit to a single GPU's:
//      K sums of the rank's K pieces (kKSumRows-row chunks, as the single-GPU K mean) -> all-gather ->
//      the global K mean (the single-GPU k_mean kernel on the gathered chunk sums, so the same
//      summation order) -> pooled K and K similarity of the rank's pieces -> all-gather -> pooled
//      Q, scores and selection of the rank's query pieces, each with a geometry whose causal
//      visibility is the global one (below).
//   2. The number of LUT entries of every ring call (so empty calls are skipped) comes back to
//      the host: the first bounded wait.
//   3. The ring: K/V shards move one rank forward per step on the transfer stream (ncclSend /
//      ncclRecv in a group, double-buffered), the compute of step t overlaps the transfer of step
//      t+1; each call attends its restricted LUT and its partial merges into an fp32 accumulator.
//   4. The accumulator is written to the caller's o / lse; the final bounded wait.
// Every wait polls the CUDA event and ncclCommGetAsyncError against one deadline; on a timeout or
// an error after the first NCCL call the communicator is aborted, so no rank hangs.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cuda/block_map/block_map.cuh"
#include "cuda/scratch_pool.h"
#include "dist/kernels.h"
#include "dist/plan.h"
#include "dist/run.h"
#include "validate/validate.h"

namespace sparge::dist::detail {

namespace {

namespace bm = sparge::cuda::block_map;
using sparge::detail::cat;
using Clock = std::chrono::steady_clock;

constexpr const char* kOp = "dist::sparse_attention";
// Chunks start at multiples of kChunkAlign rows: whole K-mean chunks and whole blocks of both
// sizes, which is what makes every pooled value of a rank's piece the single GPU's bits.
static_assert(kChunkAlign % bm::kKSumRows == 0, "chunks must hold whole K-mean chunks");
static_assert(kChunkAlign % 128 == 0, "chunks must hold whole blocks");

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Bounded waits and the abort rule. Before the first NCCL call an error returns as is (the
// communicator is untouched); after it, every error aborts the communicator, because peers may
// already be blocked on this rank.
class Guard {
 public:
  Guard(ncclComm_t comm, double timeout_s, int rank, int size)
      : comm_(comm),
        timeout_s_(timeout_s),
        deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))),
        who_(cat(kOp, ": rank ", rank, " of ", size, ": ")) {}

  void started() { started_ = true; }
  bool is_started() const { return started_; }
  bool aborted() const { return aborted_; }

  Status fail(StatusCode code, const std::string& why) {
    if (started_ && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
      return {code, who_ + why + "; the communicator was aborted (ncclCommAbort) and must not be used again"};
    }
    return {code, who_ + why};
  }

  Status cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return {};
    (void)cudaGetLastError();
    return fail(StatusCode::runtime_error, cat("CUDA error in ", what, ": ", cudaGetErrorString(e)));
  }

  // Completes an NCCL call: a non-blocking communicator answers ncclInProgress until the call's
  // host side (e.g. connecting to a peer) is done, and no other call may be made before that.
  Status nccl(ncclResult_t r, const char* what) {
    for (;;) {
      if (r == ncclSuccess) return {};
      if (r != ncclInProgress) {
        return fail(StatusCode::runtime_error, cat("NCCL error in ", what, ": ", ncclGetErrorString(r), " (",
                                                   ncclGetLastError(comm_), ")"));
      }
      if (Clock::now() > deadline_) return timeout(what);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &async);
      r = q != ncclSuccess ? q : async;
    }
  }

  // Waits for an event recorded behind NCCL work, polling the communicator's asynchronous error.
  Status wait(cudaEvent_t ev, const char* what) {
    for (;;) {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return {};
      if (e != cudaErrorNotReady) return cuda(e, what);
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &async);
      const ncclResult_t r = q != ncclSuccess ? q : async;
      if (r != ncclSuccess && r != ncclInProgress) {
        return fail(StatusCode::runtime_error, cat("NCCL error while waiting for ", what, ": ", ncclGetErrorString(r),
                                                   " (", ncclGetLastError(comm_), ")"));
      }
      if (Clock::now() > deadline_) return timeout(what);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  const std::string& who() const { return who_; }

 private:
  Status timeout(const char* what) {
    return fail(StatusCode::runtime_error, cat("timed out after ", timeout_s_, " s (timeout_seconds) waiting for ", what,
                                               " (a peer failed or stopped participating)"));
  }

  ncclComm_t comm_;
  double timeout_s_;
  Clock::time_point deadline_;
  std::string who_;
  bool started_ = false;
  bool aborted_ = false;
};

// Rows [begin, begin + len) of dimension `dim` of t.
Tensor slice(const Tensor& t, int dim, std::int64_t begin, std::int64_t len) {
  Tensor r = t;
  r.data = static_cast<char*>(t.data) + begin * t.stride[dim] * static_cast<std::int64_t>(dtype_size(t.dtype));
  r.shape[dim] = len;
  return r;
}

Tensor contiguous(void* data, DType dt, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  return make_tensor(data, dt, {a, b, c, d});
}

// The block map's view of a q / k piece (16-byte loads when the layout allows, as block_map.cu).
bm::Rows rows_of(const Tensor& t) {
  bm::Rows r;
  r.data = static_cast<const std::uint16_t*>(t.data);
  for (int i = 0; i < 4; ++i) r.stride[i] = t.stride[i];
  bool vec = !(t.shape[3] > 1 && t.stride[3] != 1) && reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0;
  for (int i = 0; i < 3; ++i) vec = vec && !(t.shape[i] > 1 && t.stride[i] % 8 != 0);
  r.vec = vec;
  return r;
}

template <class T>
bm::Out<T> out_of(const Tensor& t) {
  bm::Out<T> o;
  o.data = static_cast<T*>(t.data);
  for (int i = 0; i < t.ndim; ++i) o.stride[i] = t.stride[i];
  return o;
}

kernels::I32View i32_of(const Tensor& t) {
  kernels::I32View v;
  v.data = static_cast<std::int32_t*>(t.data);
  for (int i = 0; i < t.ndim; ++i) v.stride[i] = t.stride[i];
  return v;
}

void fill_heads(PerHead v, std::int64_t hq, bm::HeadValues& out, std::vector<float>& host) {
  host.resize(static_cast<std::size_t>(hq));
  for (std::int64_t h = 0; h < hq; ++h) host[static_cast<std::size_t>(h)] = sparge::detail::per_head(v, static_cast<int>(h));
  if (hq <= bm::kInlineHeads) {
    for (std::int64_t h = 0; h < hq; ++h) out.inl[h] = host[static_cast<std::size_t>(h)];
  }
}

// One allocation carved into 256-byte aligned regions.
class Arena {
 public:
  std::size_t add(std::size_t bytes) {
    const std::size_t off = size_;
    size_ += (bytes + 255) / 256 * 256;
    return off;
  }
  std::size_t size() const { return size_; }
  template <class T>
  T* at(char* base, std::size_t off) const {
    return reinterpret_cast<T*>(base + off);
  }

 private:
  std::size_t size_ = 0;
};

// Pinned host memory for the call totals, kept per thread and only grown: cudaFreeHost may
// synchronize the device (and so wait on work of other streams, or on a hung peer's transfer), and
// pageable memory would make the device-to-host copy block the host without a bound.
unsigned long long* pinned_totals(std::size_t n) {
  thread_local unsigned long long* buf = nullptr;
  thread_local std::size_t cap = 0;
  if (n > cap) {
    void* fresh = nullptr;
    if (cudaHostAlloc(&fresh, n * sizeof(unsigned long long), cudaHostAllocPortable) != cudaSuccess) return nullptr;
    buf = static_cast<unsigned long long*>(fresh);  // the smaller old buffer is left allocated (see above)
    cap = n;
  }
  return buf;
}

// SPARGE_DIST_PROFILE=1 (read per call): timing events at the phase boundaries, printed per rank
// to stderr after the final wait, in ms from the start of the call's GPU work:
//   map = block map done (all-gathers included), pack = own K/V packed, xfer t = transfer of
//   step t+1's shard done (transfer stream), step t = compute of step t done, end = outputs written.
class Profile {
 public:
  explicit Profile(int rank) : rank_(rank), host0_(Clock::now()) {
    const char* v = std::getenv("SPARGE_DIST_PROFILE");
    on_ = v != nullptr && v[0] != '\0' && v[0] != '0';
  }
  ~Profile() {
    for (auto& m : marks_) cudaEventDestroy(m.second);
  }
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

  // Host time since the call began, for the host-side gaps (planning, allocation, waits).
  void host_mark(const char* name) {
    if (!on_) return;
    host_.emplace_back(name, std::chrono::duration<double, std::milli>(Clock::now() - host0_).count());
  }

  void mark(std::string name, cudaStream_t s) {
    if (!on_) return;
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return;
    cudaEventRecord(e, s);
    marks_.emplace_back(std::move(name), e);
  }
  // After the final wait: every event has completed.
  void print() const {
    if (!on_ || marks_.empty()) return;
    std::string line = cat("dist profile rank ", rank_, ":");
    for (std::size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, marks_[0].second, marks_[i].second) != cudaSuccess) ms = -1.0f;
      char buf[64];
      std::snprintf(buf, sizeof buf, " %s %.2f", marks_[i].first.c_str(), static_cast<double>(ms));
      line += buf;
    }
    line += " | host:";
    for (const auto& h : host_) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " %s %.2f", h.first, h.second);
      line += buf;
    }
    std::fprintf(stderr, "%s (ms)\n", line.c_str());
  }

 private:
  int rank_;
  bool on_ = false;
  Clock::time_point host0_;
  std::vector<std::pair<std::string, cudaEvent_t>> marks_;
  std::vector<std::pair<const char*, double>> host_;
};

// Resources released on every path. On an error the frees are stream-ordered behind everything
// already enqueued (the transfer stream included), so nothing is freed under a running kernel.
struct Resources {
  cudaStream_t compute = nullptr;
  cudaStream_t transfer = nullptr;
  bool own_transfer = false;
  char* base = nullptr;
  std::vector<cudaEvent_t> events;

  cudaEvent_t event() {
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) return nullptr;
    events.push_back(e);
    return e;
  }

  void release() {
    if (base != nullptr) {
      if (transfer != nullptr) {
        cudaEvent_t tail = event();
        if (tail != nullptr && cudaEventRecord(tail, transfer) == cudaSuccess) cudaStreamWaitEvent(compute, tail, 0);
      }
      cudaFreeAsync(base, compute);
    }
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (own_transfer && transfer != nullptr) cudaStreamDestroy(transfer);
    (void)cudaGetLastError();
  }
};

Status run_impl(const SparseAttentionParams& p, Guard& g, Resources& res, Profile& prof) {
  const int R = p.comm.size, rank = p.comm.rank;
  auto comm = static_cast<ncclComm_t>(p.comm.nccl_comm);
  cudaStream_t cs = static_cast<cudaStream_t>(p.exec.stream);
  res.compute = cs;
  const std::int64_t B = p.q.shape[0], Hq = p.q.shape[2], Hk = p.k.shape[2], D = p.q.shape[3], S = p.seq_len;
  const bool bf16 = p.q.dtype == DType::bf16;
  const int blkq = p.blkq, blkk = p.blkk;

  // ---- the communicator matches the params --------------------------------------------------
  int count = 0, user_rank = 0, comm_dev = 0, dev = 0;
  SPARGE_RETURN_IF_ERROR(g.nccl(ncclCommCount(comm, &count), "ncclCommCount"));
  SPARGE_RETURN_IF_ERROR(g.nccl(ncclCommUserRank(comm, &user_rank), "ncclCommUserRank"));
  SPARGE_RETURN_IF_ERROR(g.nccl(ncclCommCuDevice(comm, &comm_dev), "ncclCommCuDevice"));
  SPARGE_RETURN_IF_ERROR(g.cuda(cudaGetDevice(&dev), "cudaGetDevice"));
  if (count != R) return invalid_argument(cat(kOp, ": comm.size = ", R, " but the communicator has ", count, " ranks"));
  if (user_rank != rank) return invalid_argument(cat(kOp, ": comm.rank = ", rank, " but the communicator's rank is ", user_rank));
  if (comm_dev != dev) {
    return invalid_argument(cat(kOp, ": the current CUDA device is ", dev, " but the communicator's device is ", comm_dev));
  }

  // ---- the plan -----------------------------------------------------------------------------
  std::vector<Shard> shards(static_cast<std::size_t>(R));
  for (int r = 0; r < R; ++r) shards[static_cast<std::size_t>(r)] = shard_of(S, R, r);
  const Shard& me = shards[static_cast<std::size_t>(rank)];
  const std::int64_t L = me.len;
  const std::int64_t NK = ceil_div(S, blkk), NQL = ceil_div(L, blkq), NC = ceil_div(S, bm::kKSumRows);
  if (D % 8 != 0 || D > 256) {
    return unsupported(cat(kOp, ": head dim ", D, " is not supported by the block map (a multiple of 8, at most 256)"));
  }
  if (NK > bm::kMaxKeyBlocks) {
    return unsupported(cat(kOp, ": NK = ", NK, " key blocks (seq_len = ", S, ", blkk = ", blkk,
                           ") exceed the CUDA selection limit of ", bm::kMaxKeyBlocks));
  }
  int optin = 0;
  SPARGE_RETURN_IF_ERROR(g.cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "a device query"));
  if (bm::select_smem_bytes(NK) > static_cast<std::size_t>(optin)) {
    return unsupported(cat(kOp, ": NK = ", NK, " key blocks need more shared memory for the selection than device ", dev,
                           " allows (", optin, " bytes)"));
  }
  plan::Layout layout;
  layout.seq_len = S;
  layout.world = R;
  layout.blkq = blkq;
  layout.blkk = blkk;
  layout.causal = p.is_causal;
  std::vector<std::vector<plan::Call>> calls(static_cast<std::size_t>(R));
  std::size_t ncalls = 0;
  for (int t = 0; t < R; ++t) {
    calls[static_cast<std::size_t>(t)] = plan::step_calls(layout, rank, t);
    ncalls += calls[static_cast<std::size_t>(t)].size();
  }

  // Sizes of what each rank contributes to the two all-gathers (padded to the largest rank).
  const auto nchunks = [](std::int64_t len) { return ceil_div(len, bm::kKSumRows); };
  std::int64_t max_kpart = 1, max_pk = 1, max_shard = 0, max_qpiece = 0;
  for (const Shard& s : shards) {
    std::int64_t kpart = 0, pk = 0;
    for (const Piece& pc : s.piece) {
      kpart += B * Hk * nchunks(pc.len) * D;
      pk += B * Hk * ceil_div(pc.len, blkk) * (D + 1);
    }
    max_kpart = std::max(max_kpart, kpart);
    max_pk = std::max(max_pk, pk);
    max_shard = std::max(max_shard, s.len);
  }
  for (const Piece& pc : me.piece) max_qpiece = std::max(max_qpiece, ceil_div(pc.len, blkq));
  const std::int64_t max_kv_blocks = ceil_div(max_shard, blkk);

  // ---- scratch ------------------------------------------------------------------------------
  Arena A;
  const auto f32 = [](std::int64_t n) { return static_cast<std::size_t>(n) * 4; };
  const std::size_t o_kpart_send = A.add(f32(max_kpart)), o_kpart_recv = A.add(f32(R * max_kpart));
  const std::size_t o_kpart_g = A.add(f32(B * Hk * NC * D)), o_kmean = A.add(f32(B * Hk * D));
  const std::size_t o_pk_send = A.add(f32(max_pk)), o_pk_recv = A.add(f32(R * max_pk));
  const std::size_t o_pk_g = A.add(f32(B * Hk * NK * D)), o_ksim_g = A.add(f32(B * Hk * NK));
  const std::size_t o_pq = A.add(f32(B * Hq * max_qpiece * D)), o_qsim = A.add(f32(B * Hq * max_qpiece));
  const std::size_t o_scores = A.add(f32(B * Hq * max_qpiece * NK)), o_heads = A.add(f32(2 * Hq));
  const bool own_lut = !p.maybe_lut.present();
  const std::size_t o_lut = own_lut ? A.add(f32(B * Hq * NQL * NK)) : 0;
  const std::size_t o_counts = own_lut ? A.add(f32(B * Hq * NQL)) : 0;
  const std::size_t slot_bytes = static_cast<std::size_t>(2 * B * max_shard * Hk * D) * 2;
  const std::size_t o_slot0 = A.add(slot_bytes), o_slot1 = A.add(slot_bytes);
  const std::size_t o_step_lut = A.add(f32(B * Hq * NQL * max_kv_blocks)), o_step_counts = A.add(f32(B * Hq * NQL));
  const std::size_t o_acc_o = A.add(f32(B * L * Hq * D)), o_acc_lse = A.add(f32(B * Hq * L));
  const std::size_t o_part_o = A.add(f32(B * L * Hq * D)), o_part_lse = A.add(f32(B * Hq * L));
  const std::size_t o_totals = A.add(std::max<std::size_t>(ncalls, 1) * sizeof(unsigned long long));

  // From the retained pool: the default pool would unmap these gigabytes at every synchronization
  // and map them again on the next call.
  SPARGE_RETURN_IF_ERROR(g.cuda(sparge::cuda::scratch_alloc(reinterpret_cast<void**>(&res.base), A.size(), cs),
                                "cudaMallocFromPoolAsync of the scratch"));
  prof.host_mark("alloc");
  prof.mark("start", cs);
  unsigned long long* host_totals = pinned_totals(std::max<std::size_t>(ncalls, 1));
  if (host_totals == nullptr) return g.cuda(cudaErrorMemoryAllocation, "cudaHostAlloc of the call totals");
  char* base = res.base;
  float* kpart_send = A.at<float>(base, o_kpart_send);
  float* kpart_recv = A.at<float>(base, o_kpart_recv);
  float* kpart_g = A.at<float>(base, o_kpart_g);
  float* kmean = A.at<float>(base, o_kmean);
  float* pk_send = A.at<float>(base, o_pk_send);
  float* pk_recv = A.at<float>(base, o_pk_recv);
  float* pk_g = A.at<float>(base, o_pk_g);
  float* ksim_g = A.at<float>(base, o_ksim_g);
  std::uint16_t* slot[2] = {A.at<std::uint16_t>(base, o_slot0), A.at<std::uint16_t>(base, o_slot1)};
  float* acc_o = A.at<float>(base, o_acc_o);
  float* acc_lse = A.at<float>(base, o_acc_lse);
  float* part_o = A.at<float>(base, o_part_o);
  float* part_lse = A.at<float>(base, o_part_lse);
  auto* totals = A.at<unsigned long long>(base, o_totals);
  const Tensor lut = own_lut ? contiguous(A.at<void>(base, o_lut), DType::i32, B, Hq, NQL, NK) : p.maybe_lut;
  const Tensor counts =
      own_lut ? make_tensor(A.at<void>(base, o_counts), DType::i32, {B, Hq, NQL}) : p.maybe_counts;

  // The attention kernels must take this problem (checked on the step-0 call shape before any
  // communication, so an unsupported problem fails on every rank alike, without a timeout).
  const DType dt = p.q.dtype;
  const auto kv_view = [&](int which, const Shard& s, int k_or_v) {
    const std::int64_t n = B * s.len * Hk * D;
    return contiguous(slot[which] + k_or_v * n, dt, B, s.len, Hk, D);
  };
  const auto o_view = [&](float* o, std::int64_t row0, std::int64_t rows) {
    return slice(contiguous(o, DType::f32, B, L, Hq, D), 1, row0, rows);
  };
  const auto lse_view = [&](float* lse, std::int64_t row0, std::int64_t rows) {
    return slice(make_tensor(lse, DType::f32, {B, Hq, L}), 2, row0, rows);
  };
  {
    BlockSparseAttentionParams ap;
    ap.q = p.q;
    ap.k = kv_view(0, me, 0);
    ap.v = kv_view(0, me, 1);
    ap.o = o_view(acc_o, 0, L);
    ap.maybe_lse = lse_view(acc_lse, 0, L);
    ap.lut = contiguous(A.at<void>(base, o_step_lut), DType::i32, B, Hq, NQL, ceil_div(L, blkk));
    ap.counts = make_tensor(A.at<void>(base, o_step_counts), DType::i32, {B, Hq, NQL});
    ap.blkq = blkq;
    ap.blkk = blkk;
    ap.scale = p.scale;
    ap.exec = {Backend::cuda, cs, 0};
    SPARGE_RETURN_IF_ERROR(sparge::supported(ap));
  }

  // ---- selection rule (as block_map.cu) -------------------------------------------------------
  bm::SelectRule rule;
  rule.use_topk = !p.topk.empty();
  rule.sink = p.attention_sink;
  rule.has_threshold = !p.simthreshd1.empty();
  std::vector<float> host_value, host_threshold;
  fill_heads(rule.use_topk ? p.topk : p.cdfthreshd, Hq, rule.value, host_value);
  if (rule.has_threshold) fill_heads(p.simthreshd1, Hq, rule.threshold, host_threshold);
  if (Hq > bm::kInlineHeads) {
    float* heads = A.at<float>(base, o_heads);
    rule.value.dev = heads;
    SPARGE_RETURN_IF_ERROR(g.cuda(cudaMemcpyAsync(heads, host_value.data(), f32(Hq), cudaMemcpyHostToDevice, cs), "copying topk"));
    if (rule.has_threshold) {
      rule.threshold.dev = heads + Hq;
      SPARGE_RETURN_IF_ERROR(
          g.cuda(cudaMemcpyAsync(heads + Hq, host_threshold.data(), f32(Hq), cudaMemcpyHostToDevice, cs), "copying simthreshd1"));
    }
  }

  // ---- 1. the block map ---------------------------------------------------------------------
  bm::Geometry base_g;
  base_g.nseq = B;
  base_g.hq = Hq;
  base_g.hk = Hk;
  base_g.d = D;
  base_g.blkq = blkq;
  base_g.blkk = blkk;
  base_g.rows_q = L;
  base_g.rows_k = L;
  const auto piece_geometry_k = [&](const Piece& pc) {
    bm::Geometry gp = base_g;
    gp.sq = pc.len;
    gp.sk = pc.len;
    gp.nq = ceil_div(pc.len, blkq);
    gp.nk = ceil_div(pc.len, blkk);
    return gp;
  };
  // Copies per-piece regions [B * Hk rows of n_p * width floats] of every rank's gathered buffer
  // to their global place [B * Hk rows of total * width floats] (piece blocks start at first_p).
  const auto scatter = [&](const float* recv, std::int64_t stride_rank, float* dst, std::int64_t total, std::int64_t width,
                           std::int64_t unit, bool second_region) -> Status {
    for (int r = 0; r < R; ++r) {
      const Shard& s = shards[static_cast<std::size_t>(r)];
      std::int64_t off = 0;
      if (second_region) {  // the K similarities follow the pooled K of both pieces
        for (const Piece& pc : s.piece) off += B * Hk * ceil_div(pc.len, unit) * D;
      }
      for (const Piece& pc : s.piece) {
        const std::int64_t n = ceil_div(pc.len, unit);
        if (n == 0) continue;
        const std::size_t row = f32(n * width);
        SPARGE_RETURN_IF_ERROR(g.cuda(cudaMemcpy2DAsync(dst + (pc.global_begin / unit) * width, f32(total * width),
                                                        recv + r * stride_rank + off, row, row,
                                                        static_cast<std::size_t>(B * Hk), cudaMemcpyDeviceToDevice, cs),
                                      "gathering the K statistics"));
        off += B * Hk * n * width;
      }
    }
    return {};
  };

  if (p.smooth_k) {
    std::int64_t off = 0;
    for (const Piece& pc : me.piece) {
      if (pc.len == 0) continue;
      bm::Scratch sp;
      sp.nchunks = nchunks(pc.len);
      sp.k_part = kpart_send + off;
      SPARGE_RETURN_IF_ERROR(g.cuda(bm::launch_k_chunk_sums(piece_geometry_k(pc), rows_of(slice(p.k, 1, pc.local_begin, pc.len)), bf16, sp, cs),
                                    "the K sums"));
      off += B * Hk * sp.nchunks * D;
    }
    g.started();
    SPARGE_RETURN_IF_ERROR(g.nccl(ncclAllGather(kpart_send, kpart_recv, static_cast<std::size_t>(max_kpart), ncclFloat32, comm, cs),
                                  "ncclAllGather of the K sums"));
    SPARGE_RETURN_IF_ERROR(scatter(kpart_recv, max_kpart, kpart_g, NC, D, bm::kKSumRows, false));
    bm::Geometry gg = base_g;
    gg.sq = gg.sk = S;
    gg.nq = ceil_div(S, blkq);
    gg.nk = NK;
    bm::Scratch sg;
    sg.nchunks = NC;
    sg.k_part = kpart_g;
    sg.k_mean = kmean;
    SPARGE_RETURN_IF_ERROR(g.cuda(bm::launch_k_mean(gg, sg, cs), "the K mean"));
  }
  {
    std::int64_t off_pk = 0, off_sim = 0;
    for (const Piece& pc : me.piece) off_sim += B * Hk * ceil_div(pc.len, blkk) * D;
    for (const Piece& pc : me.piece) {
      if (pc.len == 0) continue;
      const bm::Geometry gp = piece_geometry_k(pc);
      bm::Scratch sp;
      sp.pk = pk_send + off_pk;
      sp.k_sim = pk_send + off_sim;
      SPARGE_RETURN_IF_ERROR(g.cuda(bm::launch_pool_one(gp, rows_of(slice(p.k, 1, pc.local_begin, pc.len)), bf16, true,
                                                        p.smooth_k ? kmean : nullptr, sp, cs),
                                    "the K pooling"));
      off_pk += B * Hk * gp.nk * D;
      off_sim += B * Hk * gp.nk;
    }
    g.started();
    SPARGE_RETURN_IF_ERROR(g.nccl(ncclAllGather(pk_send, pk_recv, static_cast<std::size_t>(max_pk), ncclFloat32, comm, cs),
                                  "ncclAllGather of the pooled K"));
    SPARGE_RETURN_IF_ERROR(scatter(pk_recv, max_pk, pk_g, NK, D, blkk, false));
    SPARGE_RETURN_IF_ERROR(scatter(pk_recv, max_pk, ksim_g, NK, 1, blkk, true));
  }
  const float map_scale = p.scale == 0.0f ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))) : p.scale;
  for (const Piece& pc : me.piece) {
    if (pc.len == 0) continue;
    // Causal visibility of this piece's query blocks in global rows: bottom-right alignment with
    // Sq' = len and Sk' = global_begin + len gives "row i (global g0 + i) sees keys <= g0 + i".
    bm::Geometry gq = base_g;
    gq.sq = pc.len;
    gq.nq = ceil_div(pc.len, blkq);
    gq.sk = p.is_causal ? pc.global_begin + pc.len : S;
    gq.nk = NK;
    gq.causal = p.is_causal;
    bm::Scratch sq;
    sq.pq = A.at<float>(base, o_pq);
    sq.q_sim = A.at<float>(base, o_qsim);
    sq.pk = pk_g;
    sq.k_sim = ksim_g;
    sq.scores = A.at<float>(base, o_scores);
    SPARGE_RETURN_IF_ERROR(g.cuda(bm::launch_pool_one(gq, rows_of(slice(p.q, 1, pc.local_begin, pc.len)), bf16, false, nullptr, sq, cs),
                                  "the Q pooling"));
    SPARGE_RETURN_IF_ERROR(g.cuda(bm::launch_scores(gq, map_scale, sq, cs), "the pooled scores"));
    const std::int64_t qb0 = pc.local_begin / blkq;
    SPARGE_RETURN_IF_ERROR(g.cuda(bm::launch_select(gq, rule, sq, out_of<std::int32_t>(slice(lut, 2, qb0, gq.nq)),
                                                    out_of<std::int32_t>(slice(counts, 2, qb0, gq.nq)), bm::Out<float>{}, cs),
                                  "the selection"));
  }

  // ---- 2. entries per call ------------------------------------------------------------------
  SPARGE_RETURN_IF_ERROR(g.cuda(cudaMemsetAsync(totals, 0, std::max<std::size_t>(ncalls, 1) * sizeof(unsigned long long), cs),
                                "clearing the call totals"));
  {
    std::size_t idx = 0;
    for (const auto& step : calls) {
      for (const plan::Call& c : step) {
        kernels::FilterArgs fa;
        fa.call = c;
        fa.batch = B;
        fa.heads = Hq;
        fa.lut = i32_of(lut);
        fa.counts = i32_of(counts);
        fa.total = totals + idx++;
        SPARGE_RETURN_IF_ERROR(g.cuda(kernels::launch_filter(fa, cs), "counting the LUT entries of the ring calls"));
      }
    }
  }
  cudaEvent_t ev_map = res.event();
  if (ev_map == nullptr) return g.cuda(cudaErrorMemoryAllocation, "cudaEventCreate");
  SPARGE_RETURN_IF_ERROR(g.cuda(cudaMemcpyAsync(host_totals, totals, ncalls * sizeof(unsigned long long), cudaMemcpyDeviceToHost, cs),
                                "copying the call totals"));
  prof.mark("map", cs);
  SPARGE_RETURN_IF_ERROR(g.cuda(cudaEventRecord(ev_map, cs), "cudaEventRecord"));
  SPARGE_RETURN_IF_ERROR(g.wait(ev_map, "the block map (all-gathers of the K statistics)"));
  prof.host_mark("map_waited");

  // ---- 3. the ring --------------------------------------------------------------------------
  if (p.comm.stream != nullptr) {
    res.transfer = static_cast<cudaStream_t>(p.comm.stream);
  } else {
    SPARGE_RETURN_IF_ERROR(g.cuda(cudaStreamCreateWithFlags(&res.transfer, cudaStreamNonBlocking), "creating the transfer stream"));
    res.own_transfer = true;
  }
  cudaStream_t ts = res.transfer;
  cudaEvent_t ev_packed = res.event(), ev_recv[2] = {res.event(), res.event()}, ev_used[2] = {res.event(), res.event()};
  cudaEvent_t ev_done = res.event();
  if (ev_packed == nullptr || ev_recv[0] == nullptr || ev_recv[1] == nullptr || ev_used[0] == nullptr ||
      ev_used[1] == nullptr || ev_done == nullptr) {
    return g.cuda(cudaErrorMemoryAllocation, "cudaEventCreate");
  }

  // The own shard, packed: K then V, each [B, L, Hk, D] contiguous (the message of step 0).
  for (int kv = 0; kv < 2; ++kv) {
    const Tensor& src = kv == 0 ? p.k : p.v;
    kernels::Rows16 r;
    r.data = static_cast<const std::uint16_t*>(src.data);
    for (int i = 0; i < 4; ++i) {
      r.shape[i] = src.shape[i];
      r.stride[i] = src.stride[i];
    }
    SPARGE_RETURN_IF_ERROR(g.cuda(kernels::launch_pack(r, slot[0] + kv * B * L * Hk * D, cs), "packing the K/V shard"));
  }
  prof.mark("pack", cs);
  SPARGE_RETURN_IF_ERROR(g.cuda(cudaEventRecord(ev_packed, cs), "cudaEventRecord"));

  const auto message_bytes = [&](int shard) {
    return static_cast<std::size_t>(2 * B * shards[static_cast<std::size_t>(shard)].len * Hk * D) * 2;
  };
  bool acc_ready = false;
  std::size_t call_idx = 0;
  for (int t = 0; t < R; ++t) {
    const int cur = t % 2, nxt = 1 - cur;
    const int s_t = plan::shard_at_step(rank, R, t);
    if (t + 1 < R) {
      // Send the shard at hand forward, receive the next one into the other slot once the
      // compute of step t-1 (which read that slot) is done.
      SPARGE_RETURN_IF_ERROR(g.cuda(cudaStreamWaitEvent(ts, t == 0 ? ev_packed : ev_used[nxt], 0), "cudaStreamWaitEvent"));
      const int s_next = plan::shard_at_step(rank, R, t + 1);
      SPARGE_RETURN_IF_ERROR(g.nccl(ncclGroupStart(), "ncclGroupStart"));
      SPARGE_RETURN_IF_ERROR(g.nccl(ncclSend(slot[cur], message_bytes(s_t), ncclUint8, (rank + 1) % R, comm, ts), "ncclSend"));
      SPARGE_RETURN_IF_ERROR(g.nccl(ncclRecv(slot[nxt], message_bytes(s_next), ncclUint8, (rank + R - 1) % R, comm, ts), "ncclRecv"));
      SPARGE_RETURN_IF_ERROR(g.nccl(ncclGroupEnd(), "the ring transfer (ncclGroupEnd)"));
      prof.mark(cat("xfer", t), ts);
      SPARGE_RETURN_IF_ERROR(g.cuda(cudaEventRecord(ev_recv[nxt], ts), "cudaEventRecord"));
    }
    if (t > 0) SPARGE_RETURN_IF_ERROR(g.cuda(cudaStreamWaitEvent(cs, ev_recv[cur], 0), "cudaStreamWaitEvent"));

    const Shard& kv = shards[static_cast<std::size_t>(s_t)];
    const Tensor k_at = kv_view(cur, kv, 0), v_at = kv_view(cur, kv, 1);
    for (const plan::Call& c : calls[static_cast<std::size_t>(t)]) {
      if (host_totals[call_idx++] == 0) continue;  // no selected block in this call: skip it
      const Tensor step_lut = contiguous(A.at<void>(base, o_step_lut), DType::i32, B, Hq, c.q_blocks, c.kv_blocks);
      const Tensor step_counts = make_tensor(A.at<void>(base, o_step_counts), DType::i32, {B, Hq, c.q_blocks});
      kernels::FilterArgs fa;
      fa.call = c;
      fa.batch = B;
      fa.heads = Hq;
      fa.lut = i32_of(lut);
      fa.counts = i32_of(counts);
      fa.out_lut = i32_of(step_lut);
      fa.out_counts = i32_of(step_counts);
      SPARGE_RETURN_IF_ERROR(g.cuda(kernels::launch_filter(fa, cs), "restricting the LUT to a ring call"));

      // The first call that covers every query row writes the accumulator directly.
      const bool into_acc = !acc_ready && c.q_rows == L;
      if (!acc_ready && !into_acc) {
        SPARGE_RETURN_IF_ERROR(g.cuda(cudaMemsetAsync(acc_o, 0, f32(B * L * Hq * D), cs), "clearing the accumulator"));
        SPARGE_RETURN_IF_ERROR(g.cuda(kernels::launch_fill(acc_lse, B * Hq * L, -INFINITY, cs), "clearing the accumulator"));
        acc_ready = true;
      }
      BlockSparseAttentionParams ap;
      ap.q = slice(p.q, 1, c.q_row_begin, c.q_rows);
      ap.k = slice(k_at, 1, c.kv_row_begin, c.kv_rows);
      ap.v = slice(v_at, 1, c.kv_row_begin, c.kv_rows);
      ap.o = o_view(into_acc ? acc_o : part_o, c.q_row_begin, c.q_rows);
      ap.maybe_lse = lse_view(into_acc ? acc_lse : part_lse, c.q_row_begin, c.q_rows);
      ap.lut = step_lut;
      ap.counts = step_counts;
      ap.blkq = blkq;
      ap.blkk = blkk;
      ap.scale = p.scale;
      ap.is_causal = c.causal;
      ap.exec = {Backend::cuda, cs, 0};
      const Status st = sparge::block_sparse_attention(ap);
      if (!st.ok()) return g.fail(st.code(), st.message());
      if (into_acc) {
        acc_ready = true;
        continue;
      }
      MergeAttentionParams mp;
      mp.o_a = mp.o = o_view(acc_o, c.q_row_begin, c.q_rows);
      mp.lse_a = mp.lse = lse_view(acc_lse, c.q_row_begin, c.q_rows);
      mp.o_b = o_view(part_o, c.q_row_begin, c.q_rows);
      mp.lse_b = lse_view(part_lse, c.q_row_begin, c.q_rows);
      mp.exec = {Backend::cuda, cs, 0};
      const Status ms = sparge::merge_attention(mp);
      if (!ms.ok()) return g.fail(ms.code(), ms.message());
    }
    prof.mark(cat("step", t), cs);
    SPARGE_RETURN_IF_ERROR(g.cuda(cudaEventRecord(ev_used[cur], cs), "cudaEventRecord"));
  }

  // ---- 4. the outputs -----------------------------------------------------------------------
  if (!acc_ready) {  // no row attended anything (an empty shard): O = 0, LSE = -inf
    SPARGE_RETURN_IF_ERROR(g.cuda(cudaMemsetAsync(acc_o, 0, f32(B * L * Hq * D), cs), "clearing the accumulator"));
    SPARGE_RETURN_IF_ERROR(g.cuda(kernels::launch_fill(acc_lse, B * Hq * L, -INFINITY, cs), "clearing the accumulator"));
  }
  kernels::FinishArgs fin;
  fin.o = acc_o;
  fin.lse = acc_lse;
  fin.batch = B;
  fin.rows = L;
  fin.heads = Hq;
  fin.dim = D;
  fin.out = p.o.data;
  fin.out_dtype = p.o.dtype == DType::f16 ? 1 : p.o.dtype == DType::bf16 ? 2 : 0;
  for (int i = 0; i < 4; ++i) fin.out_stride[i] = p.o.stride[i];
  if (p.maybe_lse.present()) {
    fin.lse_out = p.maybe_lse.ptr<float>();
    for (int i = 0; i < 3; ++i) fin.lse_stride[i] = p.maybe_lse.stride[i];
  }
  SPARGE_RETURN_IF_ERROR(g.cuda(kernels::launch_finish(fin, cs), "writing the outputs"));
  prof.mark("end", cs);
  SPARGE_RETURN_IF_ERROR(g.cuda(cudaEventRecord(ev_done, cs), "cudaEventRecord"));
  prof.host_mark("enqueued");
  SPARGE_RETURN_IF_ERROR(g.wait(ev_done, "the ring attention (transfers and compute)"));
  prof.host_mark("done");
  return {};
}

}  // namespace

bool nccl_built() { return true; }

Status run(const SparseAttentionParams& p) {
  Guard g(static_cast<ncclComm_t>(p.comm.nccl_comm), p.timeout_seconds, p.comm.rank, p.comm.size);
  Resources res;
  res.compute = static_cast<cudaStream_t>(p.exec.stream);
  Profile prof(p.comm.rank);
  const Status st = run_impl(p, g, res, prof);
  res.release();
  if (st.ok()) {
    prof.host_mark("released");
    prof.print();
  }
  return st;
}

}  // namespace sparge::dist::detail
