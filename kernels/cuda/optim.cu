// Fused optimizer updates on CUDA, f32, one pass over flat tensors (PyTorch
// semantics, as ops.h spells out), loss scaling's unscale with its found-inf flag, and
// gradient clipping's coefficient and scaling without a host read. Napkin math: SGD with
// momentum moves 16 B/param (ResNet-56: 14 MB, ~5 us at 3 TB/s); AdamW 28 B/param.
#include "kernels/cuda/common.cuh"
#include "kernels/ref/ref.h"

namespace eg::cudak {

// ---- kernels
namespace {
// Element i of one parameter's update, shared by the per-parameter and multi-tensor kernels.
__device__ __forceinline__ void sgd_update(float* p, const float* g, float* buf, int64_t i, float lr, float mom,
                                           float damp, float wd, bool nesterov, bool first) {
  float d = g[i] + wd * p[i];
  if (mom != 0.f) {
    const float b = first ? d : mom * buf[i] + (1.f - damp) * d;
    buf[i] = b;
    d = nesterov ? d + mom * b : b;
  }
  p[i] -= lr * d;
}
__device__ __forceinline__ void adamw_update(float* p, const float* g, float* m, float* v, int64_t i, float lr,
                                             float b1, float b2, float eps, float wd, float bc1, float bc2) {
  const float gi = g[i];
  p[i] *= 1.f - lr * wd;
  const float mi = b1 * m[i] + (1.f - b1) * gi, vi = b2 * v[i] + (1.f - b2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  p[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}
__global__ void sgd_kernel(float* p, const float* g, float* buf, float lr, float mom, float damp, float wd,
                           bool nesterov, bool first, int64_t n) {
  EG_CUDA_LOOP(i, n) sgd_update(p, g, buf, i, lr, mom, damp, wd, nesterov, first);
}
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, float lr, float b1, float b2, float eps,
                             float wd, float bc1, float bc2, int64_t n) {
  EG_CUDA_LOOP(i, n) adamw_update(p, g, m, v, i, lr, b1, b2, eps, wd, bc1, bc2);
}
__global__ void unscale_kernel(float* g, float* found_inf, const double* scale, int64_t n) {
  const float s = float(1.0 / *scale);
  EG_CUDA_LOOP(i, n) {
    const float v = g[i];
    if (!isfinite(v)) *found_inf = 1.f;  // every writer writes the same value
    g[i] = v * s;
  }
}
// One thread: the scale's update, as ref::amp_update_scale.
__global__ void update_scale_kernel(double* s, const float* found_inf, double growth_interval) {
  if (*found_inf != 0.f) {
    s[0] *= 0.5, s[1] = 0, s[2] += 1;
    return;
  }
  if ((s[1] += 1) < growth_interval) return;
  s[0] *= 2, s[1] = 0;
}
// One thread: a handful of sums, added in order in f64 as the host's loop adds them.
__global__ void clip_coef_kernel(const float* sums, int64_t k, double* out, double max_norm) {
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += double(sums[i]);
  const double norm = sqrt(total);
  out[0] = norm;
  out[1] = isfinite(norm) && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}
__global__ void scale_by_kernel(const float* x, float* y, const double* coef, int64_t n) {
  const float s = float(*coef);
  if (s == 1.f && x == y) return;  // within the clipping bound: nothing to move
  EG_CUDA_LOOP(i, n) y[i] = x[i] * s;
}
// Multi-tensor forms: up to kMembers parameters a launch, their pointers passed by value
// (PyTorch's multi_tensor_apply); blockIdx.y picks the member, a grid-stride loop covers
// it. The arithmetic is sgd_update's and adamw_update's, the learning rate read from the
// device.
constexpr int kMembers = 32;
struct SgdMembers {
  float* p[kMembers];
  const float* g[kMembers];
  float* b[kMembers];
  int64_t n[kMembers];
};
struct AdamWMembers {
  float* p[kMembers];
  const float* g[kMembers];
  float* m[kMembers];
  float* v[kMembers];
  int64_t n[kMembers];
  const double* step[kMembers];  // the count after this step (advance_steps_kernel ran first)
};
struct StepCounts {
  double* s[kMembers];
};
// `skip` (loss scaling's found-inf flag, or null): set, the launch writes nothing.
__global__ void sgd_multi_kernel(SgdMembers l, const double* lr_dev, float mom, float damp, float wd, bool nesterov,
                                 const float* skip) {
  if (skip && *skip != 0.f) return;
  const int t = int(blockIdx.y);
  float* p = l.p[t];
  const float* g = l.g[t];
  float* buf = l.b[t];
  const float lr = float(*lr_dev);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < l.n[t]; i += int64_t(gridDim.x) * blockDim.x)
    sgd_update(p, g, buf, i, lr, mom, damp, wd, nesterov, false);
}
// One thread a member: its step count advanced, before the update reads it.
__global__ void advance_steps_kernel(StepCounts c, int count, const float* skip) {
  if (skip && *skip != 0.f) return;
  const int t = int(threadIdx.x);
  if (t < count) c.s[t][0] += 1.0;
}
// The bias corrections from the member's count as the host computes them (f64 pow of the
// f64 betas, rounded to f32), once a thread.
__global__ void adamw_multi_kernel(AdamWMembers l, const double* lr_dev, double b1, double b2, float eps, float wd,
                                   const float* skip) {
  if (skip && *skip != 0.f) return;
  const int t = int(blockIdx.y);
  float *p = l.p[t], *m = l.m[t], *v = l.v[t];
  const float* g = l.g[t];
  const float lr = float(*lr_dev);
  const double step = *l.step[t];
  const float bc1 = float(1.0 - pow(b1, step)), bc2 = float(1.0 - pow(b2, step));
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < l.n[t]; i += int64_t(gridDim.x) * blockDim.x)
    adamw_update(p, g, m, v, i, lr, float(b1), float(b2), eps, wd, bc1, bc2);
}
// Blocks along x for the largest member of a launch (the grid-stride loop covers more).
dim3 members_grid(int64_t largest, size_t count) {
  return dim3(std::min(blocks_for(std::max<int64_t>(largest, 1)), 1024u), unsigned(count));
}
}  // namespace

