#include "cuda/func_attr.h"

#include <map>
#include <mutex>
#include <utility>

namespace sparge::cuda {
namespace {

struct Entry {
  int smem = -1;         // largest dynamic shared memory set so far (-1: none)
  bool carveout = false; // prefer_max_shared done
  int ptx = -1;          // ptxVersion (-1: not read yet)
};

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::pair<int, const void*>, Entry>& table() {
  static std::map<std::pair<int, const void*>, Entry> t;
  return t;
}
int current_device() {
  int dev = -1;
  return cudaGetDevice(&dev) == cudaSuccess ? dev : -1;
}

}  // namespace

cudaError_t ensure_dynamic_smem(const void* fn, int bytes) {
  const int dev = current_device();
  {
    std::lock_guard<std::mutex> lock(table_mutex());
    const Entry& e = table()[{dev, fn}];
    if (dev >= 0 && e.smem >= bytes) return cudaSuccess;
  }
  const cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && dev >= 0) {
    std::lock_guard<std::mutex> lock(table_mutex());
    Entry& e = table()[{dev, fn}];
    if (bytes > e.smem) e.smem = bytes;
  }
  return err;
}

void prefer_max_shared(const void* fn) {
  const int dev = current_device();
  {
    std::lock_guard<std::mutex> lock(table_mutex());
    if (dev >= 0 && table()[{dev, fn}].carveout) return;
  }
  if (cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  std::lock_guard<std::mutex> lock(table_mutex());
  if (dev >= 0) table()[{dev, fn}].carveout = true;
}

int func_ptx_version(const void* fn) {
  const int dev = current_device();
  {
    std::lock_guard<std::mutex> lock(table_mutex());
    const Entry& e = table()[{dev, fn}];
    if (dev >= 0 && e.ptx >= 0) return e.ptx;
  }
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, fn) != cudaSuccess) return 0;
  std::lock_guard<std::mutex> lock(table_mutex());
  if (dev >= 0) table()[{dev, fn}].ptx = fa.ptxVersion;
  return fa.ptxVersion;
}

int current_device_major() {
  static std::mutex m;
  static std::map<int, int> majors;
  const int dev = current_device();
  if (dev < 0) return 0;
  std::lock_guard<std::mutex> lock(m);
  auto it = majors.find(dev);
  if (it != majors.end()) return it->second;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return 0;
  majors[dev] = major;
  return major;
}

}  // namespace sparge::cuda
