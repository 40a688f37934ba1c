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

// Attribute `attr` of the current device, cached per device (0, with the error cleared, on failure).
int device_attribute(cudaDeviceAttr attr) {
  static std::mutex m;
  static std::map<std::pair<int, int>, int> values;
  const int dev = current_device();
  if (dev < 0) return 0;
  std::lock_guard<std::mutex> lock(m);
  const auto it = values.find({dev, static_cast<int>(attr)});
  if (it != values.end()) return it->second;
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  values[{dev, static_cast<int>(attr)}] = v;
  return v;
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

int current_device_major() { return device_attribute(cudaDevAttrComputeCapabilityMajor); }

int current_device_sms() { return device_attribute(cudaDevAttrMultiProcessorCount); }

}  // namespace sparge::cuda
