// Embedding, token masks, dropout, sum of squares and casts on CUDA. Dropout takes f32, bf16 or f16
// (x and y of one dtype; Note [16-bit CUDA kernels]).
// Dropout draws eg::philox_uniform(seed, offset, i) per element, the same function
// the CPU paths use, so masks match bit for bit across devices.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/rng.h"
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

// ---- kernels
namespace {
__global__ void embedding_fwd_kernel(const int64_t* ids, const float* table, float* y, int64_t n, int64_t d) {
  EG_CUDA_LOOP(i, n * d) y[i] = table[ids[i / d] * d + i % d];
}
__global__ void embedding_bwd_kernel(const float* dy, const int64_t* ids, float* dt, int64_t n, int64_t d) {
  EG_CUDA_LOOP(i, n * d) atomicAdd(&dt[ids[i / d] * d + i % d], dy[i]);
}
__global__ void token_mask_kernel(const int64_t* ids, uint8_t* mask, int64_t value, bool equal, int64_t n) {
  EG_CUDA_LOOP(i, n) mask[i] = (ids[i] == value) == equal ? 1 : 0;
}
// The seed and the step's base counter read from the device (Note [Random state on the
// device]); `offset` counts from the base.
__global__ void dropout_fwd_kernel(const void* x, void* y, int t, uint8_t* mask, float p, float s, const int64_t* rng,
                                   uint64_t offset, int64_t n) {
  const uint64_t seed = uint64_t(rng[0]);
  offset += uint64_t(rng[1]);
  EG_CUDA_LOOP(i, n) {
    const bool keep = philox_uniform(seed, offset, uint64_t(i)) >= p;
    mask[i] = keep;
    st(y, t, i, keep ? ld(x, t, i) * s : 0.f);
  }
}
__global__ void dropout_bwd_kernel(const void* dy, const uint8_t* mask, void* dx, int t, float s, int64_t n) {
  EG_CUDA_LOOP(i, n) st(dx, t, i, mask[i] ? ld(dy, t, i) * s : 0.f);
}
__global__ void sum_squares_kernel(const float* x, float* out, int64_t n) {
  float s = 0.f;
  EG_CUDA_LOOP(i, n) s += x[i] * x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) atomicAdd(out, s);
}
template <class A, class B>
__global__ void cast_kernel(const A* x, B* y, int64_t n);
template <>
__global__ void cast_kernel<float, __nv_bfloat16>(const float* x, __nv_bfloat16* y, int64_t n) {
  EG_CUDA_LOOP(i, n) y[i] = __float2bfloat16_rn(x[i]);
}
template <>
__global__ void cast_kernel<__nv_bfloat16, float>(const __nv_bfloat16* x, float* y, int64_t n) {
  EG_CUDA_LOOP(i, n) y[i] = __bfloat162float(x[i]);
}
template <>
__global__ void cast_kernel<float, __half>(const float* x, __half* y, int64_t n) {
  EG_CUDA_LOOP(i, n) y[i] = __float2half_rn(x[i]);
}
template <>
__global__ void cast_kernel<__half, float>(const __half* x, float* y, int64_t n) {
  EG_CUDA_LOOP(i, n) y[i] = __half2float(x[i]);
}
template <>
__global__ void cast_kernel<uint8_t, float>(const uint8_t* x, float* y, int64_t n) {
  EG_CUDA_LOOP(i, n) y[i] = float(x[i]);
}
// One thread per pixel; the channel from 32-bit index arithmetic where the batch allows.
__global__ void image_normalize_kernel(const uint8_t* x, const float* scale, const float* zero, float* y, int64_t c,
                                       int64_t hw, int64_t n, bool small) {
  EG_CUDA_LOOP(i, n) {
    const int64_t ch = small ? int64_t((uint32_t(i) / uint32_t(hw)) % uint32_t(c)) : i / hw % c;
    y[i] = float(x[i]) * scale[ch] + zero[ch];
  }
}
}  // namespace

// ---- launchers
void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y) {
  require_f32(table, "embedding");
  const int64_t n = ids.numel(), d = table.size(1);
  if (!n) return;
  embedding_fwd_kernel<<<blocks_for(n * d), kThreads, 0, stream()>>>(ids.data<int64_t>(), table.data<float>(),
                                                                     y.data<float>(), n, d);
  cuda::after_launch("embedding_fwd");
}

void embedding_bwd(const Tensor& dy, const Tensor& ids, Tensor& dt, bool accumulate) {
  require_f32(dt, "embedding backward");
  // The scatter adds atomically: accumulating, into the table's gradient as it is.
  if (!accumulate) EG_CUDA_CHECK(cudaMemsetAsync(dt.raw(), 0, dt.nbytes(), stream()));
  const int64_t n = ids.numel(), d = dt.size(1);
  if (!n) return;
  embedding_bwd_kernel<<<blocks_for(n * d), kThreads, 0, stream()>>>(dy.data<float>(), ids.data<int64_t>(),
                                                                     dt.data<float>(), n, d);
  cuda::after_launch("embedding_bwd");
}

