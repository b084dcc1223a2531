// Optimizer updates, fast CPU path: SGD and AdamW as one fused OpenMP + SIMD pass over
// the flat tensors, updating param and state in place; loss scaling's unscale. PyTorch semantics as in
// kernels/ops.h (same arithmetic as kernels/ref/optim.cpp). f32.
//
// Napkin math: bandwidth-bound. SGD with momentum moves 20 bytes per element (read p,
// g, buf; write p, buf), without 12; AdamW 28 (read p, g, m, v; write p, m, v). 25.6M
// parameters of AdamW = 717 MB per step, ~50 ms at the ~15 GB/s two cores stream.
#include <omp.h>
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

// One AdamW update's constants, as the f32 loop uses them.
struct AdamWConsts {
  float b1, b2, lr, eps, decay, bc1, bc2;
  AdamWConsts(const ops::AdamWParams& p)
      : b1(float(p.beta1)),
        b2(float(p.beta2)),
        lr(float(p.lr)),
        eps(float(p.eps)),
        decay(float(1.0 - p.lr * p.weight_decay)),
        bc1(float(1.0 - std::pow(p.beta1, double(p.step)))),
        bc2(float(1.0 - std::pow(p.beta2, double(p.step)))) {}
};

// Elements [off, off + len) of one parameter. Chunks of kChunk elements (4 arrays x 8 KB
// stay in L1): the three statements make one trip to memory per chunk. Eigen's packet
// sqrt vectorises where a plain loop's sqrtf (errno semantics) does not.
constexpr int64_t kChunk = 2048;
void adamw_chunk(float* w, const float* g, float* mp, float* vp, int64_t off, int64_t len, const AdamWConsts& k) {
  Eigen::Map<Eigen::ArrayXf> W(w + off, len), M(mp + off, len), V(vp + off, len);
  Eigen::Map<const Eigen::ArrayXf> G(g + off, len);
  M = k.b1 * M + (1.f - k.b1) * G;
  V = k.b2 * V + (1.f - k.b2) * G.square();
  W = W * k.decay - k.lr * (M / k.bc1) / ((V / k.bc2).sqrt() + k.eps);
}

// Runs f(member, begin, end) over pieces of `piece` elements counted from each member's
// start (the last piece of a member shorter), the pieces split evenly between the threads
// of one parallel region: a member of a few elements costs no region of its own. Pieces
// start where the per-parameter kernels' chunks start, whatever the thread count, so a
// kernel whose rounding depends on where a vector loop starts (Eigen's approximate vector
// sqrt with exact scalar ends, in adamw_chunk) gives the per-parameter kernel's bits.
template <class F>
void over_members(const std::vector<int64_t>& sizes, int64_t piece, F f) {
  std::vector<int64_t> first(sizes.size() + 1, 0);  // each member's first piece
  for (size_t i = 0; i < sizes.size(); ++i) first[i + 1] = first[i] + (sizes[i] + piece - 1) / piece;
  const int64_t pieces = first.back();
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
#pragma omp parallel if (total > kParallelMin)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = pieces * t / nt, hi = pieces * (t + 1) / nt;
    size_t i = size_t(std::upper_bound(first.begin(), first.end(), lo) - first.begin()) - 1;
    for (int64_t k = lo; k < hi; ++k) {
      while (k >= first[i + 1]) ++i;  // members without pieces (no elements) are passed over
      const int64_t b = (k - first[i]) * piece;
      f(i, b, std::min(sizes[i], b + piece));
    }
  }
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& p) {
  float* w = param.data<float>();
  const float* g = grad.data<float>();
  float *mp = m.data<float>(), *vp = v.data<float>();
  const int64_t n = param.numel();
  const AdamWConsts k(p);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) adamw_chunk(w, g, mp, vp, c * kChunk, std::min(kChunk, n - c * kChunk), k);
}

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

void amp_unscale(Tensor& grad, Tensor& found_inf, const Tensor& scale) {
  float* g = grad.data<float>();
  const int64_t n = grad.numel();
  const float s = float(1.0 / ref::loss_scale_of(scale));
  int bad = 0;
  // x - x is 0 for a finite x and NaN for inf or NaN: a test that vectorises.
#pragma omp parallel for simd schedule(static) reduction(max : bad) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    bad = std::max(bad, int(g[i] - g[i] != 0.f));
    g[i] *= s;
  }
  if (bad) found_inf.data<float>()[0] = 1.f;
}

// One parallel region over every member's elements (over_members): ResNet-56's 170
// parameters, most of them a few dozen elements, cost one region, not 170. The
// arithmetic of sgd_step / adamw_step on the same chunks, so the same bits (tested above
// the parallel threshold).
void amp_update_scale(Tensor& state, const Tensor& found_inf, int64_t growth_interval) {
  ref::amp_update_scale(state, found_inf, growth_interval);
}

void sgd_step_multi(const Tensor& lr, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    std::vector<Tensor>& bufs, const ops::SgdParams& p, const Tensor& skip_if) {
  ref::check_multi_step("sgd_step_multi", lr, params.size(), {grads.size(), bufs.size()});
  EG_CHECK(!p.first_step,
           "sgd_step_multi: a parameter's first step (its buffer made from the gradient) takes sgd_step");
  if (ref::skipped(skip_if)) return;
  ops::SgdParams q = p;
  q.lr = lr.data<double>()[0];
  std::vector<int64_t> sizes;
  std::vector<float*> w, mb;
  std::vector<const float*> g;
  for (size_t i = 0; i < params.size(); ++i) {
    sizes.push_back(params[i].numel());
    w.push_back(params[i].data<float>());
    g.push_back(grads[i].data<float>());
    mb.push_back(p.momentum != 0.0 ? bufs[i].data<float>() : nullptr);
  }
  // Inside the region each piece's loop runs on its thread (a nested region is inactive).
  over_members(sizes, kChunk, [&](size_t i, int64_t b, int64_t e) {
    float* buf = mb[i] ? mb[i] + b : nullptr;
    if (!buf) sgd_loop<false, false, false>(w[i] + b, g[i] + b, nullptr, e - b, q);
    else sgd_nesterov<true, false>(w[i] + b, g[i] + b, buf, e - b, q);
  });
}

void adamw_step_multi(const Tensor& lr, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& m, std::vector<Tensor>& v, std::vector<Tensor>& steps,
                      const ops::AdamWParams& p, const Tensor& skip_if) {
  ref::check_multi_step("adamw_step_multi", lr, params.size(), {grads.size(), m.size(), v.size(), steps.size()});
  ref::check_step_counts("adamw_step_multi", steps);
  if (ref::skipped(skip_if)) return;
  ops::AdamWParams q = p;
  q.lr = lr.data<double>()[0];
  std::vector<int64_t> sizes;
  std::vector<AdamWConsts> k;
  for (size_t i = 0; i < params.size(); ++i) {
    sizes.push_back(params[i].numel());
    q.step = ref::advance_step_count(steps[i]);
    k.emplace_back(q);
  }
  over_members(sizes, kChunk, [&](size_t i, int64_t b, int64_t e) {
    adamw_chunk(params[i].data<float>(), grads[i].data<float>(), m[i].data<float>(), v[i].data<float>(), b, e - b,
                k[i]);
  });
}

}  // namespace eg::cpu
