// The backend of dist::sparse_attention: ring.cpp with NCCL, stub.cpp without. Called by entry.cpp
// after the params have been validated.
#pragma once

#include "sparge/dist.h"

namespace sparge::dist::detail {

bool nccl_built();
Status run(const SparseAttentionParams& p);

}  // namespace sparge::dist::detail
