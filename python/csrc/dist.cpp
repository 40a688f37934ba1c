// Context parallelism for PyTorch: the op torch.ops.sparge.dist_sparse_attn (sparge::dist::
// sparse_attention on the tensors' CUDA device and current stream) and the communicator helpers of
// sparge._C that python/sparge/dist.py builds on (docs/python.md, "Context parallelism").
//
// The communicator is sparge's own: python/sparge/dist.py creates one per (process group, device)
// with ncclCommInitRankConfig(blocking = 0) from a unique id that the group broadcasts, through
// the libnccl.so.2 that torch already loaded (the extension links the same soname). It is not the
// process group's communicator on purpose: after an error sparse_attention aborts (frees) the
// communicator it was given, and torch would then use or abort a freed communicator.
#include <torch/extension.h>
#include <torch/library.h>

#include <chrono>
#include <string>
#include <thread>

#include "convert.h"
#include "sparge/dist.h"

#ifdef SPARGE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
#ifdef SPARGE_WITH_NCCL
#include <nccl.h>
#endif

namespace sparge::py {

namespace {

constexpr const char* kDistOp = "sparge.dist_sparse_attn";

[[maybe_unused]] std::int64_t ceil_blocks(std::int64_t len, std::int64_t blk) { return blk > 0 ? (len + blk - 1) / blk : 1; }

// (o, lse, lut, counts); lse, lut and counts are empty [0] tensors unless asked for.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dist_sparse_attn(
    const at::Tensor& q_user, const at::Tensor& k_user, const at::Tensor& v_user, std::int64_t comm,
    std::int64_t rank, std::int64_t world, std::int64_t seq_len, std::optional<c10::ArrayRef<double>> topk,
    std::optional<c10::ArrayRef<double>> cdfthreshd, std::optional<c10::ArrayRef<double>> simthreshd1,
    std::int64_t blkq, std::int64_t blkk, bool is_causal, bool attention_sink, bool smooth_k, double scale,
    c10::string_view tensor_layout, bool return_lse, bool return_map, double timeout) {
  const char* op = kDistOp;
  const AttentionArgs a(op, tensor_layout, q_user, k_user, v_user);
  const c10::Device dev = common_device(op, {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}});
  SPARGE_PY_CHECK_VALUE(dev.is_cuda(), op, ": the tensors are on ", dev,
                    " (context parallelism runs on CUDA tensors only, one GPU per rank)");
#ifndef SPARGE_WITH_CUDA
  SPARGE_PY_CHECK_NOT_IMPLEMENTED(false, op, ": this build of the sparge extension has no CUDA backend");
  return {};
#else
  SPARGE_PY_CHECK_VALUE(rank >= 0 && world >= 1 && rank < world, op, ": rank = ", rank, ", world = ", world,
                    " (expected 0 <= rank < world)");
  const c10::cuda::CUDAGuard guard(dev);
  const cudaStream_t compute = at::cuda::getCurrentCUDAStream(dev.index()).stream();
  // The ring's transfers run on a pool stream (never the compute stream; see dist.h).
  cudaStream_t transfer = c10::cuda::getStreamFromPool(false, dev.index()).stream();
  for (int i = 0; i < 64 && transfer == compute; ++i) {
    transfer = c10::cuda::getStreamFromPool(false, dev.index()).stream();
  }

  const at::Tensor& q = a.q;
  const std::int64_t b = q.size(0), l = q.size(1), hq = q.size(2);
  at::Tensor lut = return_map ? at::empty({b, hq, ceil_blocks(l, blkq), ceil_blocks(seq_len, blkk)},
                                          q.options().dtype(at::kInt))
                              : at::empty({0}, q.options().dtype(at::kInt));
  at::Tensor counts = return_map ? at::empty({b, hq, ceil_blocks(l, blkq)}, q.options().dtype(at::kInt))
                                 : at::empty({0}, q.options().dtype(at::kInt));

