// Shared helpers for the CUDA kernels: launch geometry, warp/block reductions, and
// shape descriptors passed by value to kernels (up to 8 dims).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/cuda_context.h"
#include "kernels/cuda/cuda.h"

namespace eg::cudak {

constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}
inline cudaStream_t stream() { return cuda::current_stream(); }

inline void require_f32(const Tensor& t, const char* op) {
  EG_CHECK(t.dtype() == DType::f32, op, " on CUDA supports f32 tensors, got ", dtype_name(t.dtype()));
}

// Whether 16-bit convolutions write NHWC (Note [Channels-last activations on CUDA] in
// core/tensor.h): unless EG_CUDA_CHANNELS_LAST=0. Defined in conv2d.cu.
bool channels_last();

// The layout an op computes in (Note [Channels-last activations on CUDA] in
// core/tensor.h): with 16-bit data, its data's own (NHWC or NCHW); with f32 data, NCHW.
inline Format compute_layout(const Tensor& x, bool half) { return half ? x.format() : Format::plain; }

// Note [16-bit CUDA kernels]
// The ops that mixed precision sends bf16 (or f16) activations (Note [bf16 kernels] in
// kernels/ops.h; marked in kernels/registry.cpp) take each tensor in its own dtype, as
// the ref does: a kernel gets raw pointers with a dtype code per operand, widens every
// load to f32 (ld), computes in f32 and rounds each store once to its output's dtype
// (st, round to nearest even). The code is the same for every thread of a launch, so the
// branch costs nothing beside the memory traffic these kernels are bound by; f32
// operands take the same arithmetic as before, bit for bit.
enum DtCode : int { kF32 = 0, kBf16 = 1, kF16 = 2 };
inline int dt_code(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::f32: return kF32;
    case DType::bf16: return kBf16;
    case DType::f16: return kF16;
    default: EG_THROW(op, " on CUDA supports f32, bf16 and f16 tensors, got ", dtype_name(t.dtype()));
  }
}
__device__ __forceinline__ float ld(const void* p, int dt, int64_t i) {
  if (dt == kBf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  if (dt == kF16) return __half2float(static_cast<const __half*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void st(void* p, int dt, int64_t i, float v) {
  if (dt == kBf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else if (dt == kF16) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else static_cast<float*>(p)[i] = v;
}

// Note [Vector loads]
// The memory-bound kernels of a mixed-precision step (batch norm, the residual and
// gradient adds, scale, axpy) move 8 elements per load and store where every operand's
// base is 16-byte aligned: one 16-byte access for bf16/f16, two for f32, converted in
// registers (ldv/stv, each element rounded as st rounds it). ldv<1>/stv<1> are ld/st, so
// a kernel templated on V runs its aligned bulk with V = 8 and the rest with V = 1
// (for_vectors); the arithmetic per element is the same either way.
template <int V>
__device__ __forceinline__ void stv(void* p, int dt, int64_t i, const float (&v)[V]) {
  if constexpr (V == 1) {
    st(p, dt, i, v[0]);
  } else {
    static_assert(V == 8, "vectors of 8");
    if (dt == kF32) {
      float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + i);
      q[0] = make_float4(v[0], v[1], v[2], v[3]);
      q[1] = make_float4(v[4], v[5], v[6], v[7]);
      return;
    }
    uint32_t w[4];
    for (int k = 0; k < 4; ++k) {
      if (dt == kBf16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + i) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}
// ldv's two halves: ldv_raw issues the load(s) of a vector and ldv_cvt converts them. A
// loop that loads several vectors with ldv_raw before it converts any has that many loads
// in flight per thread; with ldv, each load's conversion (behind a branch on the dtype)
// waits for it before the next load is issued.
template <int V>
struct RawVec {
  uint4 a, b;  // V = 8: a 16-bit vector in a, an f32 one in a and b; V = 1: the value in a.x
};
template <int V>
__device__ __forceinline__ RawVec<V> ldv_raw(const void* p, int dt, int64_t i) {
  RawVec<V> r;
  if constexpr (V == 1) {
    r.a.x = __float_as_uint(ld(p, dt, i));
  } else {
    static_assert(V == 8, "vectors of 8");
    if (dt == kF32) {
      const uint4* q = reinterpret_cast<const uint4*>(static_cast<const float*>(p) + i);
      r.a = q[0], r.b = q[1];
    } else {
      r.a = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + i);
    }
  }
  return r;
}
template <int V>
__device__ __forceinline__ void ldv_cvt(const RawVec<V>& r, int dt, float (&o)[V]) {
  if constexpr (V == 1) {
    o[0] = __uint_as_float(r.a.x);
  } else {
    if (dt == kF32) {
      const uint32_t w[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
      for (int e = 0; e < 8; ++e) o[e] = __uint_as_float(w[e]);
      return;
    }
    const uint32_t w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
    for (int k = 0; k < 4; ++k) {
      float2 f;
      if (dt == kBf16) f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[k]));
      else f = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
      o[2 * k] = f.x, o[2 * k + 1] = f.y;
    }
  }
}

template <int V>
__device__ __forceinline__ void ldv(const void* p, int dt, int64_t i, float (&o)[V]) {
  ldv_cvt<V>(ldv_raw<V>(p, dt, i), dt, o);
}

// A tensor cuDNN may add into in place (beta = 1): undefined, or at 256 bytes, as every
// block of the caching allocator. A gradient bucket's views sit back to back
// (optim/buckets.h) at any multiple of their element size, and cuDNN's algorithms are
// chosen without seeing the pointer; one not so aligned is computed into a new tensor and
// added by our axpy, which reads any alignment (cuBLAS takes any aligned to its element).
inline bool blend_aligned(const Tensor& t) { return !t.defined() || reinterpret_cast<uintptr_t>(t.raw_any()) % 256 == 0; }

// Every pointer given (null ones skipped) 16-byte aligned.
inline bool aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}
// launch(std::integral_constant<int, V>, begin, end) over [0, n): [0, n8) in vectors of 8
// when `vec`, the rest one element at a time (Note [Vector loads]).
template <class F>
void for_vectors(int64_t n, bool vec, F&& launch) {
  const int64_t n8 = vec ? n / 8 * 8 : 0;
  if (n8) launch(std::integral_constant<int, 8>{}, int64_t(0), n8);
  if (n8 < n) launch(std::integral_constant<int, 1>{}, n8, n);
}

// Grid-stride loop over [0, n).
#define EG_CUDA_LOOP(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)
// Grid-stride loop over the first elements i of the vectors of V in [begin, end) (launch
// blocks_for((end - begin) / V) blocks).
#define EG_CUDA_VEC_LOOP(i, V, begin, end)                                                      \
  for (int64_t i = (begin) + (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * (V); i < (end); \
       i += int64_t(blockDim.x) * gridDim.x * (V))

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions; every thread gets the result. blockDim.x a multiple of 32, <= 1024.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float sh[32];
  __syncthreads();
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  const int nw = int(blockDim.x >> 5);
  float r = int(threadIdx.x) < nw ? sh[threadIdx.x] : 0.f;
  r = warp_sum(r);
  if (threadIdx.x == 0) sh[0] = r;
  __syncthreads();
  return sh[0];
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float sh[32];
  __syncthreads();
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  const int nw = int(blockDim.x >> 5);
  float r = int(threadIdx.x) < nw ? sh[threadIdx.x] : -INFINITY;
  r = warp_max(r);
  if (threadIdx.x == 0) sh[0] = r;
  __syncthreads();
  return sh[0];
}

// Note [Column sums]
// Sums over the rows of an [m, n] matrix, per column, of K terms each (a linear bias's
// gradient: dy; a layer norm's: dy xhat and dy). One thread per column looping over all
// m rows (4,096 tokens of transformer-small) kept two blocks busy on a 132-SM GPU and
// was half its step; instead a block takes 32 columns and a slice of the rows, its 8
// warps rows r, r + 8, ... (a warp reads 32 consecutive columns: coalesced), writes one
// partial per (term, slice, column), and one thread per column adds its slices in order
// in f64. No atomics: the sums are the same on every run.
struct ColumnSlices {
  int64_t m, n, s;  // rows, columns, slices of the rows (gridDim.y)
};
inline ColumnSlices column_slices(int64_t m, int64_t n) {
  const int64_t gx = (n + 31) / 32;
  return {m, n, std::clamp<int64_t>((4 * 132 + gx - 1) / gx, 1, std::max<int64_t>(1, m / 64))};
}
inline dim3 column_grid(const ColumnSlices& cs) { return dim3(unsigned((cs.n + 31) / 32), unsigned(cs.s)); }
constexpr unsigned kColumnThreadsY = 8;
// term(r, j, acc) adds row r's K terms of column j to acc; part is [K][s][n].
template <int K, class Term>
__global__ void column_partials_kernel(ColumnSlices cs, Term term, float* part) {
  __shared__ float sh[K][kColumnThreadsY][33];
  const int64_t j = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t r0 = cs.m * blockIdx.y / cs.s, r1 = cs.m * (blockIdx.y + 1) / cs.s;
  float acc[K] = {};
  if (j < cs.n)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColumnThreadsY) term(r, j, acc);
  for (int k = 0; k < K; ++k) sh[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || j >= cs.n) return;
  for (int k = 0; k < K; ++k) {
    float s = 0.f;
    for (unsigned y = 0; y < kColumnThreadsY; ++y) s += sh[k][y][threadIdx.x];
    part[(k * cs.s + blockIdx.y) * cs.n + j] = s;
  }
}
// out[k][j] = the sum of term k's partials of column j (a null out[k] is not wanted).
template <int K>
struct ColumnOuts {
  float* p[K];
  bool accumulate = false;  // add into p (a parameter's .grad: Note [Gradient destinations])
};
template <int K>
__global__ void column_finish_kernel(const float* part, ColumnSlices cs, ColumnOuts<K> out) {
  EG_CUDA_LOOP(j, cs.n) {
    for (int k = 0; k < K; ++k) {
      if (!out.p[k]) continue;
      double s = 0;
      for (int64_t b = 0; b < cs.s; ++b) s += part[(k * cs.s + b) * cs.n + j];
      out.p[k][j] = out.accumulate ? out.p[k][j] + float(s) : float(s);  // + as axpy adds
    }
  }
}
// Both passes on the current stream; part is scratch from the caching allocator.
template <int K, class Term>
void column_sums(int64_t m, int64_t n, Term term, ColumnOuts<K> out, Device dev) {
  const ColumnSlices cs = column_slices(m, n);
  Tensor part = Tensor::empty({K * cs.s * n}, DType::f32, dev);
  column_partials_kernel<K><<<column_grid(cs), dim3(32, kColumnThreadsY), 0, stream()>>>(cs, term, part.data<float>());
  column_finish_kernel<K><<<blocks_for(n), kThreads, 0, stream()>>>(part.data<float>(), cs, out);
}

struct Dims {
  int n = 0;
  int64_t size[8] = {};
  int64_t stride[8] = {};  // element strides into the operand; 0 on broadcast dims
};

// `out` shape with the strides of operand `s` broadcast to it (s left-padded with 1s).
inline Dims broadcast_dims(const Shape& s, const Shape& out) {
  EG_CHECK(out.size() <= 8, "CUDA kernels support up to 8 dimensions, got ", out.size());
  Dims d;
  d.n = int(out.size());
  int64_t acc = 1;
  for (int i = int(out.size()) - 1, j = int(s.size()) - 1; i >= 0; --i, --j) {
    const int64_t sz = j >= 0 ? s[size_t(j)] : 1;
    d.size[i] = out[size_t(i)];
    d.stride[i] = (sz == 1 && out[size_t(i)] != 1) ? 0 : acc;
    acc *= sz;
  }
  return d;
}

__device__ __forceinline__ int64_t offset_of(int64_t i, const Dims& d) {
  int64_t off = 0;
  for (int k = d.n - 1; k >= 0; --k) {
    const int64_t idx = i % d.size[k];
    i /= d.size[k];
    off += idx * d.stride[k];
  }
  return off;
}

}  // namespace eg::cudak
