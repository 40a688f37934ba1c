#include "cuda/func_attr.h"

#include <map>
#include <mutex>
#include <utility>

namespace sparge::cuda {
namespace {

// -1 (and the error cleared) without a current device.
int current_device() {
  int dev = -1;
  if (cudaGetDevice(&dev) == cudaSuccess) return dev;
  (void)cudaGetLastError();
  return -1;
}

}  // namespace

int func_ptx_version(const void* fn) {
  static std::mutex m;
  static std::map<std::pair<int, const void*>, int> ptx;
  const int dev = current_device();
  {
    std::lock_guard<std::mutex> lock(m);
    const auto it = ptx.find({dev, fn});
    if (dev >= 0 && it != ptx.end()) return it->second;
  }
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, fn) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  std::lock_guard<std::mutex> lock(m);
  if (dev >= 0) ptx[{dev, fn}] = fa.ptxVersion;
  return fa.ptxVersion;
}

int current_device_major() {
  static std::mutex m;
  static std::map<int, int> majors;
  const int dev = current_device();
  if (dev < 0) return 0;
  std::lock_guard<std::mutex> lock(m);
  const auto it = majors.find(dev);
  if (it != majors.end()) return it->second;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  majors[dev] = major;
  return major;
}

}  // namespace sparge::cuda
