// Layout ops, CUDA: swap12 ([A, B, C, D] -> [A, C, B, D]), of 4- or 2-byte elements
// (f32, or bf16/f16: it moves bytes). One thread per
// output element; consecutive threads write consecutive d, so both reads and writes
// coalesce along D. Bandwidth-bound: 8 bytes per element. And the NCHW <-> NHWC
// reorder behind Tensor::to_format (Note [Channels-last activations on CUDA]): 32 x 32
// tiles through shared memory, so that reads and writes both coalesce.
#include <algorithm>
#include <type_traits>

#include "core/cuda_context.h"
#include "kernels/cuda/cuda.h"

namespace eg::cudak {

// ---- kernels
namespace {
// The index arithmetic in I: uint32_t where the tensor has fewer than 2^31 elements (a
// 64-bit division is several times the instructions of a 32-bit one, and these kernels
// do two to four per element and little else).
template <class I, class T>
__global__ void swap12_kernel(const T* x, T* y, int64_t A64, int64_t B64, int64_t C64, int64_t D64) {
  const I A = I(A64), B = I(B64), C = I(C64), D = I(D64);
  const int64_t i64 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i64 >= A64 * B64 * C64 * D64) return;
  const I i = I(i64);
  const I d = i % D, b = (i / D) % B, c = (i / (D * B)) % C, a = i / (D * B * C);  // y index [a, c, b, d]
  y[i64] = x[((int64_t(a) * B64 + b) * C64 + c) * D64 + d];
}
// src [N, R, K] -> dst [N, K, R], a 32 x 32 tile per block (32 x 8 threads), z over N.
template <class T>
__global__ void transpose_tiles_kernel(const T* src, T* dst, int64_t N, int64_t R, int64_t K) {
  __shared__ T tile[32][33];
  const int64_t k0 = int64_t(blockIdx.x) * 32, r0 = int64_t(blockIdx.y) * 32;
  for (int64_t n = blockIdx.z; n < N; n += gridDim.z) {
    const T* s = src + n * R * K;
    T* d = dst + n * R * K;
    for (int j = threadIdx.y; j < 32; j += 8) {
      const int64_t r = r0 + j, k = k0 + threadIdx.x;
      if (r < R && k < K) tile[j][threadIdx.x] = s[r * K + k];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
      const int64_t k = k0 + j, r = r0 + threadIdx.x;
      if (k < K && r < R) d[k * R + r] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}
// Either side under 32 (a weight's 9 or 1 taps per channel, an image's 3 channels): the
// tiles would be mostly idle and many (a ResNet-50 weight: tens of thousands of blocks,
// ~35 us a call on an H100), so one thread per output element, writes coalesced, reads
// strided by K within the L2.
template <class I, class T>
__global__ void transpose_small_kernel(const T* src, T* dst, int64_t N, int64_t R64, int64_t K64) {
  const int64_t total = N * R64 * K64;
  const I R = I(R64), RK = I(R64 * K64);
  for (int64_t i64 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i64 < total;
       i64 += int64_t(blockDim.x) * gridDim.x) {
    const I i = I(i64), n = i / RK, rem = i - n * RK, k = rem / R, r = rem - k * R;  // dst [n, k, r]
    dst[i64] = src[(int64_t(n) * R64 + r) * K64 + k];
  }
}
bool fits_32(int64_t elements) { return elements < (int64_t(1) << 31); }
template <class T>
void transpose_tiles(const void* src, void* dst, int64_t n, int64_t r, int64_t k) {
  if (r < 32 || k < 32) {
    const int64_t blocks = std::min<int64_t>((n * r * k + 255) / 256, 65535 * 16);
    const auto kernel = fits_32(n * r * k) ? transpose_small_kernel<uint32_t, T> : transpose_small_kernel<int64_t, T>;
    kernel<<<unsigned(blocks), 256, 0, cuda::current_stream()>>>(static_cast<const T*>(src), static_cast<T*>(dst), n, r,
                                                                 k);
    return;
  }
  const dim3 grid(unsigned((k + 31) / 32), unsigned((r + 31) / 32), unsigned(std::min<int64_t>(n, 65535)));
  transpose_tiles_kernel<<<grid, dim3(32, 8), 0, cuda::current_stream()>>>(static_cast<const T*>(src),
                                                                           static_cast<T*>(dst), n, r, k);
}
}  // namespace

// ---- launchers
void swap12(const Tensor& x, Tensor& y) {
  const size_t e = dtype_size(x.dtype());
  EG_CHECK((e == 4 || e == 2) && y.dtype() == x.dtype(),
           "swap12 on CUDA moves 4- or 2-byte elements of one dtype, got ", dtype_name(x.dtype()), " into ",
           dtype_name(y.dtype()));
  const int64_t n = x.numel();
  if (n == 0) return;
  const int threads = 256;
  const unsigned grid = unsigned((n + threads - 1) / threads);
  auto launch = [&](auto* elem) {
    using T = std::remove_pointer_t<decltype(elem)>;
    const auto kernel = fits_32(n) ? swap12_kernel<uint32_t, T> : swap12_kernel<int64_t, T>;
    kernel<<<grid, threads, 0, cuda::current_stream()>>>(static_cast<const T*>(x.raw()), static_cast<T*>(y.raw()),
                                                         x.size(0), x.size(1), x.size(2), x.size(3));
  };
  if (e == 4) launch(static_cast<float*>(nullptr));
  else launch(static_cast<uint16_t*>(nullptr));
  cuda::after_launch("swap12");
}

}  // namespace eg::cudak

namespace eg::cuda {
void reorder_nhwc(const void* src, void* dst, int64_t n, int64_t c, int64_t l, size_t elem, bool to_nhwc) {
  EG_CHECK(elem == 2 || elem == 4, "internal: NHWC reorder of ", elem, "-byte elements");
  if (!n || !c || !l) return;
  const int64_t r = to_nhwc ? c : l, k = to_nhwc ? l : c;  // [n, r, k] -> [n, k, r]
  if (elem == 4) cudak::transpose_tiles<float>(src, dst, n, r, k);
  else cudak::transpose_tiles<uint16_t>(src, dst, n, r, k);
  after_launch("NCHW <-> NHWC reorder");
}
}  // namespace eg::cuda
