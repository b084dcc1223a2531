// Elementwise ops, reference: binary add/sub/mul/div with numpy broadcasting, scale,
// axpy, sum_to (reduce over broadcast dims) and broadcast_to. f32 and f64.
// Layout: contiguous row-major; broadcasting aligns shapes on the right.
#include <vector>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

// Strides of `s` (left-padded to `rank`), with 0 where the dim is broadcast (size 1).
std::vector<int64_t> bstrides(const Shape& s, size_t rank, const Shape& out) {
  std::vector<int64_t> st(rank, 0);
  int64_t acc = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    size_t d = s.size() - 1 - i, o = rank - 1 - i;
    st[o] = (s[d] == 1 && out[o] != 1) ? 0 : acc;
    acc *= s[d];
  }
  return st;
}

// Offset into a broadcast operand for flat output index i.
int64_t offset(int64_t i, const Shape& out, const std::vector<int64_t>& st) {
  int64_t off = 0;
  for (size_t d = out.size(); d-- > 0;) {
    int64_t idx = i % out[d];
    i /= out[d];
    off += idx * st[d];
  }
  return off;
}

template <class T>
T apply(ops::Binary op, T a, T b) {
  switch (op) {
    case ops::Binary::add: return a + b;
    case ops::Binary::sub: return a - b;
    case ops::Binary::mul: return a * b;
    case ops::Binary::div: return a / b;
  }
  return a;
}

template <class T>
void binary_t(ops::Binary op, const Tensor& a, const Tensor& b, Tensor& c) {
  const Shape& cs = c.shape();
  auto sa = bstrides(a.shape(), cs.size(), cs), sb = bstrides(b.shape(), cs.size(), cs);
  const T *ap = a.data<T>(), *bp = b.data<T>();
  T* cp = c.data<T>();
  for (int64_t i = 0; i < c.numel(); ++i) cp[i] = apply(op, ap[offset(i, cs, sa)], bp[offset(i, cs, sb)]);
}

template <class T>
void sum_to_t(const Tensor& x, Tensor& y) {
  const Shape& xs = x.shape();
  auto sy = bstrides(y.shape(), xs.size(), xs);
  std::vector<double> acc(size_t(y.numel()), 0.0);
  const T* xp = x.data<T>();
  for (int64_t i = 0; i < x.numel(); ++i) acc[size_t(offset(i, xs, sy))] += double(xp[i]);
  T* yp = y.data<T>();
  for (int64_t j = 0; j < y.numel(); ++j) yp[j] = T(acc[size_t(j)]);
}

template <class T>
void broadcast_to_t(const Tensor& x, Tensor& y) {
  const Shape& ys = y.shape();
  auto sx = bstrides(x.shape(), ys.size(), ys);
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  for (int64_t i = 0; i < y.numel(); ++i) yp[i] = xp[offset(i, ys, sx)];
}

}  // namespace

void binary_fwd(ops::Binary op, const Tensor& a, const Tensor& b, Tensor& c) {
  if (any_bf16({&a, &b, &c})) {  // Note [bf16 kernels]
    Tensor c64 = wide_like(c);
    binary_t<double>(op, widened(a), widened(b), c64);
    return narrowed_into(c64, c);
  }
  if (c.dtype() == DType::f64) binary_t<double>(op, a, b, c);
  else binary_t<float>(op, a, b, c);
}

void scale(const Tensor& x, Tensor& y, double alpha) {
  if (any_bf16({&x, &y})) {
    Tensor y64 = wide_like(y);
    scale(widened(x), y64, alpha);
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) {
    for (int64_t i = 0; i < x.numel(); ++i) y.data<double>()[i] = alpha * x.data<double>()[i];
  } else {
    for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] = float(alpha * x.data<float>()[i]);
  }
}

void axpy(const Tensor& x, Tensor& y, double alpha) {
  if (any_bf16({&x, &y})) {
    Tensor y64 = widened(y);
    axpy(widened(x), y64, alpha);
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) {
    for (int64_t i = 0; i < x.numel(); ++i) y.data<double>()[i] += alpha * x.data<double>()[i];
  } else {
    for (int64_t i = 0; i < x.numel(); ++i) y.data<float>()[i] += float(alpha * x.data<float>()[i]);
  }
}

void sum_to(const Tensor& x, Tensor& y) {
  if (x.dtype() == DType::f64) sum_to_t<double>(x, y);
  else sum_to_t<float>(x, y);
}

void broadcast_to(const Tensor& x, Tensor& y) {
  if (x.dtype() == DType::f64) broadcast_to_t<double>(x, y);
  else broadcast_to_t<float>(x, y);
}

}  // namespace eg::ref