  const PerHeadValues topk_v = per_head(topk), cdf_v = per_head(cdfthreshd), sim_v = per_head(simthreshd1);
  dist::SparseAttentionParams p;
  p.comm.nccl_comm = reinterpret_cast<void*>(static_cast<std::intptr_t>(comm));
  p.comm.rank = static_cast<int>(rank);
  p.comm.size = static_cast<int>(world);
  p.comm.stream = transfer;
  const auto [o_user, lse] = a.outputs(p, return_lse);
  if (return_map) {
    p.maybe_lut = view(lut, op, "lut");
    p.maybe_counts = view(counts, op, "counts");
  }
  p.seq_len = seq_len;
  p.blkq = static_cast<int>(blkq);
  p.blkk = static_cast<int>(blkk);
  p.scale = static_cast<float>(scale);
  p.topk = topk_v.span();
  p.cdfthreshd = cdf_v.span();
  p.simthreshd1 = sim_v.span();
  p.is_causal = is_causal;
  p.attention_sink = attention_sink;
  p.smooth_k = smooth_k;
  p.timeout_seconds = timeout;
  p.exec = {Backend::cuda, compute, 0};
  throw_if_error(dist::sparse_attention(p));
  return {o_user, lse, lut, counts};
#endif
}

// ---- communicator helpers (sparge._C._dist_*) --------------------------------------------------

#ifdef SPARGE_WITH_NCCL
[[noreturn]] void nccl_fail(const char* what, ncclResult_t r, ncclComm_t comm) {
  std::string detail = ncclGetErrorString(r);
  if (comm != nullptr) detail += std::string(" (") + ncclGetLastError(comm) + ")";
  SPARGE_PY_CHECK(false, "sparge.dist: ", what, " failed: ", detail);
}

// Waits (bounded) until a non-blocking communicator's pending host-side work is done.
ncclResult_t poll_comm(ncclComm_t comm, ncclResult_t r, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                               std::chrono::duration<double>(timeout_s));
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ncclResult_t async = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &async);
    r = q != ncclSuccess ? q : async;
  }
  return r;
}
#endif

bool dist_available() { return dist::available(); }

std::tuple<int, int, int> nccl_version() {
#ifdef SPARGE_WITH_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return {0, 0, 0};
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return {v / 10000, (v / 100) % 100, v % 100};
#else
  return {0, 0, 0};
#endif
}

pybind11::bytes nccl_unique_id() {
#ifdef SPARGE_WITH_NCCL
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) nccl_fail("ncclGetUniqueId", r, nullptr);
  return pybind11::bytes(id.internal, NCCL_UNIQUE_ID_BYTES);
#else
  SPARGE_PY_CHECK_NOT_IMPLEMENTED(false, "sparge.dist: this build of the extension has no NCCL");
  return {};
#endif
}

// A non-blocking communicator of `world` ranks on `device`; waits at most timeout_s for the peers
// (then aborts it and raises). Returns the ncclComm_t as an integer.
std::int64_t nccl_comm_init(const std::string& id, std::int64_t world, std::int64_t rank, std::int64_t device,
                            double timeout_s) {
#ifdef SPARGE_WITH_NCCL
  SPARGE_PY_CHECK_VALUE(id.size() == NCCL_UNIQUE_ID_BYTES, "sparge.dist: the unique id has ", id.size(),
                    " bytes (expected ", NCCL_UNIQUE_ID_BYTES, ")");
  SPARGE_PY_CHECK_VALUE(world >= 1 && rank >= 0 && rank < world, "sparge.dist: rank = ", rank, ", world = ", world);
  ncclUniqueId uid;
  std::copy(id.begin(), id.end(), uid.internal);
  ncclComm_t comm = nullptr;
  ncclResult_t r;
  {
    pybind11::gil_scoped_release no_gil;
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    r = ncclCommInitRankConfig(&comm, static_cast<int>(world), uid, static_cast<int>(rank), &config);
    if (comm != nullptr) r = poll_comm(comm, r, timeout_s);
  }
  if (r == ncclInProgress) {
    ncclCommAbort(comm);
    SPARGE_PY_CHECK(false, "sparge.dist: creating the communicator (rank ", rank, " of ", world, ") timed out after ",
                timeout_s, " s: not every rank of the group called sparge.dist");
  }
  if (r != ncclSuccess) {
    const std::string last = comm != nullptr ? ncclGetLastError(comm) : "";
    if (comm != nullptr) ncclCommAbort(comm);
    SPARGE_PY_CHECK(false, "sparge.dist: ncclCommInitRankConfig failed: ", ncclGetErrorString(r), " (", last, ")");
  }
  return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(comm));
