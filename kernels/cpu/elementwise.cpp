// Elementwise ops, fast CPU path (f32, OpenMP, vectorised inner loops; binary on
// same-shaped operands, scale and axpy also bf16, computed in f32: Note [bf16 kernels]).
// binary: same-shape, per-channel ([1, C, 1, 1] on NCHW), row-vector ([1, N] on
// [M, N]) and scalar operands get contiguous loops; other broadcasts use ref.
// sum_to: NCHW -> per-channel and [M, N] -> [1, N] fast; others use ref.
// Napkin math: 12 bytes/element for binary, bandwidth-bound (~10 GB/s per core).
// binary (same shapes), scale and axpy are format-aware (Note [Blocked activations]):
// mismatched operands are brought to the blocked one's format (axpy: to y's).
#include <vector>

#include "kernels/cpu/bf16x16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace eg::cpu {

namespace {

template <class T, class F>
void same_shape(const T* a, const T* b, T* c, int64_t n, F f) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) st(c, i, f(ld(a, i), ld(b, i)));
}
#if EG_BF16X16
// f takes floats or 16 lanes of them (__m512, whose arithmetic operators gcc defines).
template <class F>
void same_shape(const bf16_t* a, const bf16_t* b, bf16_t* c, int64_t n, F f) {
  using namespace bf16x16;
  const int64_t body = n / 16 * 16;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < body; i += 16) store16(c + i, f(load16(a + i), load16(b + i)));
  for (int64_t i = body; i < n; ++i) st(c, i, f(ld(a, i), ld(b, i)));
}
#endif

// a is full-size [outer, mid, inner]; b is per-mid (or b is full and a per-mid when swapped).
template <class F>
void per_mid(const float* a, const float* b, float* c, int64_t outer, int64_t mid, int64_t inner, bool swapped, F f) {
#pragma omp parallel for collapse(2) schedule(static) if (outer * mid * inner > 65536)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t m = 0; m < mid; ++m) {
      const int64_t base = (o * mid + m) * inner;
      const float v = b[m];
      if (swapped)
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) c[base + i] = f(v, a[base + i]);
      else
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) c[base + i] = f(a[base + i], v);
    }
}

// Returns true and (outer, mid, inner) when `s` (same rank as `full`) is 1 everywhere
// except one contiguous block of dims where it equals `full`.
bool one_block(const Shape& s, const Shape& full, int64_t& outer, int64_t& mid, int64_t& inner) {
  size_t first = s.size(), last = 0;
  for (size_t d = 0; d < s.size(); ++d) {
    if (s[d] == full[d] && full[d] != 1) {
      first = std::min(first, d);
      last = d;
    } else if (s[d] != 1) {
      return false;
    }
  }
  if (first == s.size()) {  // scalar
    outer = 1, mid = 1, inner = shape_numel(full);
    return true;
  }
  for (size_t d = first; d <= last; ++d)
    if (s[d] != full[d]) return false;
  outer = mid = inner = 1;
  for (size_t d = 0; d < full.size(); ++d) (d < first ? outer : d <= last ? mid : inner) *= full[d];
  return true;
}

template <class F>
bool try_fast(const Tensor& a, const Tensor& b, Tensor& c, F f) {
  const Shape& cs = c.shape();
  if (a.shape() == cs && b.shape() == cs) {
    same_shape(a.data<float>(), b.data<float>(), c.data<float>(), c.numel(), f);
    return true;
  }
  int64_t o, m, i;
  if (a.shape() == cs && one_block(b.shape(), cs, o, m, i)) {
    per_mid(a.data<float>(), b.data<float>(), c.data<float>(), o, m, i, false, f);
    return true;
  }
  if (b.shape() == cs && one_block(a.shape(), cs, o, m, i)) {
    per_mid(b.data<float>(), a.data<float>(), c.data<float>(), o, m, i, true, f);
    return true;
  }
  return false;
}

// c = a op b, elementwise over same-shaped operands in any one format.
template <class T>
void same_shape_op(ops::Binary op, const T* ap, const T* bp, T* cp, int64_t n) {
  switch (op) {
    case ops::Binary::add: same_shape(ap, bp, cp, n, [](auto x, auto y) { return x + y; }); break;
    case ops::Binary::sub: same_shape(ap, bp, cp, n, [](auto x, auto y) { return x - y; }); break;
    case ops::Binary::mul: same_shape(ap, bp, cp, n, [](auto x, auto y) { return x * y; }); break;
    case ops::Binary::div: same_shape(ap, bp, cp, n, [](auto x, auto y) { return x / y; }); break;
  }
}

}  // namespace

