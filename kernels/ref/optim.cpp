// Optimizer updates, reference: SGD (momentum, dampening, nesterov, weight decay) and
// AdamW (decoupled weight decay, bias-corrected moments), PyTorch semantics, in place
// over flat tensors of any shape. f32 and f64; arithmetic in the tensor's dtype, as
// PyTorch's single-tensor loops do.
#include <algorithm>
#include <cmath>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

// momentum == 0 never touches momentum_buf (it may be undefined, as optim::SGD passes it).
template <class T>
void sgd(Tensor& param, const Tensor& grad, Tensor& buf, const ops::SgdParams& p) {
  T* w = param.data<T>();
  const T* g = grad.data<T>();
  T* mb = p.momentum != 0.0 ? buf.data<T>() : nullptr;
  const T lr = T(p.lr), wd = T(p.weight_decay), mom = T(p.momentum), damp = T(1.0 - p.dampening);
  for (int64_t i = 0; i < param.numel(); ++i) {
    T d = g[i] + wd * w[i];
    if (mb) {
      mb[i] = p.first_step ? d : mom * mb[i] + damp * d;
      d = p.nesterov ? d + mom * mb[i] : mb[i];
    }
    w[i] -= lr * d;
  }
}

template <class T>
void adamw(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& p) {
  T* w = param.data<T>();
  const T* g = grad.data<T>();
  T *mp = m.data<T>(), *vp = v.data<T>();
  const T b1 = T(p.beta1), b2 = T(p.beta2), lr = T(p.lr), eps = T(p.eps);
  const T decay = T(1.0 - p.lr * p.weight_decay);
  const T bc1 = T(1.0 - std::pow(p.beta1, double(p.step)));
  const T bc2 = T(1.0 - std::pow(p.beta2, double(p.step)));
  for (int64_t i = 0; i < param.numel(); ++i) {
    w[i] *= decay;
    mp[i] = b1 * mp[i] + (T(1) - b1) * g[i];
    vp[i] = b2 * vp[i] + (T(1) - b2) * g[i] * g[i];
    const T mhat = mp[i] / bc1, vhat = vp[i] / bc2;
    w[i] -= lr * mhat / (std::sqrt(vhat) + eps);
  }
}

template <class T>
void unscale(Tensor& grad, Tensor& found_inf, double inv_scale) {
  T* g = grad.data<T>();
  bool bad = false;
  for (int64_t i = 0; i < grad.numel(); ++i) {
    bad = bad || !std::isfinite(g[i]);
    g[i] = T(double(g[i]) * inv_scale);
  }
  if (bad) found_inf.data<float>()[0] = 1.f;
}

}  // namespace

double loss_scale_of(const Tensor& scale) {
  EG_CHECK(scale.defined() && scale.dtype() == DType::f64 && scale.numel() == 1,
           "amp_unscale: the scale is one f64 element, got ", scale.defined() ? scale.str() : std::string("nothing"));
  return scale.data<double>()[0];
}

bool skipped(const Tensor& skip_if) { return skip_if.defined() && skip_if.data<float>()[0] != 0.f; }

void amp_unscale(Tensor& grad, Tensor& found_inf, const Tensor& scale) {
  const double inv_scale = 1.0 / loss_scale_of(scale);
  if (grad.dtype() == DType::f64) unscale<double>(grad, found_inf, inv_scale);
  else unscale<float>(grad, found_inf, inv_scale);
}

void amp_update_scale(Tensor& state, const Tensor& found_inf, int64_t growth_interval) {
  EG_CHECK(
      state.dtype() == DType::f64 && state.numel() == 3 && found_inf.dtype() == DType::f32 && found_inf.numel() == 1,
      "amp_update_scale: an f64 [3] state and an f32 [1] flag, got ", state.str(), " and ", found_inf.str());
  double* s = state.data<double>();
  if (found_inf.data<float>()[0] != 0.f) {
    s[0] *= 0.5, s[1] = 0, s[2] += 1;
    return;
  }
  if ((s[1] += 1) < double(growth_interval)) return;
  s[0] *= 2, s[1] = 0;
}

void clip_coef(const Tensor& sums, Tensor& out, double max_norm) {
  double total = 0;
  for (int64_t i = 0; i < sums.numel(); ++i) total += double(sums.data<float>()[i]);
  const double norm = std::sqrt(total);
  out.data<double>()[0] = norm;
  out.data<double>()[1] = std::isfinite(norm) && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

void scale_by(const Tensor& x, Tensor& y, const Tensor& coef) { scale(x, y, coef.data<double>()[0]); }

void sgd_step(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const ops::SgdParams& p) {
  if (param.dtype() == DType::f64) sgd<double>(param, grad, momentum_buf, p);
  else sgd<float>(param, grad, momentum_buf, p);
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& p) {
  if (param.dtype() == DType::f64) adamw<double>(param, grad, m, v, p);
  else adamw<float>(param, grad, m, v, p);
}

void check_multi_step(const char* op, const Tensor& lr, size_t params, std::initializer_list<size_t> lists) {
  EG_CHECK(lr.defined() && lr.dtype() == DType::f64 && lr.numel() == 1, op,
           ": the learning rate is one f64 element, got ", lr.defined() ? lr.str() : std::string("nothing"));
  for (size_t n : lists) EG_CHECK(n == params, op, ": ", params, " parameters but a list of ", n);
}

void sgd_step_multi(const Tensor& lr, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    std::vector<Tensor>& bufs, const ops::SgdParams& p, const Tensor& skip_if) {
  check_multi_step("sgd_step_multi", lr, params.size(), {grads.size(), bufs.size()});
  EG_CHECK(!p.first_step,
           "sgd_step_multi: a parameter's first step (its buffer made from the gradient) takes sgd_step");
  if (skipped(skip_if)) return;
  ops::SgdParams q = p;
  q.lr = lr.data<double>()[0];
  for (size_t i = 0; i < params.size(); ++i) sgd_step(params[i], grads[i], bufs[i], q);
}

void check_step_counts(const char* op, const std::vector<Tensor>& steps) {
  for (size_t i = 0; i < steps.size(); ++i)
    EG_CHECK(steps[i].defined() && steps[i].dtype() == DType::f64 && steps[i].numel() == 1, op, ": member ", i,
             "'s step count is one f64 element, got ", steps[i].defined() ? steps[i].str() : std::string("nothing"));
  std::vector<const void*> at;
  for (const Tensor& s : steps) at.push_back(s.raw_any());
  std::sort(at.begin(), at.end());
  EG_CHECK(std::adjacent_find(at.begin(), at.end()) == at.end(), op, ": two members share one step count");
}

int64_t advance_step_count(Tensor& step) {
  double& s = step.data<double>()[0];
  s += 1;
  return int64_t(s);
}

void adamw_step_multi(const Tensor& lr, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& m, std::vector<Tensor>& v, std::vector<Tensor>& steps,
                      const ops::AdamWParams& p, const Tensor& skip_if) {
  check_multi_step("adamw_step_multi", lr, params.size(), {grads.size(), m.size(), v.size(), steps.size()});
  check_step_counts("adamw_step_multi", steps);
  if (skipped(skip_if)) return;
  ops::AdamWParams q = p;
  q.lr = lr.data<double>()[0];
  for (size_t i = 0; i < params.size(); ++i) {
    q.step = advance_step_count(steps[i]);
    adamw_step(params[i], grads[i], m[i], v[i], q);
  }
}

}  // namespace eg::ref
