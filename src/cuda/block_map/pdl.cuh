// Programmatic dependent launch in the block map (the device calls and the launcher are in
// cuda/pdl.cuh): the scores and selection launches use PDL unless SPARGE_BLOCKMAP_PDL=0 (read per
// call), on devices of compute capability 9.0 or more. Both kernels call pdl_wait() before their
// first load; the scores kernels call pdl_launch_dependents() at once, so the selection's CTAs
// wait on the SMs that the one-wave scores grid leaves free. The pooling launches do not use PDL (a
// pass launched with it would need pdl_wait() at its top too).
#pragma once

#include "cuda/pdl.cuh"

namespace sparge::cuda::block_map {

bool pdl_enabled();
// The compute capability major of the current device (0 if the query fails).
int device_major();

}  // namespace sparge::cuda::block_map
