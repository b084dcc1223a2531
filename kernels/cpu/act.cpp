// Activations, fast CPU path: one OpenMP-parallel pass the compiler vectorises
// (relu/relu6 are branch-free selects; gelu uses erff). f32.
// Napkin math: 8 bytes/element forward, 12 backward; bandwidth-bound.
// Format-aware: elementwise, so any layout works as long as the operands agree
// (Note [Blocked activations]); outputs take x's format.
#include <cmath>

#include "kernels/cpu/cpu.h"

namespace eg::cpu {

void act_fwd(ops::Act a, const Tensor& x, Tensor& y) {
  y.set_format(x.format());
  const float* xp = x.data_any<float>();
  float* yp = y.data_any<float>();
  const int64_t n = x.numel();
  switch (a) {
    case ops::Act::relu:
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] > 0.f ? xp[i] : 0.f;
      break;
    case ops::Act::relu6:
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) yp[i] = std::fmin(std::fmax(xp[i], 0.f), 6.f);
      break;
    case ops::Act::gelu:
#pragma omp parallel for schedule(static) if (n > 8192)
      for (int64_t i = 0; i < n; ++i) yp[i] = 0.5f * xp[i] * (1.f + std::erf(xp[i] * float(M_SQRT1_2)));
      break;
  }
}

void act_bwd(ops::Act a, const Tensor& dy_in, const Tensor& x, Tensor& dx) {
  Tensor keep;
  const Tensor& dy = in_format(dy_in, x.format(), keep);
  dx.set_format(x.format());
  const float *dyp = dy.data_any<float>(), *xp = x.data_any<float>();
  float* dxp = dx.data_any<float>();
  const int64_t n = x.numel();
  switch (a) {
    case ops::Act::relu:
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) dxp[i] = xp[i] > 0.f ? dyp[i] : 0.f;
      break;
    case ops::Act::relu6:
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) dxp[i] = (xp[i] > 0.f && xp[i] < 6.f) ? dyp[i] : 0.f;
      break;
    case ops::Act::gelu:
#pragma omp parallel for schedule(static) if (n > 8192)
      for (int64_t i = 0; i < n; ++i) {
        float cdf = 0.5f * (1.f + std::erf(xp[i] * float(M_SQRT1_2)));
        float pdf = std::exp(-0.5f * xp[i] * xp[i]) * 0.3989422804014327f;
        dxp[i] = dyp[i] * (cdf + xp[i] * pdf);
      }
      break;
  }
}

}  // namespace eg::cpu
