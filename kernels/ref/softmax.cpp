// Softmax, log-softmax (last dim), cross-entropy with label smoothing and an ignored
// index, and the argmax of rows, reference. f32 and f64; accumulation in double.
#include <algorithm>
#include <cmath>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

template <class T>
void softmax_t(const Tensor& x, Tensor& y, bool log) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = xp + r * d;
    T* out = yp + r * d;
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < d; ++i) m = std::max(m, double(in[i]));
    for (int64_t i = 0; i < d; ++i) s += std::exp(double(in[i]) - m);
    for (int64_t i = 0; i < d; ++i)
      out[i] = log ? T(double(in[i]) - m - std::log(s)) : T(std::exp(double(in[i]) - m) / s);
  }
}

template <class T>
void softmax_bwd_t(const Tensor& dy, const Tensor& y, Tensor& dx, bool log) {
  const int64_t d = y.size(-1), rows = y.numel() / d;
  const T *gp = dy.data<T>(), *yp = y.data<T>();
  T* xp = dx.data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    const T *g = gp + r * d, *o = yp + r * d;
    T* out = xp + r * d;
    double s = 0;
    for (int64_t i = 0; i < d; ++i) s += log ? double(g[i]) : double(g[i]) * double(o[i]);
    for (int64_t i = 0; i < d; ++i)
      out[i] = log ? T(double(g[i]) - std::exp(double(o[i])) * s) : T(double(o[i]) * (double(g[i]) - s));
  }
}

template <class T>
void ce_fwd_t(const Tensor& logits, const Tensor& target, Tensor& loss, Tensor& lse, const ops::CrossEntropyParams& p) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const T* lp = logits.data<T>();
  const int64_t* tp = target.data<int64_t>();
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* row = lp + i * c;
    double m = -INFINITY, s = 0, sum = 0;
    for (int64_t k = 0; k < c; ++k) m = std::max(m, double(row[k]));
    for (int64_t k = 0; k < c; ++k) s += std::exp(double(row[k]) - m), sum += double(row[k]);
    const double l = m + std::log(s);
    lse.data<T>()[i] = T(l);
    if (tp[i] == p.ignore_index) continue;
    total += (1 - p.label_smoothing) * (l - double(row[tp[i]])) + p.label_smoothing * (l - sum / double(c));
    ++count;
  }
  loss.data<T>()[0] = T(count ? total / double(count) : 0.0);
}

template <class T>
void ce_bwd_t(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse, Tensor& dl,
              const ops::CrossEntropyParams& p) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const int64_t* tp = target.data<int64_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += tp[i] != p.ignore_index;
  const double g = count ? double(dloss.data<T>()[0]) / double(count) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const T* row = logits.data<T>() + i * c;
    T* out = dl.data<T>() + i * c;
    if (tp[i] == p.ignore_index) {
      for (int64_t k = 0; k < c; ++k) out[k] = T(0);
      continue;
    }
    const double l = double(lse.data<T>()[i]);
    for (int64_t k = 0; k < c; ++k) {
      double q = (1 - p.label_smoothing) * (k == tp[i] ? 1.0 : 0.0) + p.label_smoothing / double(c);
      out[k] = T(g * (std::exp(double(row[k]) - l) - q));
    }
  }
}

}  // namespace

void softmax_fwd(const Tensor& x, Tensor& y, bool log) {
  if (x.dtype() == DType::f64) softmax_t<double>(x, y, log);
  else softmax_t<float>(x, y, log);
}
void softmax_bwd(const Tensor& dy, const Tensor& y, Tensor& dx, bool log) {
  if (y.dtype() == DType::f64) softmax_bwd_t<double>(dy, y, dx, log);
  else softmax_bwd_t<float>(dy, y, dx, log);
}
void cross_entropy_fwd(const Tensor& logits, const Tensor& target, Tensor& loss, Tensor& lse,
                       const ops::CrossEntropyParams& p) {
  if (logits.dtype() == DType::f64) ce_fwd_t<double>(logits, target, loss, lse, p);
  else ce_fwd_t<float>(logits, target, loss, lse, p);
}
void cross_entropy_bwd(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse, Tensor& dl,
                       const ops::CrossEntropyParams& p) {
  if (logits.dtype() == DType::f64) ce_bwd_t<double>(dloss, logits, target, lse, dl, p);
  else ce_bwd_t<float>(dloss, logits, target, lse, dl, p);
}

template <class T>
void argmax_rows_t(const Tensor& x, Tensor& idx) {
  const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x.data<T>() + r * d;
    int64_t best = -1;
    for (int64_t i = 0; i < d; ++i)
      if (!std::isnan(in[i]) && (best < 0 || in[i] > in[best])) best = i;
    idx.data<int64_t>()[r] = std::max<int64_t>(best, 0);
  }
}
void argmax_rows(const Tensor& x, Tensor& idx) {
  if (x.dtype() == DType::f64) argmax_rows_t<double>(x, idx);
  else argmax_rows_t<float>(x, idx);
}

}  // namespace eg::ref
