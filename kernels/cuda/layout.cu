// Layout ops, CUDA: swap12 ([A, B, C, D] -> [A, C, B, D]), of 4- or 2-byte elements
// (f32, or bf16/f16: it moves bytes). One thread per
// output element; consecutive threads write consecutive d, so both reads and writes
// coalesce along D. Bandwidth-bound: 8 bytes per element.
#include "core/cuda_context.h"
#include "kernels/cuda/cuda.h"

namespace eg::cudak {

// ---- kernels
namespace {
template <class T>
__global__ void swap12_kernel(const T* x, T* y, int64_t A, int64_t B, int64_t C, int64_t D) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= A * B * C * D) return;
  int64_t d = i % D, b = (i / D) % B, c = (i / (D * B)) % C, a = i / (D * B * C);  // y index [a, c, b, d]
  y[i] = x[((a * B + b) * C + c) * D + d];
}
}  // namespace

// ---- launchers
void swap12(const Tensor& x, Tensor& y) {
  const size_t e = dtype_size(x.dtype());
  EG_CHECK((e == 4 || e == 2) && y.dtype() == x.dtype(), "swap12 on CUDA moves 4- or 2-byte elements of one dtype, got ",
           dtype_name(x.dtype()), " into ", dtype_name(y.dtype()));
  const int64_t n = x.numel();
  if (n == 0) return;
  const int threads = 256;
  const unsigned grid = unsigned((n + threads - 1) / threads);
  if (e == 4)
    swap12_kernel<<<grid, threads, 0, cuda::current_stream()>>>(static_cast<const float*>(x.raw()),
                                                                static_cast<float*>(y.raw()), x.size(0), x.size(1),
                                                                x.size(2), x.size(3));
  else
    swap12_kernel<<<grid, threads, 0, cuda::current_stream()>>>(static_cast<const uint16_t*>(x.raw()),
                                                                static_cast<uint16_t*>(y.raw()), x.size(0), x.size(1),
                                                                x.size(2), x.size(3));
  cuda::after_launch("swap12");
}

}  // namespace eg::cudak