// ---- launchers
void clip_coef(const Tensor& sums, Tensor& out, double max_norm) {
  require_f32(sums, "clip_coef");
  EG_CHECK(out.dtype() == DType::f64 && out.numel() == 2, "clip_coef on CUDA writes f64 [2], got ", out.str());
  clip_coef_kernel<<<1, 1, 0, stream()>>>(sums.data<float>(), sums.numel(), out.data<double>(), max_norm);
  cuda::after_launch("clip_coef");
}

void scale_by(const Tensor& x, Tensor& y, const Tensor& coef) {
  require_f32(x, "scale_by");
  EG_CHECK(coef.dtype() == DType::f64 && coef.numel() == 1, "scale_by on CUDA takes an f64 coefficient, got ",
           coef.str());
  const int64_t n = x.numel();
  if (!n) return;
  scale_by_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x.data<float>(), y.data<float>(), coef.data<double>(), n);
  cuda::after_launch("scale_by");
}

void amp_unscale(Tensor& grad, Tensor& found_inf, const Tensor& scale) {
  require_f32(grad, "amp_unscale");
  EG_CHECK(scale.dtype() == DType::f64 && scale.numel() == 1 && scale.device() == grad.device(),
           "amp_unscale on CUDA reads the scale as one f64 element on the gradient's GPU, got ", scale.str());
  const int64_t n = grad.numel();
  if (!n) return;
  unscale_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(grad.data<float>(), found_inf.data<float>(),
                                                           scale.data<double>(), n);
  cuda::after_launch("amp_unscale");
}

void amp_update_scale(Tensor& state, const Tensor& found_inf, int64_t growth_interval) {
  EG_CHECK(state.dtype() == DType::f64 && state.numel() == 3 && found_inf.dtype() == DType::f32 &&
               found_inf.numel() == 1 && state.device() == found_inf.device(),
           "amp_update_scale: an f64 [3] state and an f32 [1] flag on one GPU, got ", state.str(), " and ",
           found_inf.str());
  update_scale_kernel<<<1, 1, 0, stream()>>>(state.data<double>(), found_inf.data<float>(), double(growth_interval));
  cuda::after_launch("amp_update_scale");
}

