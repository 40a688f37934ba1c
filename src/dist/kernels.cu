// Kernels of context parallelism; see kernels.h. All are memory-bound and tiny next to the
// attention. The copies (pack, finish) have a row-wise vector form for the usual layouts and a
// per-element grid-stride form over 64-bit indices for everything else.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dist/kernels.h"

namespace sparge::dist::kernels {

namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxGrid = std::int64_t{1} << 20;

int grid_for(std::int64_t work, int per_cta) {
  const std::int64_t ctas = (work + per_cta - 1) / per_cta;
  return static_cast<int>(ctas < 1 ? 1 : (ctas < kMaxGrid ? ctas : kMaxGrid));
}

// One warp per LUT row: lanes read 32 consecutive entries, a ballot compacts the attended ones in
// order (entries are ascending and map_block keeps the order), so out stays ascending.
__global__ void __launch_bounds__(kThreads) filter_kernel(const __grid_constant__ FilterArgs a) {
  const plan::Call& c = a.call;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t rows = a.batch * a.heads * c.q_blocks;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    const std::int64_t j = row % c.q_blocks, h = (row / c.q_blocks) % a.heads, b = row / (c.q_blocks * a.heads);
    const std::int64_t qj = c.q_block_begin + j;  // the rank's query block
    const int qp = plan::q_piece_of(c, qj);
    const std::int32_t* in = a.lut.data + b * a.lut.stride[0] + h * a.lut.stride[1] + qj * a.lut.stride[2];
    const int count = a.counts.data[b * a.counts.stride[0] + h * a.counts.stride[1] + qj * a.counts.stride[2]];
    std::int32_t* out = a.out_lut.data == nullptr
                            ? nullptr
                            : a.out_lut.data + b * a.out_lut.stride[0] + h * a.out_lut.stride[1] + j * a.out_lut.stride[2];
    int written = 0;
    for (int base = 0; base < count; base += 32) {
      const int i = base + lane;
      const std::int64_t local = i < count ? plan::map_block(c, qp, in[i * a.lut.stride[3]]) : -1;
      const unsigned mask = __ballot_sync(0xffffffffu, local >= 0);
      if (out != nullptr && local >= 0) {
        const int pos = written + __popc(mask & ((1u << lane) - 1u));
        out[pos * a.out_lut.stride[3]] = static_cast<std::int32_t>(local);
      }
      written += __popc(mask);
    }
    if (out != nullptr) {
      for (std::int64_t slot = written + lane; slot < c.kv_blocks; slot += 32) out[slot * a.out_lut.stride[3]] = -1;
      if (lane == 0) {
        a.out_counts.data[b * a.out_counts.stride[0] + h * a.out_counts.stride[1] + j * a.out_counts.stride[2]] = written;
      }
    } else if (lane == 0 && written > 0) {
      atomicAdd(a.total, static_cast<unsigned long long>(written));  // integer: order-independent
    }
  }
}

__global__ void __launch_bounds__(kThreads) pack_kernel(const __grid_constant__ Rows16 s, std::uint16_t* dst) {
  const std::int64_t n = s.shape[0] * s.shape[1] * s.shape[2] * s.shape[3];
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t d = i % s.shape[3], h = (i / s.shape[3]) % s.shape[2];
    const std::int64_t r = (i / (s.shape[3] * s.shape[2])) % s.shape[1], b = i / (s.shape[3] * s.shape[2] * s.shape[1]);
    dst[i] = s.data[b * s.stride[0] + r * s.stride[1] + h * s.stride[2] + d * s.stride[3]];
  }
}

// The same copy, 16 bytes per thread: a CTA per (b, r) row, the row's H * D values in 8-value
// chunks (D % 8 == 0, unit stride over D, 16-byte aligned rows: checked by launch_pack). The
// per-element kernel above spent ~6 ms on 64-bit index arithmetic for a 1 GB shard on the H200.
__global__ void __launch_bounds__(kThreads) pack_rows_kernel(const __grid_constant__ Rows16 s, std::uint16_t* dst) {
  const std::int64_t rows = s.shape[0] * s.shape[1];
  const int chunks_per_head = static_cast<int>(s.shape[3] / 8), chunks = static_cast<int>(s.shape[2]) * chunks_per_head;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t b = row / s.shape[1], r = row % s.shape[1];
    const std::uint16_t* src = s.data + b * s.stride[0] + r * s.stride[1];
    uint4* out = reinterpret_cast<uint4*>(dst + row * s.shape[2] * s.shape[3]);
    for (int c = static_cast<int>(threadIdx.x); c < chunks; c += blockDim.x) {
      const int h = c / chunks_per_head, k = c % chunks_per_head;
      out[c] = *reinterpret_cast<const uint4*>(src + h * s.stride[2] + k * 8);
    }
  }
}

__global__ void __launch_bounds__(kThreads) fill_kernel(float* p, std::int64_t n, float value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}

