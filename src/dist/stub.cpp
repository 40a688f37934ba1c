// dist::sparse_attention in a build without NCCL (or without CUDA): validation still runs
// (entry.cpp), the operation reports `unsupported`.
#include "dist/run.h"

namespace sparge::dist::detail {

bool nccl_built() { return false; }

Status run(const SparseAttentionParams&) {
  return unsupported(
      "dist::sparse_attention: this build has no NCCL (configure with CUDA and nccl.h / libnccl available)");
}

}  // namespace sparge::dist::detail
