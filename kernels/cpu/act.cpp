// Activations, fast CPU path: one OpenMP-parallel pass the compiler vectorises
// (relu/relu6 are branch-free selects; gelu uses erff). f32, or bf16 computed in f32
// (Note [bf16 kernels]).
// Napkin math: 8 bytes/element forward, 12 backward; bandwidth-bound.
// Format-aware: elementwise, so any layout works as long as the operands agree
// (Note [Blocked activations]); outputs take x's format.
#include <cmath>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace eg::cpu {

namespace {

template <class T>
void fwd(ops::Act a, const T* xp, T* yp, int64_t n) {
  switch (a) {
    case ops::Act::relu:
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) {
        const float x = ld(xp, i);
        st(yp, i, x > 0.f ? x : 0.f);
      }
      break;
    case ops::Act::relu6:
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) {
        // Selects, as ref's: std::fmin/fmax are calls into libm here (their NaN rule
        // keeps gcc from inlining them), which kept this loop scalar.
        const float x = ld(xp, i);
        st(yp, i, x < 0.f ? 0.f : (x > 6.f ? 6.f : x));
      }
      break;
    case ops::Act::gelu:
#pragma omp parallel for schedule(static) if (n > 8192)
      for (int64_t i = 0; i < n; ++i) {
        const float x = ld(xp, i);
        st(yp, i, 0.5f * x * (1.f + std::erf(x * float(M_SQRT1_2))));
      }
      break;
  }
}

template <class T>
void bwd(ops::Act a, const T* dyp, const T* xp, T* dxp, int64_t n) {
  switch (a) {
    case ops::Act::relu:
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) st(dxp, i, ld(xp, i) > 0.f ? ld(dyp, i) : 0.f);
      break;
    case ops::Act::relu6:
#pragma omp parallel for simd schedule(static) if (n > 32768)
      for (int64_t i = 0; i < n; ++i) {
        const float x = ld(xp, i);
        st(dxp, i, (x > 0.f && x < 6.f) ? ld(dyp, i) : 0.f);
      }
      break;
    case ops::Act::gelu:
#pragma omp parallel for schedule(static) if (n > 8192)
      for (int64_t i = 0; i < n; ++i) {
        const float x = ld(xp, i);
        const float cdf = 0.5f * (1.f + std::erf(x * float(M_SQRT1_2)));
        const float pdf = std::exp(-0.5f * x * x) * 0.3989422804014327f;
        st(dxp, i, ld(dyp, i) * (cdf + x * pdf));
      }
      break;
  }
}

}  // namespace

void act_fwd(ops::Act a, const Tensor& x, Tensor& y) {
  if (!same_dtype({&x, &y})) {  // mixed f32 / bf16: not on a hot path
    y.set_format(Format::plain);
    return ref::act_fwd(a, x.to_plain(), y);
  }
  y.set_format(x.format());
  with_storage(x, [&](auto t) {
    using T = decltype(t);
    fwd(a, x.data_any<T>(), y.data_any<T>(), x.numel());
  });
}

void act_bwd(ops::Act a, const Tensor& dy_in, const Tensor& x, Tensor& dx) {
  if (!same_dtype({&dy_in, &x, &dx})) {
    dx.set_format(Format::plain);
    return ref::act_bwd(a, dy_in.to_plain(), x.to_plain(), dx);
  }
  Tensor keep;
  const Tensor& dy = in_format(dy_in, x.format(), keep);
  dx.set_format(x.format());
  with_storage(x, [&](auto t) {
    using T = decltype(t);
    bwd(a, dy.data_any<T>(), x.data_any<T>(), dx.data_any<T>(), x.numel());
  });
}

}  // namespace eg::cpu
