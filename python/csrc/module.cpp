// The Python module `sparge._C`. Importing it registers the torch ops of ops.cpp (torch.ops.sparge.*);
// the module itself only answers what this build can do.
#include <torch/extension.h>

#include "sparge/ops.h"

namespace sparge::py {
void register_dist(pybind11::module_& m);  // dist.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "sparge: sparse attention kernels (torch ops are registered under torch.ops.sparge)";
#ifdef SPARGE_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  m.def("cuda_available", &sparge::cuda_available,
        "Whether this build has the CUDA backend and the process sees a CUDA device.");
  sparge::py::register_dist(m);
}
