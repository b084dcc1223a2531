// Batch normalisation over (N, H, W) per channel, reference: training forward (batch
// statistics, running-statistics update), inference forward, and backward in both
// modes. Layout: x, y [N, C, H, W] contiguous; gamma, beta, statistics [C].
// f32 and f64; per-channel sums accumulate in double.
#include <cmath>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

// x viewed as [N, C, L] with L = H * W.
struct Dims {
  int64_t N, C, L;
};
Dims dims_of(const Tensor& x) { return {x.size(0), x.size(1), x.numel() / (x.size(0) * x.size(1))}; }

template <class T>
void fwd_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& save_mean,
               Tensor& save_invstd, Tensor& running_mean, Tensor& running_var, double momentum, double eps) {
  const Dims d = dims_of(x);
  const T *xp = x.data<T>(), *gp = gamma.data<T>(), *bp = beta.data<T>();
  T* yp = y.data<T>();
  const double m = double(d.N * d.L);
  for (int64_t c = 0; c < d.C; ++c) {
    double sum = 0;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.L; ++i) sum += double(xp[(n * d.C + c) * d.L + i]);
    const double mean = sum / m;
    double ss = 0;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.L; ++i) {
        const double t = double(xp[(n * d.C + c) * d.L + i]) - mean;
        ss += t * t;
      }
    const double var = ss / m, invstd = 1.0 / std::sqrt(var + eps);
    const double scale = invstd * double(gp[c]), shift = double(bp[c]) - mean * scale;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t e = (n * d.C + c) * d.L + i;
        yp[e] = T(double(xp[e]) * scale + shift);
      }
    save_mean.data<T>()[c] = T(mean);
    save_invstd.data<T>()[c] = T(invstd);
    if (running_mean.defined()) {
      T& r = running_mean.data<T>()[c];
      r = T((1 - momentum) * double(r) + momentum * mean);
    }
    if (running_var.defined()) {
      T& r = running_var.data<T>()[c];
      r = T((1 - momentum) * double(r) + momentum * ss / (m - 1));
    }
  }
}

template <class T>
void fwd_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
               const Tensor& running_var, Tensor& y, double eps) {
  const Dims d = dims_of(x);
  const T *xp = x.data<T>(), *gp = gamma.data<T>(), *bp = beta.data<T>();
  const T *mp = running_mean.data<T>(), *vp = running_var.data<T>();
  T* yp = y.data<T>();
  for (int64_t c = 0; c < d.C; ++c) {
    const double scale = double(gp[c]) / std::sqrt(double(vp[c]) + eps);
    const double shift = double(bp[c]) - double(mp[c]) * scale;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t e = (n * d.C + c) * d.L + i;
        yp[e] = T(double(xp[e]) * scale + shift);
      }
  }
}

// dbeta = sum dy, dgamma = sum dy * xhat with xhat = (x - mean) * invstd;
// training: dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M);
// inference: dx = gamma * invstd * dy (the statistics are constants).
template <class T>
void bwd(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& invstd, Tensor& dx,
         Tensor& dgamma, Tensor& dbeta, bool training) {
  const Dims d = dims_of(x);
  const T *dyp = dy.data<T>(), *xp = x.data<T>(), *gp = gamma.data<T>();
  const T *mp = mean.data<T>(), *ip = invstd.data<T>();
  const double m = double(d.N * d.L);
  for (int64_t c = 0; c < d.C; ++c) {
    const double mu = double(mp[c]), is = double(ip[c]);
    double sdy = 0, sdyx = 0;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t e = (n * d.C + c) * d.L + i;
        sdy += double(dyp[e]);
        sdyx += double(dyp[e]) * (double(xp[e]) - mu) * is;
      }
    if (dgamma.defined()) dgamma.data<T>()[c] = T(sdyx);
    if (dbeta.defined()) dbeta.data<T>()[c] = T(sdy);
    if (!dx.defined()) continue;
    T* dxp = dx.data<T>();
    const double gi = double(gp[c]) * is;
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t e = (n * d.C + c) * d.L + i;
        double g = double(dyp[e]);
        if (training) g -= (sdy + (double(xp[e]) - mu) * is * sdyx) / m;
        dxp[e] = T(gi * g);
      }
  }
}

