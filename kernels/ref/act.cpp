// Activations, reference: relu, relu6, gelu (exact erf form) and their backward.
// Layout: any shape, contiguous. f32 and f64.
#include <cmath>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

template <class T>
T act_value(ops::Act a, T x) {
  switch (a) {
    case ops::Act::relu: return x > T(0) ? x : T(0);
    case ops::Act::relu6: return x < T(0) ? T(0) : (x > T(6) ? T(6) : x);
    case ops::Act::gelu: return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2)));
  }
  return x;
}

template <class T>
T act_grad(ops::Act a, T x) {
  switch (a) {
    case ops::Act::relu: return x > T(0) ? T(1) : T(0);
    case ops::Act::relu6: return (x > T(0) && x < T(6)) ? T(1) : T(0);
    case ops::Act::gelu: {
      T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
      T pdf = std::exp(T(-0.5) * x * x) * T(0.3989422804014327);  // 1/sqrt(2 pi)
      return cdf + x * pdf;
    }
  }
  return T(1);
}

template <class T>
void fwd(ops::Act a, const Tensor& x, Tensor& y) {
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) yp[i] = act_value(a, xp[i]);
}

// ReLU's and ReLU6's gradients are a select, as PyTorch's threshold_backward: where the
// input is outside the linear range dx is 0 whatever dy is (a NaN or Inf dy there too).
template <class T>
void bwd(ops::Act a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  const T *dyp = dy.data<T>(), *xp = x.data<T>();
  T* dxp = dx.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const T g = act_grad(a, xp[i]);
    dxp[i] = a == ops::Act::gelu ? dyp[i] * g : (g != T(0) ? dyp[i] : T(0));
  }
}

}  // namespace

void act_fwd(ops::Act a, const Tensor& x, Tensor& y) {
  if (is_half(x.dtype()) || is_half(y.dtype())) {  // Note [bf16 kernels]
    Tensor y64 = wide_like(y);
    fwd<double>(a, widened(x), y64);
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) fwd<double>(a, x, y);
  else fwd<float>(a, x, y);
}

void act_bwd(ops::Act a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  if (is_half(x.dtype()) || is_half(dy.dtype()) || is_half(dx.dtype())) {
    Tensor dx64 = wide_like(dx);
    bwd<double>(a, widened(dy), widened(x), dx64);
    return narrowed_into(dx64, dx);
  }
  if (x.dtype() == DType::f64) bwd<double>(a, dy, x, dx);
  else bwd<float>(a, dy, x, dx);
}

}  // namespace eg::ref
