#include <cuda_runtime.h>

#include "cuda/cuda_backend.h"

namespace sparge::cuda {

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace sparge::cuda