// The fused activation, as its own passes: y = act(y) after the forward (ref's own
// activation, in place); the gradient masked where act_y is at either end of the
// activation before the backward (a select, as ref's act_bwd and the fast paths: a NaN dy
// there gives 0).
void act_in_place(ops::BnAct a, Tensor& y) {
  if (a != ops::BnAct::none) act_fwd(ops::unfused(a), y, y);
}
// y += r (the residual of a block's last batch norm).
void add_in_place(Tensor& y, const Tensor& r_in) {
  const Tensor r = r_in.to(y.dtype());
  if (y.dtype() == DType::f64)
    for (int64_t i = 0; i < y.numel(); ++i) y.data<double>()[i] += r.data<double>()[i];
  else
    for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] += r.data<float>()[i];
}
Tensor act_masked(const Tensor& dy, ops::BnAct a, const Tensor& act_y) {
  Tensor g = dy.clone();
  const Tensor ry = act_y.to(DType::f64);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double r = ry.data<double>()[i];
    if (r > 0 && (a != ops::BnAct::relu6 || r < 6)) continue;
    if (dy.dtype() == DType::f64) g.data<double>()[i] = 0;
    else g.data<float>()[i] = 0;
  }
  return g;
}

}  // namespace

void batchnorm_fwd_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& save_mean,
                         Tensor& save_invstd, Tensor& running_mean, Tensor& running_var, double momentum, double eps,
                         ops::BnAct act, const Tensor& residual) {
  if (any_bf16({&x, &y, &residual})) {  // Note [bf16 kernels]: bf16 activations, f32 parameters and statistics
    Tensor y64 = wide_like(y), m64 = wide_like(save_mean), i64 = wide_like(save_invstd);
    Tensor rm64 = widened(running_mean), rv64 = widened(running_var);
    batchnorm_fwd_train(widened(x), widened(gamma), widened(beta), y64, m64, i64, rm64, rv64, momentum, eps, act,
                        widened(residual));
    for (auto [wide, out] :
         {std::pair{&y64, &y}, {&m64, &save_mean}, {&i64, &save_invstd}, {&rm64, &running_mean}, {&rv64, &running_var}})
      narrowed_into(*wide, *out);
    return;
  }
  if (x.dtype() == DType::f64)
    fwd_train<double>(x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var, momentum, eps);
  else fwd_train<float>(x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var, momentum, eps);
  if (residual.defined()) add_in_place(y, residual);
  act_in_place(act, y);
}

void batchnorm_fwd_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                         const Tensor& running_var, Tensor& y, double eps, ops::BnAct act, const Tensor& residual) {
  if (any_bf16({&x, &y, &residual})) {
    Tensor y64 = wide_like(y);
    batchnorm_fwd_infer(widened(x), widened(gamma), widened(beta), widened(running_mean), widened(running_var), y64,
                        eps, act, widened(residual));
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) fwd_infer<double>(x, gamma, beta, running_mean, running_var, y, eps);
  else fwd_infer<float>(x, gamma, beta, running_mean, running_var, y, eps);
  if (residual.defined()) add_in_place(y, residual);
  act_in_place(act, y);
}

void batchnorm_bwd(const Tensor& dy_in, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
                   Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training, ops::BnAct act, const Tensor& act_y,
                   Tensor& dresidual) {
  if (any_bf16({&dy_in, &x, &dx, &act_y, &dresidual})) {
    Tensor dx64 = wide_like(dx), dg64 = wide_like(dgamma), db64 = wide_like(dbeta), dr64 = wide_like(dresidual);
    batchnorm_bwd(widened(dy_in), widened(x), widened(gamma), widened(mean), widened(invstd), dx64, dg64, db64,
                  training, act, widened(act_y), dr64);
    for (auto [wide, out] : {std::pair{&dx64, &dx}, {&dg64, &dgamma}, {&db64, &dbeta}, {&dr64, &dresidual}})
      narrowed_into(*wide, *out);
    return;
  }
  const Tensor dy = act != ops::BnAct::none ? act_masked(dy_in, act, act_y) : dy_in;
  if (dresidual.defined()) dresidual.copy_(dy);
  if (x.dtype() == DType::f64) bwd<double>(dy, x, gamma, mean, invstd, dx, dgamma, dbeta, training);
  else bwd<float>(dy, x, gamma, mean, invstd, dx, dgamma, dbeta, training);
}

}  // namespace eg::ref
