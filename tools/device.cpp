#include "device.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "common.h"

#if SPARGE_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/read_probe.h"
#endif

namespace sparge::tool {

namespace {
#if SPARGE_WITH_CUDA
void cuda_check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw ToolError(what + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}
// The Status of a queued operation: ok, or a runtime error naming it.
Status cuda_status(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) return {StatusCode::runtime_error, what + ": " + cudaGetErrorString(err)};
  return Status::ok_status();
}
#endif
[[noreturn, maybe_unused]] void no_cuda(const std::string& what) {
  throw ToolError(what + ": this build of sparge has no CUDA backend (configure with -DSPARGE_CUDA=ON)");
}
}  // namespace

DeviceBuffer::DeviceBuffer(Backend backend, std::size_t bytes, const std::string& what)
    : backend_(backend), bytes_(bytes), owned_(true), what_(what) {
  const std::size_t n = bytes == 0 ? 1 : bytes;  // a present tensor needs a non-null pointer
  if (backend == Backend::cpu) {
    ptr_ = ::operator new(n);
    return;
  }
#if SPARGE_WITH_CUDA
  cuda_check(cudaMalloc(&ptr_, n), "cudaMalloc(" + std::to_string(bytes) + " bytes for " + what + ")");
#else
  no_cuda("allocating " + what);
#endif
}

DeviceBuffer DeviceBuffer::mirror(Backend backend, void* host, std::size_t bytes, const std::string& what) {
  if (backend == Backend::cpu) {
    DeviceBuffer b;
    b.backend_ = backend;
    b.ptr_ = host;
    b.bytes_ = bytes;
    b.owned_ = false;
    b.what_ = what;
    return b;
  }
  DeviceBuffer b(backend, bytes, what);
  b.upload(host, bytes);
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (!owned_ || ptr_ == nullptr) return;
  if (backend_ == Backend::cpu) {
    ::operator delete(ptr_);
  } else {
#if SPARGE_WITH_CUDA
    cudaFree(ptr_);  // errors here would be sticky ones already reported by the failing call
#endif
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : backend_(o.backend_), ptr_(o.ptr_), bytes_(o.bytes_), owned_(o.owned_), what_(std::move(o.what_)) {
  o.ptr_ = nullptr;
  o.owned_ = false;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    this->~DeviceBuffer();
    new (this) DeviceBuffer(std::move(o));
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) throw ToolError("upload of " + std::to_string(bytes) + " bytes into " + what_ + " (" + std::to_string(bytes_) + " bytes)");
  if (backend_ == Backend::cpu) {
    if (host != ptr_ && bytes > 0) std::memcpy(ptr_, host, bytes);
    return;
  }
#if SPARGE_WITH_CUDA
  cuda_check(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to " + what_);
#else
  no_cuda("upload to " + what_);
#endif
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > bytes_) throw ToolError("download of " + std::to_string(bytes) + " bytes from " + what_ + " (" + std::to_string(bytes_) + " bytes)");
  if (backend_ == Backend::cpu) {
    if (host != ptr_ && bytes > 0) std::memcpy(host, ptr_, bytes);
    return;
  }
#if SPARGE_WITH_CUDA
  cuda_check(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from " + what_);
#else
  no_cuda("download from " + what_);
#endif
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  if (backend_ == Backend::cpu) {
    std::memset(ptr_, value, bytes_);
    return;
  }
#if SPARGE_WITH_CUDA
  cuda_check(cudaMemset(ptr_, value, bytes_), "cudaMemset of " + what_);
#else
  no_cuda("memset of " + what_);
#endif
}

Status DeviceBuffer::copy_from(const DeviceBuffer& src, std::size_t bytes, const Stream& stream) {
  if (bytes > bytes_ || bytes > src.bytes_ || src.backend_ != backend_) {
    return {StatusCode::invalid_argument, "copy of " + std::to_string(bytes) + " bytes from " + src.what_ + " to " + what_ +
                                              ": sizes or backends do not match"};
  }
  if (backend_ == Backend::cpu) {
    std::memcpy(ptr_, src.ptr_, bytes);
    return Status::ok_status();
  }
#if SPARGE_WITH_CUDA
  return cuda_status(
      cudaMemcpyAsync(ptr_, src.ptr_, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream.handle())),
      "cudaMemcpyAsync");
#else
  (void)stream;
  no_cuda("copy to " + what_);
#endif
}

Status DeviceBuffer::read_once(std::size_t bytes, DeviceBuffer& sink, const Stream& stream) const {
  if (bytes > bytes_ || bytes % 16 != 0 || sink.bytes_ < 4 || sink.backend_ != backend_ || backend_ != Backend::cuda) {
    return {StatusCode::invalid_argument, "read of " + std::to_string(bytes) + " bytes of " + what_ +
                                              ": needs a CUDA buffer, a multiple of 16 bytes and a 4-byte sink"};
  }
#if SPARGE_WITH_CUDA
  return cuda_status(sparge::cuda::read_probe(ptr_, bytes, static_cast<unsigned*>(sink.ptr_),
                                             static_cast<cudaStream_t>(stream.handle())),
                     "read probe");
#else
  (void)stream;
  no_cuda("read of " + what_);
#endif
}

Stream::Stream(Backend backend) : backend_(backend) {
  if (backend == Backend::cpu) return;
#if SPARGE_WITH_CUDA
  cudaStream_t s = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = s;
#else
  no_cuda("creating a stream");
#endif
}

Stream::~Stream() {
#if SPARGE_WITH_CUDA
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

void Stream::sync(const std::string& what) const {
  (void)what;
  if (backend_ == Backend::cpu) return;
#if SPARGE_WITH_CUDA
  cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), what + " (stream synchronize)");
  cuda_check(cudaGetLastError(), what);
#endif
}

Timer::Timer(Backend backend, const Stream& stream) : backend_(backend), stream_(stream) {
  if (backend == Backend::cpu) return;
#if SPARGE_WITH_CUDA
  cudaEvent_t a = nullptr, b = nullptr;
  cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  cuda_check(cudaEventCreate(&b), "cudaEventCreate");
  start_ = a;
  stop_ = b;
#endif
}

Timer::~Timer() {
#if SPARGE_WITH_CUDA
  if (start_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  if (stop_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
#endif
}

double Timer::time_ms(const std::function<Status()>& call, const std::string& what) {
  if (backend_ == Backend::cpu) {
    const auto t0 = std::chrono::steady_clock::now();
    check(call(), what);
    const auto t1 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::milli>(t1 - t0).count();
  }
#if SPARGE_WITH_CUDA
  auto s = static_cast<cudaStream_t>(stream_.handle());
  cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(start_), s), "cudaEventRecord");
  const Status st = call();
  cuda_check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), s), "cudaEventRecord");
  check(st, what);
  cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), what + " (event synchronize)");
  cuda_check(cudaGetLastError(), what);
  float ms = 0.0f;
  cuda_check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)),
             "cudaEventElapsedTime");
  return ms;
#else
  (void)call;
  no_cuda(what);
#endif
}

std::string device_description(Backend backend, int cpu_threads) {
  if (backend == Backend::cpu) {
    const unsigned hw = std::thread::hardware_concurrency();
    return "cpu, " + std::to_string(cpu_threads > 0 ? cpu_threads : static_cast<int>(hw)) + " threads";
  }
#if SPARGE_WITH_CUDA
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "cuda (unknown device)";
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         std::to_string(prop.multiProcessorCount) + " SMs)";
#else
  return "cuda (not built)";
#endif
}

}  // namespace sparge::tool
