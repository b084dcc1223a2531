// Optimizer updates, fast CPU path: SGD and AdamW as one fused OpenMP + SIMD pass over
// the flat tensors, updating param and state in place; loss scaling's unscale. PyTorch semantics as in
// kernels/ops.h (same arithmetic as kernels/ref/optim.cpp). f32.
//
// Napkin math: bandwidth-bound. SGD with momentum moves 20 bytes per element (read p,
// g, buf; write p, buf), without 12; AdamW 28 (read p, g, m, v; write p, m, v). 25.6M
// parameters of AdamW = 717 MB per step, ~50 ms at the ~15 GB/s two cores stream.
#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace eg::cpu {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // below this, threads cost more than they save

// The momentum branches are template flags so each variant is a branch-free loop.
template <bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(float* __restrict w, const float* __restrict g, float* __restrict mb, int64_t n,
              const ops::SgdParams& p) {
  const float lr = float(p.lr), wd = float(p.weight_decay), mom = float(p.momentum), damp = float(1.0 - p.dampening);
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] + wd * w[i];
    if constexpr (kMomentum) {
      const float b = kFirst ? d : mom * mb[i] + damp * d;
      mb[i] = b;
      d = kNesterov ? d + mom * b : b;
    }
    w[i] -= lr * d;
  }
}

template <bool kMomentum, bool kFirst>
void sgd_nesterov(float* w, const float* g, float* mb, int64_t n, const ops::SgdParams& p) {
  if (p.nesterov) sgd_loop<kMomentum, kFirst, true>(w, g, mb, n, p);
  else sgd_loop<kMomentum, kFirst, false>(w, g, mb, n, p);
}

}  // namespace

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const ops::SgdParams& p) {
  float* w = param.data<float>();
  const float* g = grad.data<float>();
  const int64_t n = param.numel();
  if (p.momentum == 0.0) {
    sgd_loop<false, false, false>(w, g, nullptr, n, p);  // buffer unused (may be undefined)
    return;
  }
  float* mb = momentum_buf.data<float>();
  if (p.first_step) sgd_nesterov<true, true>(w, g, mb, n, p);
  else sgd_nesterov<true, false>(w, g, mb, n, p);
}

// A handful of sums (one a gradient bucket): the reference's loop.
void clip_coef(const Tensor& sums, Tensor& out, double max_norm) { ref::clip_coef(sums, out, max_norm); }

// scale with the coefficient read here (the CPU holds it): float(coef) x, as clipping's
// host path scales.
void scale_by(const Tensor& x, Tensor& y, const Tensor& coef) {
  const double c = coef.data<double>()[0];
  if (float(c) == 1.f && x.raw() == y.raw()) return;  // within the clipping bound: nothing to move
  scale(x, y, c);
}

void amp_unscale(Tensor& grad, Tensor& found_inf, double inv_scale) {
  float* g = grad.data<float>();
  const int64_t n = grad.numel();
  const float s = float(inv_scale);
  int bad = 0;
  // x - x is 0 for a finite x and NaN for inf or NaN: a test that vectorises.
#pragma omp parallel for simd schedule(static) reduction(max : bad) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    bad = std::max(bad, int(g[i] - g[i] != 0.f));
    g[i] *= s;
  }
  if (bad) found_inf.data<float>()[0] = 1.f;
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& p) {
  float* w = param.data<float>();
  const float* g = grad.data<float>();
  float *mp = m.data<float>(), *vp = v.data<float>();
  const int64_t n = param.numel();
  const float b1 = float(p.beta1), b2 = float(p.beta2), lr = float(p.lr), eps = float(p.eps);
  const float decay = float(1.0 - p.lr * p.weight_decay);
  const float bc1 = float(1.0 - std::pow(p.beta1, double(p.step)));
  const float bc2 = float(1.0 - std::pow(p.beta2, double(p.step)));
  // Chunks of kChunk elements (4 arrays x 8 KB stay in L1): the three statements below
  // make one trip to memory per chunk. Eigen's packet sqrt vectorises where a plain
  // loop's sqrtf (errno semantics) does not.
  constexpr int64_t kChunk = 2048;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t off = c * kChunk, len = std::min(kChunk, n - off);
    Eigen::Map<Eigen::ArrayXf> W(w + off, len), M(mp + off, len), V(vp + off, len);
    Eigen::Map<const Eigen::ArrayXf> G(g + off, len);
    M = b1 * M + (1.f - b1) * G;
    V = b2 * V + (1.f - b2) * G.square();
    W = W * decay - lr * (M / bc1) / ((V / bc2).sqrt() + eps);
  }
}

}  // namespace eg::cpu