__global__ void __launch_bounds__(kThreads) finish_kernel(const __grid_constant__ FinishArgs a) {
  const std::int64_t n = a.batch * a.rows * a.heads * a.dim;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t d = i % a.dim, h = (i / a.dim) % a.heads;
    const std::int64_t r = (i / (a.dim * a.heads)) % a.rows, b = i / (a.dim * a.heads * a.rows);
    const float x = a.o[i];
    const std::int64_t off = b * a.out_stride[0] + r * a.out_stride[1] + h * a.out_stride[2] + d * a.out_stride[3];
    switch (a.out_dtype) {
      case 1: static_cast<__half*>(a.out)[off] = __float2half_rn(x); break;
      case 2: static_cast<__nv_bfloat16*>(a.out)[off] = __float2bfloat16_rn(x); break;
      default: static_cast<float*>(a.out)[off] = x; break;
    }
    if (d == 0 && a.lse_out != nullptr) {
      a.lse_out[b * a.lse_stride[0] + h * a.lse_stride[1] + r * a.lse_stride[2]] =
          a.lse[(b * a.heads + h) * a.rows + r];
    }
  }
}

// Four f32 values to two packed pairs of T (round to nearest) at element offset `off` of `out`.
__device__ __forceinline__ __half2 pack2(float lo, float hi, __half) { return __floats2half2_rn(lo, hi); }
__device__ __forceinline__ __nv_bfloat162 pack2(float lo, float hi, __nv_bfloat16) {
  return __floats2bfloat162_rn(lo, hi);
}
template <class T>
__device__ __forceinline__ void store4(void* out, std::int64_t off, const float4& x) {
  using Pair = decltype(pack2(0.0f, 0.0f, T{}));
  Pair* o = reinterpret_cast<Pair*>(static_cast<T*>(out) + off);
  o[0] = pack2(x.x, x.y, T{});
  o[1] = pack2(x.z, x.w, T{});
}

// The same, 4 values per thread: a CTA per (b, r) row (D % 4 == 0, unit stride over D, aligned
// output rows: checked by launch_finish).
__global__ void __launch_bounds__(kThreads) finish_rows_kernel(const __grid_constant__ FinishArgs a) {
  const std::int64_t rows = a.batch * a.rows;
  const int per_head = static_cast<int>(a.dim / 4), chunks = static_cast<int>(a.heads) * per_head;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t b = row / a.rows, r = row % a.rows;
    const float4* in = reinterpret_cast<const float4*>(a.o + row * a.heads * a.dim);
    for (int c = static_cast<int>(threadIdx.x); c < chunks; c += blockDim.x) {
      const int h = c / per_head, k = c % per_head;
      const float4 x = in[c];
      const std::int64_t off = b * a.out_stride[0] + r * a.out_stride[1] + h * a.out_stride[2] + k * 4;
      switch (a.out_dtype) {
        case 1: store4<__half>(a.out, off, x); break;
        case 2: store4<__nv_bfloat16>(a.out, off, x); break;
        default: *reinterpret_cast<float4*>(static_cast<float*>(a.out) + off) = x; break;
      }
      if (k == 0 && a.lse_out != nullptr) {
        a.lse_out[b * a.lse_stride[0] + h * a.lse_stride[1] + r * a.lse_stride[2]] = a.lse[(b * a.heads + h) * a.rows + r];
      }
    }
  }
}

}  // namespace

cudaError_t launch_filter(const FilterArgs& a, cudaStream_t st) {
  const std::int64_t rows = a.batch * a.heads * a.call.q_blocks;
  if (rows == 0) return cudaSuccess;
  filter_kernel<<<grid_for(rows, kThreads / 32), kThreads, 0, st>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_pack(const Rows16& src, std::uint16_t* dst, cudaStream_t st) {
  const std::int64_t n = src.shape[0] * src.shape[1] * src.shape[2] * src.shape[3];
  if (n == 0) return cudaSuccess;
  bool rows16 = src.shape[3] % 8 == 0 && src.stride[3] == 1 && reinterpret_cast<std::uintptr_t>(src.data) % 16 == 0 &&
                reinterpret_cast<std::uintptr_t>(dst) % 16 == 0;
  for (int i = 0; i < 3; ++i) rows16 = rows16 && src.stride[i] % 8 == 0;
  if (rows16) {
    pack_rows_kernel<<<grid_for(src.shape[0] * src.shape[1], 1), kThreads, 0, st>>>(src, dst);
  } else {
    pack_kernel<<<grid_for(n, kThreads), kThreads, 0, st>>>(src, dst);
  }
  return cudaGetLastError();
}

cudaError_t launch_fill(float* p, std::int64_t n, float value, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  fill_kernel<<<grid_for(n, kThreads), kThreads, 0, st>>>(p, n, value);
  return cudaGetLastError();
}

cudaError_t launch_finish(const FinishArgs& a, cudaStream_t st) {
  const std::int64_t n = a.batch * a.rows * a.heads * a.dim;
  if (n == 0) return cudaSuccess;
  const int align = a.out_dtype == 0 ? 16 : 8;  // bytes of 4 output values
  bool rows4 = a.dim % 4 == 0 && a.out_stride[3] == 1 && reinterpret_cast<std::uintptr_t>(a.out) % align == 0 &&
               reinterpret_cast<std::uintptr_t>(a.o) % 16 == 0;
  for (int i = 0; i < 3; ++i) rows4 = rows4 && a.out_stride[i] % 4 == 0;
  if (rows4) {
    finish_rows_kernel<<<grid_for(a.batch * a.rows, 1), kThreads, 0, st>>>(a);
  } else {
    finish_kernel<<<grid_for(n, kThreads), kThreads, 0, st>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace sparge::dist::kernels