void token_mask(const Tensor& ids, Tensor& mask, int64_t value, bool equal) {
  EG_CHECK(ids.dtype() == DType::s64 && mask.dtype() == DType::u8, "token_mask on CUDA: s64 ids and a u8 mask, got ",
           dtype_name(ids.dtype()), " and ", dtype_name(mask.dtype()));
  const int64_t n = ids.numel();
  if (!n) return;
  token_mask_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(ids.data<int64_t>(), mask.data<uint8_t>(), value, equal,
                                                              n);
  cuda::after_launch("token_mask");
}

void dropout_fwd(const Tensor& x, Tensor& y, Tensor& mask, double p, const Tensor& rng, uint64_t offset) {
  const int t = dt_code(x, "dropout");
  EG_CHECK(y.dtype() == x.dtype(), "dropout on CUDA: input and output share one dtype, got ", dtype_name(x.dtype()),
           " and ", dtype_name(y.dtype()));
  EG_CHECK(rng.dtype() == DType::s64 && rng.numel() == 2 && rng.device() == x.device(),
           "dropout: the random state is s64 [2] {seed, base} where the input is, got ", rng.str());
  const int64_t n = x.numel();
  if (!n) return;
  dropout_fwd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x.raw(), y.raw(), t, mask.data<uint8_t>(), float(p),
                                                               float(1.0 / (1.0 - p)), rng.data<int64_t>(), offset, n);
  cuda::after_launch("dropout_fwd");
}

void dropout_bwd(const Tensor& dy, const Tensor& mask, Tensor& dx, double p) {
  const int t = dt_code(dy, "dropout backward");
  EG_CHECK(dx.dtype() == dy.dtype(), "dropout backward on CUDA: dy and dx share one dtype, got ",
           dtype_name(dy.dtype()), " and ", dtype_name(dx.dtype()));
  const int64_t n = dy.numel();
  if (!n) return;
  dropout_bwd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(dy.raw(), mask.data<uint8_t>(), dx.raw(), t,
                                                               float(1.0 / (1.0 - p)), n);
  cuda::after_launch("dropout_bwd");
}

void sum_squares(const Tensor& x, Tensor& out) {
  require_f32(x, "sum_squares");
  require_f32(out, "sum_squares output");
  EG_CUDA_CHECK(cudaMemsetAsync(out.raw(), 0, sizeof(float), stream()));
  const int64_t n = x.numel();
  if (!n) return;
  sum_squares_kernel<<<std::min(blocks_for(n), 1024u), kThreads, 0, stream()>>>(x.data<float>(), out.data<float>(), n);
  cuda::after_launch("sum_squares");
}

void image_normalize(const Tensor& x, const Tensor& scale, const Tensor& zero, Tensor& y) {
  EG_CHECK(x.dtype() == DType::u8 && x.dim() == 4 && y.dtype() == DType::f32 && scale.numel() == x.size(1) &&
               zero.numel() == x.size(1),
           "image_normalize on CUDA: u8 [N, C, H, W] pixels, f32 scale and zero [C], f32 images; got ", x.str(), ", ",
           scale.str(), ", ", zero.str(), ", ", y.str());
  require_f32(scale, "image_normalize");
  const int64_t n = x.numel();
  if (!n) return;
  image_normalize_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x.data<uint8_t>(), scale.data<float>(),
                                                                   zero.data<float>(), y.data<float>(), x.size(1),
                                                                   x.size(2) * x.size(3), n, n < (int64_t(1) << 32));
  cuda::after_launch("image_normalize");
}

void cast(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (!n) return;
  const DType a = x.dtype(), b = y.dtype();
  const unsigned g = blocks_for(n);
  cudaStream_t s = stream();
  if (a == DType::f32 && b == DType::bf16)
    cast_kernel<<<g, kThreads, 0, s>>>(x.data<float>(), static_cast<__nv_bfloat16*>(y.raw()), n);
  else if (a == DType::bf16 && b == DType::f32)
    cast_kernel<<<g, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x.raw()), y.data<float>(), n);
  else if (a == DType::f32 && b == DType::f16)
    cast_kernel<<<g, kThreads, 0, s>>>(x.data<float>(), static_cast<__half*>(y.raw()), n);
  else if (a == DType::f16 && b == DType::f32)
    cast_kernel<<<g, kThreads, 0, s>>>(static_cast<const __half*>(x.raw()), y.data<float>(), n);
  else if (a == DType::u8 && b == DType::f32) cast_kernel<<<g, kThreads, 0, s>>>(x.data<uint8_t>(), y.data<float>(), n);
  else EG_THROW("cast from ", dtype_name(a), " to ", dtype_name(b), " is not supported on CUDA");
  cuda::after_launch("cast");
}

}  // namespace eg::cudak
