// Layout ops, CUDA: swap12 ([A, B, C, D] -> [A, C, B, D]), f32. One thread per
// output element; consecutive threads write consecutive d, so both reads and writes
// coalesce along D. Bandwidth-bound: 8 bytes per element.
#include "core/cuda_context.h"
#include "kernels/cuda/cuda.h"

namespace eg::cudak {

// ---- kernels
namespace {
__global__ void swap12_kernel(const float* x, float* y, int64_t A, int64_t B, int64_t C, int64_t D) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= A * B * C * D) return;
  int64_t d = i % D, b = (i / D) % B, c = (i / (D * B)) % C, a = i / (D * B * C);  // y index [a, c, b, d]
  y[i] = x[((a * B + b) * C + c) * D + d];
}
}  // namespace

// ---- launchers
void swap12(const Tensor& x, Tensor& y) {
  EG_CHECK(x.dtype() == DType::f32, "swap12 on CUDA supports f32, got ", dtype_name(x.dtype()));
  const int64_t n = x.numel();
  if (n == 0) return;
  const int threads = 256;
  swap12_kernel<<<unsigned((n + threads - 1) / threads), threads, 0, cuda::current_stream()>>>(
      x.data<float>(), y.data<float>(), x.size(0), x.size(1), x.size(2), x.size(3));
  cuda::after_launch("swap12");
}

}  // namespace eg::cudak