#else
  (void)id, (void)world, (void)rank, (void)device, (void)timeout_s;
  SPARGE_PY_CHECK_NOT_IMPLEMENTED(false, "sparge.dist: this build of the extension has no NCCL");
  return 0;
#endif
}

// Releases a communicator: finalize (bounded by timeout_s, peers finalize too) and destroy; with
// abort = true, or when finalize fails or times out, ncclCommAbort (local, never waits for peers).
void nccl_comm_release(std::int64_t handle, std::int64_t device, bool abort, double timeout_s) {
#ifdef SPARGE_WITH_NCCL
  auto comm = reinterpret_cast<ncclComm_t>(static_cast<std::intptr_t>(handle));
  if (comm == nullptr) return;
  pybind11::gil_scoped_release no_gil;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  if (!abort) {
    const ncclResult_t r = poll_comm(comm, ncclCommFinalize(comm), timeout_s);
    if (r == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess) return;
  }
  ncclCommAbort(comm);
#else
  (void)handle, (void)device, (void)abort, (void)timeout_s;
#endif
}

// ((global_begin, len, local_begin) of piece 0, the same of piece 1), the shard length.
pybind11::tuple shard_of(std::int64_t seq_len, std::int64_t world, std::int64_t rank) {
  SPARGE_PY_CHECK_VALUE(seq_len >= 1, "sparge.dist.shard_of: seq_len = ", seq_len, " (expected >= 1)");
  SPARGE_PY_CHECK_VALUE(world >= 1 && rank >= 0 && rank < world, "sparge.dist.shard_of: rank = ", rank,
                    ", world = ", world, " (expected 0 <= rank < world)");
  const dist::Shard s = dist::shard_of(seq_len, static_cast<int>(world), static_cast<int>(rank));
  auto piece = [](const dist::Piece& p) { return pybind11::make_tuple(p.global_begin, p.len, p.local_begin); };
  return pybind11::make_tuple(pybind11::make_tuple(piece(s.piece[0]), piece(s.piece[1])), s.len);
}

}  // namespace

void register_dist(pybind11::module_& m) {
  m.def("_dist_available", &dist_available, "Whether this build has the NCCL path of sparge::dist.");
  m.def("_nccl_version", &nccl_version, "The (major, minor, patch) of the libnccl this process runs.");
  m.def("_nccl_unique_id", &nccl_unique_id);
  m.def("_nccl_comm_init", &nccl_comm_init, pybind11::arg("unique_id"), pybind11::arg("world"),
        pybind11::arg("rank"), pybind11::arg("device"), pybind11::arg("timeout"));
  m.def("_nccl_comm_release", &nccl_comm_release, pybind11::arg("comm"), pybind11::arg("device"),
        pybind11::arg("abort"), pybind11::arg("timeout"));
  m.def("_dist_shard_of", &shard_of, pybind11::arg("seq_len"), pybind11::arg("world"), pybind11::arg("rank"));
}

TORCH_LIBRARY_FRAGMENT(sparge, m) {
  m.def(
      "dist_sparse_attn(Tensor q, Tensor k, Tensor v, int comm, int rank, int world, int seq_len, float[]? topk, "
      "float[]? cdfthreshd, float[]? simthreshd1, int blkq, int blkk, bool is_causal, bool attention_sink, "
      "bool smooth_k, float scale, str tensor_layout, bool return_lse, bool return_map, float timeout) "
      "-> (Tensor o, Tensor lse, Tensor lut, Tensor counts)");
}

TORCH_LIBRARY_IMPL(sparge, CPU, m) { m.impl("dist_sparse_attn", &dist_sparse_attn); }
TORCH_LIBRARY_IMPL(sparge, CUDA, m) { m.impl("dist_sparse_attn", &dist_sparse_attn); }

}  // namespace sparge::py
