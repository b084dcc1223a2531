// SP-loss pieces on the CPU: the Gram matrix through oneDNN's matmul (the gemm fast
// path), then row normalisation and the distance in OpenMP loops with double sums.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu.h"

namespace eg::cpu {

void sp_gram(const Tensor& x, Tensor& g) {
  const int64_t b = x.size(0), f = x.numel() / b;
  const Tensor x2 = x.reshape({b, f});
  gemm(x2, x2, g, false, true, 1.0, 0.0);
  float* out = g.data<float>();
#pragma omp parallel for schedule(static) if (b >= 64)
  for (int64_t i = 0; i < b; ++i) {
    double n2 = 0;
    for (int64_t j = 0; j < b; ++j) n2 += double(out[i * b + j]) * double(out[i * b + j]);
    const float inv = float(1.0 / std::max(std::sqrt(n2), 1e-12));
#pragma omp simd
    for (int64_t j = 0; j < b; ++j) out[i * b + j] *= inv;
  }
}

void sp_loss(const Tensor& ga, const Tensor& gb, Tensor& out) {
  const int64_t n = ga.numel(), b = ga.size(0);
  const float *a = ga.data<float>(), *c = gb.data<float>();
  double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(c[i]);
    s += d * d;
  }
  out.data<float>()[0] = float(s / double(b * b));
}

}  // namespace eg::cpu
