// SP-loss pieces (row-normalised Gram matrix, squared Frobenius distance), reference.
// f32 and f64; accumulation in double.
#include <cmath>
#include <vector>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

template <class T>
void gram_t(const Tensor& x, Tensor& g) {
  const int64_t b = x.size(0), f = x.numel() / b;
  const T* in = x.data<T>();
  std::vector<double> row(size_t(b), 0.0);
  for (int64_t i = 0; i < b; ++i) {
    double norm2 = 0;
    for (int64_t j = 0; j < b; ++j) {
      double s = 0;
      for (int64_t k = 0; k < f; ++k) s += double(in[i * f + k]) * double(in[j * f + k]);
      row[size_t(j)] = s;
      norm2 += s * s;
    }
    const double inv = 1.0 / std::max(std::sqrt(norm2), 1e-12);
    for (int64_t j = 0; j < b; ++j) g.data<T>()[i * b + j] = T(row[size_t(j)] * inv);
  }
}

template <class T>
void loss_t(const Tensor& ga, const Tensor& gb, Tensor& out) {
  const int64_t n = ga.numel(), b = ga.size(0);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(ga.data<T>()[i]) - double(gb.data<T>()[i]);
    s += d * d;
  }
  out.data<T>()[0] = T(s / double(b * b));
}

}  // namespace

void sp_gram(const Tensor& x, Tensor& g) {
  if (x.dtype() == DType::f64) return gram_t<double>(x, g);
  gram_t<float>(x, g);
}

void sp_loss(const Tensor& ga, const Tensor& gb, Tensor& out) {
  if (ga.dtype() == DType::f64) return loss_t<double>(ga, gb, out);
  loss_t<float>(ga, gb, out);
}

}  // namespace eg::ref