void binary_fwd(ops::Binary op, const Tensor& a_in, const Tensor& b_in, Tensor& c) {
  Tensor ka, kb;
  const bool same = a_in.shape() == c.shape() && b_in.shape() == c.shape();
  const bool bf16 = c.dtype() == DType::bf16;
  if (!same_dtype({&a_in, &b_in, &c}) || (bf16 && !same)) {  // bf16 broadcasts, mixed dtypes: ref
    c.set_format(Format::plain);
    return ref::binary_fwd(op, a_in.to_plain(), b_in.to_plain(), c);
  }
  // Same shapes: an NHWC operand (the int8 reference's) brings the other to NHWC, else a
  // blocked one brings the other to nChw16c; anything else is plain.
  const auto either = [&](Format g) { return a_in.format() == g || b_in.format() == g; };
  const Format f = !same                     ? Format::plain
                   : either(Format::nhwc)    ? Format::nhwc
                   : either(Format::nchw16c) ? Format::nchw16c
                                             : Format::plain;
  const Tensor& a = in_format(a_in, f, ka);
  const Tensor& b = in_format(b_in, f, kb);
  if (f != Format::plain || bf16) {
    c.set_format(f);
    with_storage(c, [&](auto t) {
      using T = decltype(t);
      same_shape_op(op, a.data_any<T>(), b.data_any<T>(), c.data_any<T>(), c.numel());
    });
    return;
  }
  bool done = false;
  switch (op) {
    case ops::Binary::add: done = try_fast(a, b, c, [](float x, float y) { return x + y; }); break;
    case ops::Binary::sub: done = try_fast(a, b, c, [](float x, float y) { return x - y; }); break;
    case ops::Binary::mul: done = try_fast(a, b, c, [](float x, float y) { return x * y; }); break;
    case ops::Binary::div: done = try_fast(a, b, c, [](float x, float y) { return x / y; }); break;
  }
  if (!done) ref::binary_fwd(op, a, b, c);
}

void scale(const Tensor& x, Tensor& y, double alpha) {
  if (!same_dtype({&x, &y})) {
    y.set_format(Format::plain);
    return ref::scale(x.to_plain(), y, alpha);
  }
  y.set_format(x.format());
  const float s = float(alpha);
  const int64_t n = x.numel();
  with_storage(x, [&](auto t) {
    using T = decltype(t);
    const T* xp = x.data_any<T>();
    T* yp = y.data_any<T>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) st(yp, i, s * ld(xp, i));
  });
}

void axpy(const Tensor& x_in, Tensor& y, double alpha) {
  if (x_in.dtype() == DType::bf16 && y.dtype() == DType::f32) {  // a bf16 gradient into an f32 sum (autocast's)
    Tensor keep;
    const Tensor& x = in_format(x_in, y.format(), keep);
    const float s = float(alpha);
    const int64_t n = x.numel();
    const bf16_t* xp = x.data_any<bf16_t>();
    float* yp = y.data_any<float>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) yp[i] += s * ld(xp, i);
    return;
  }
  if (!same_dtype({&x_in, &y})) {  // into a plain copy of y, then back in y's format
    Tensor yp = y.to_plain();
    if (yp.is_same(y)) return ref::axpy(x_in.to_plain(), y, alpha);
    ref::axpy(x_in.to_plain(), yp, alpha);
    return y.copy_(yp);
  }
  Tensor keep;
  const Tensor& x = in_format(x_in, y.format(), keep);
  const float s = float(alpha);
  const int64_t n = x.numel();
  with_storage(x, [&](auto t) {
    using T = decltype(t);
    const T* xp = x.data_any<T>();
    T* yp = y.data_any<T>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) st(yp, i, ld(yp, i) + s * ld(xp, i));
  });
}

void sum_to(const Tensor& x, Tensor& y) {
  int64_t o, m, i;
  if (y.shape() == x.shape()) {
    y.copy_(x);
    return;
  }
  if (!one_block(y.shape(), x.shape(), o, m, i)) {
    ref::sum_to(x, y);
    return;
  }
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  // Sum over (outer, inner) for each mid; double accumulators per mid.
#pragma omp parallel for schedule(static) if (x.numel() > 65536)
  for (int64_t k = 0; k < m; ++k) {
    double acc = 0;
    for (int64_t a = 0; a < o; ++a) {
      const float* p = xp + (a * m + k) * i;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < i; ++j) s += p[j];
      acc += s;
    }
    yp[k] = float(acc);
  }
}

void broadcast_to(const Tensor& x, Tensor& y) {
  int64_t o, m, i;
  if (!one_block(x.shape(), y.shape(), o, m, i)) {
    ref::broadcast_to(x, y);
    return;
  }
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for collapse(2) schedule(static) if (y.numel() > 65536)
  for (int64_t a = 0; a < o; ++a)
    for (int64_t k = 0; k < m; ++k) {
      float* p = yp + (a * m + k) * i;
      const float v = xp[k];
#pragma omp simd
      for (int64_t j = 0; j < i; ++j) p[j] = v;
    }
}

}  // namespace eg::cpu
