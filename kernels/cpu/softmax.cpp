// Softmax / log-softmax (last dim) and cross-entropy, fast CPU path: rows in
// parallel, float math with a running max, vectorised max and sums. exp is Eigen's
// vectorised one, as the attention kernel's (within an ulp of libm's expf, which is a call
// per value: most of a wide row's time, the vocabulary's in a Transformer's loss); below
// ln(FLT_MIN), -inf included, it gives 0 with AVX-512 and a denormal (2.9e-39) with AVX2
// or SSE, where expf gives a denormal or 0: nothing a sum that holds exp(0) = 1 can see.
// (Eigen's select() would make them exact zeros, but it evaluates one value at a time.)
// f32.
// Napkin math: 3 passes over each row, ~12 bytes/element; exp-bound for wide rows.
#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace eg::cpu {

namespace {
using Row = Eigen::Map<const Eigen::ArrayXf>;
using RowOut = Eigen::Map<Eigen::ArrayXf>;
}  // namespace

void softmax_fwd(const Tensor& x, Tensor& y, bool log) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = xp + r * d;
    float* out = yp + r * d;
    float m = -INFINITY;  // the largest value that is not NaN (a NaN makes the sum NaN below)
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < d; ++i) m = in[i] > m ? in[i] : m;
    RowOut(out, d) = (Row(in, d) - m).exp();
    const float s = RowOut(out, d).sum();
    if (log) {
      const float ls = m + std::log(s);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) out[i] = in[i] - ls;
    } else {
      const float inv = 1.f / s;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) out[i] *= inv;
    }
  }
}

void softmax_bwd(const Tensor& dy, const Tensor& y, Tensor& dx, bool log) {
  const int64_t d = y.size(-1), rows = y.numel() / d;
  const float *gp = dy.data<float>(), *yp = y.data<float>();
  float* xp = dx.data<float>();
#pragma omp parallel for schedule(static) if (y.numel() > 16384)
  for (int64_t r = 0; r < rows; ++r) {
    const float *g = gp + r * d, *o = yp + r * d;
    float* out = xp + r * d;
    float s = 0;
    if (log) {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < d; ++i) s += g[i];
      RowOut(out, d) = Row(g, d) - Row(o, d).exp() * s;
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < d; ++i) s += g[i] * o[i];
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) out[i] = o[i] * (g[i] - s);
    }
  }
}

void cross_entropy_fwd(const Tensor& logits, const Tensor& target, Tensor& loss, Tensor& lse,
                       const ops::CrossEntropyParams& p) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const float* lp = logits.data<float>();
  const int64_t* tp = target.data<int64_t>();
  float* lsep = lse.data<float>();
  double total = 0;
  int64_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : total, count) if (logits.numel() > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = lp + i * c;
    float m = -INFINITY;  // the largest logit that is not NaN (a NaN makes the sum NaN below)
#pragma omp simd reduction(max : m)
    for (int64_t k = 0; k < c; ++k) m = row[k] > m ? row[k] : m;
    const float s = (Row(row, c) - m).exp().sum(), sum = Row(row, c).sum();
    const double l = double(m) + std::log(double(s));
    lsep[i] = float(l);
    if (tp[i] == p.ignore_index) continue;
    total += (1 - p.label_smoothing) * (l - double(row[tp[i]])) + p.label_smoothing * (l - double(sum) / double(c));
    ++count;
  }
  loss.data<float>()[0] = float(count ? total / double(count) : 0.0);
}

void cross_entropy_bwd(const Tensor& dloss, const Tensor& logits, const Tensor& target, const Tensor& lse, Tensor& dl,
                       const ops::CrossEntropyParams& p) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const int64_t* tp = target.data<int64_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += tp[i] != p.ignore_index;
  const float g = count ? dloss.data<float>()[0] / float(count) : 0.f;
  const float smooth = float(p.label_smoothing / double(c)), hit = float(1 - p.label_smoothing);
  const float *lp = logits.data<float>(), *lsep = lse.data<float>();
  float* out = dl.data<float>();
#pragma omp parallel for schedule(static) if (logits.numel() > 16384)
  for (int64_t i = 0; i < n; ++i) {
    float* o = out + i * c;
    const float* row = lp + i * c;
    if (tp[i] == p.ignore_index) {
      for (int64_t k = 0; k < c; ++k) o[k] = 0.f;
      continue;
    }
    const float l = lsep[i];
    RowOut(o, c) = g * ((Row(row, c) - l).exp() - smooth);
    o[tp[i]] -= g * hit;
  }
}

void argmax_rows(const Tensor& x, Tensor& idx) {
  if (x.dtype() != DType::f32) return ref::argmax_rows(x, idx);
  const int64_t d = x.size(-1), rows = d ? x.numel() / d : 0;
  const float* xp = x.data<float>();
  int64_t* out = idx.data<int64_t>();
#pragma omp parallel for schedule(static) if (x.numel() > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = xp + r * d;
    int64_t best = -1;
    for (int64_t i = 0; i < d; ++i)
      if (!std::isnan(in[i]) && (best < 0 || in[i] > in[best])) best = i;
    out[r] = std::max<int64_t>(best, 0);
  }
}

}  // namespace eg::cpu
