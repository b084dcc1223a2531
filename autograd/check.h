// Input validation shared by the differentiable functions (internal).
#pragma once
#include <utility>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "core/tensor.h"

namespace eg::fn::detail {

// Input i's destination (Note [Gradient destinations] in autograd/node.h) when it is a
// gradient of this shape, dtype and device; else undefined.
inline Tensor destination_for(const autograd::Node& n, size_t i, const Shape& shape, DType dt, Device d) {
  const Tensor& t = n.destination(i);
  return t.defined() && t.shape() == shape && t.dtype() == dt && t.device() == d ? t : Tensor();
}
// The gradients of a layer's two parameters, inputs i and j (either not wanted: undefined)
// of shapes si and sj, dtype dt, on d, for a backward with one accumulate flag for both:
// their destinations when each wanted one has one (`into` set), else new tensors.
inline std::pair<Tensor, Tensor> param_grads(const autograd::Node& n, size_t i, bool want_i, const Shape& si, size_t j,
                                             bool want_j, const Shape& sj, DType dt, Device d, bool& into) {
  Tensor gi = want_i ? destination_for(n, i, si, dt, d) : Tensor();
  Tensor gj = want_j ? destination_for(n, j, sj, dt, d) : Tensor();
  into = (want_i || want_j) && (!want_i || gi.defined()) && (!want_j || gj.defined());
  if (!into) {
    gi = want_i ? Tensor::empty(si, dt, d) : Tensor();
    gj = want_j ? Tensor::empty(sj, dt, d) : Tensor();
  }
  return {gi, gj};
}

inline void check_defined(const Tensor& t, const char* fn, const char* what) {
  EG_CHECK(t.defined(), fn, ": ", what, " is undefined");
}
inline void check_dim(const Tensor& t, int d, const char* fn, const char* what) {
  check_defined(t, fn, what);
  EG_CHECK(t.dim() == d, fn, ": ", what, " must be ", d, "-D, got shape ", shape_str(t.shape()));
}
inline void check_same(const Tensor& a, const Tensor& b, const char* fn, const char* what) {
  if (!b.defined()) return;
  EG_CHECK(a.dtype() == b.dtype(), fn, ": ", what, " is ", dtype_name(b.dtype()), " but the input is ",
           dtype_name(a.dtype()));
  EG_CHECK(a.device() == b.device(), fn, ": ", what, " is on ", b.device().str(), " but the input is on ",
           a.device().str());
}
inline void check_float(const Tensor& t, const char* fn, const char* what) {
  EG_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, fn, ": ", what, " must be f32 or f64, got ",
           dtype_name(t.dtype()));
}
// A floating input of a function that computes in f32: a bf16 one cast to f32 first
// (fn::cast, so its gradient comes back in bf16; Note [Autocast]), then checked as
// check_float does.
inline Tensor f32_input(const Tensor& t, const char* fn, const char* what) {
  check_defined(t, fn, what);
  const Tensor x = is_half(t.dtype()) ? cast(t, DType::f32) : t;
  check_float(x, fn, what);
  return x;
}
inline Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }
inline Tensor empty_as(const Tensor& t, const Shape& s) { return Tensor::empty(s, t.dtype(), t.device()); }

}  // namespace eg::fn::detail