namespace {
const float* skip_flag(const Tensor& skip_if) {
  if (!skip_if.defined()) return nullptr;
  EG_CHECK(skip_if.dtype() == DType::f32 && skip_if.numel() == 1,
           "a multi-tensor step's skip flag is one f32 "
           "element, got ",
           skip_if.str());
  return skip_if.data<float>();
}
}  // namespace

void sgd_step(Tensor& param, const Tensor& grad, Tensor& buf, const ops::SgdParams& s) {
  require_f32(param, "sgd_step");
  const int64_t n = param.numel();
  if (!n) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(
      param.data<float>(), grad.data<float>(), buf.defined() ? buf.data<float>() : nullptr, float(s.lr),
      float(s.momentum), float(s.dampening), float(s.weight_decay), s.nesterov, s.first_step, n);
  cuda::after_launch("sgd_step");
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& a) {
  require_f32(param, "adamw_step");
  const int64_t n = param.numel();
  if (!n) return;
  const float bc1 = float(1.0 - std::pow(a.beta1, double(a.step))),
              bc2 = float(1.0 - std::pow(a.beta2, double(a.step)));
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(param.data<float>(), grad.data<float>(), m.data<float>(),
                                                         v.data<float>(), float(a.lr), float(a.beta1), float(a.beta2),
                                                         float(a.eps), float(a.weight_decay), bc1, bc2, n);
  cuda::after_launch("adamw_step");
}

void sgd_step_multi(const Tensor& lr, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    std::vector<Tensor>& bufs, const ops::SgdParams& s, const Tensor& skip_if) {
  ref::check_multi_step("sgd_step_multi", lr, params.size(), {grads.size(), bufs.size()});
  EG_CHECK(!s.first_step,
           "sgd_step_multi: a parameter's first step (its buffer made from the gradient) takes sgd_step");
  const bool momentum = s.momentum != 0.0;
  for (size_t first = 0; first < params.size(); first += kMembers) {
    SgdMembers l{};
    const size_t count = std::min(params.size() - first, size_t(kMembers));
    int64_t largest = 0;
    for (size_t k = 0; k < count; ++k) {
      Tensor& p = params[first + k];
      require_f32(p, "sgd_step_multi");
      l.p[k] = p.data<float>();
      l.g[k] = grads[first + k].data<float>();
      l.b[k] = momentum ? bufs[first + k].data<float>() : nullptr;
      l.n[k] = p.numel();
      largest = std::max(largest, l.n[k]);
    }
    sgd_multi_kernel<<<members_grid(largest, count), kThreads, 0, stream()>>>(l, lr.data<double>(), float(s.momentum),
                                                                              float(s.dampening), float(s.weight_decay),
                                                                              s.nesterov, skip_flag(skip_if));
    cuda::after_launch("sgd_step_multi");
  }
}

void adamw_step_multi(const Tensor& lr, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      std::vector<Tensor>& m, std::vector<Tensor>& v, std::vector<Tensor>& steps,
                      const ops::AdamWParams& a, const Tensor& skip_if) {
  ref::check_multi_step("adamw_step_multi", lr, params.size(), {grads.size(), m.size(), v.size(), steps.size()});
  ref::check_step_counts("adamw_step_multi", steps);
  for (size_t first = 0; first < params.size(); first += kMembers) {
    AdamWMembers l{};
    StepCounts c{};
    const size_t count = std::min(params.size() - first, size_t(kMembers));
    int64_t largest = 0;
    for (size_t k = 0; k < count; ++k) {
      const size_t i = first + k;
      require_f32(params[i], "adamw_step_multi");
      l.p[k] = params[i].data<float>();
      l.g[k] = grads[i].data<float>();
      l.m[k] = m[i].data<float>();
      l.v[k] = v[i].data<float>();
      l.n[k] = params[i].numel();
      c.s[k] = steps[i].data<double>();
      l.step[k] = c.s[k];
      largest = std::max(largest, l.n[k]);
    }
    advance_steps_kernel<<<1, kMembers, 0, stream()>>>(c, int(count), skip_flag(skip_if));
    cuda::after_launch("adamw_step_multi (step counts)");
    adamw_multi_kernel<<<members_grid(largest, count), kThreads, 0, stream()>>>(
        l, lr.data<double>(), a.beta1, a.beta2, float(a.eps), float(a.weight_decay), skip_flag(skip_if));
    cuda::after_launch("adamw_step_multi");
  }
}

}  // namespace eg::cudak
