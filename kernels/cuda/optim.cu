// Fused optimizer updates on CUDA, f32, one pass over flat tensors (PyTorch
// semantics, as ops.h spells out), loss scaling's unscale with its found-inf flag, and
// gradient clipping's coefficient and scaling without a host read. Napkin math: SGD with
// momentum moves 16 B/param (ResNet-56: 14 MB, ~5 us at 3 TB/s); AdamW 28 B/param.
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

// ---- kernels
namespace {
__global__ void sgd_kernel(float* p, const float* g, float* buf, float lr, float mom, float damp, float wd,
                           bool nesterov, bool first, int64_t n) {
  EG_CUDA_LOOP(i, n) {
    float d = g[i] + wd * p[i];
    if (mom != 0.f) {
      const float b = first ? d : mom * buf[i] + (1.f - damp) * d;
      buf[i] = b;
      d = nesterov ? d + mom * b : b;
    }
    p[i] -= lr * d;
  }
}
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, float lr, float b1, float b2, float eps,
                             float wd, float bc1, float bc2, int64_t n) {
  EG_CUDA_LOOP(i, n) {
    const float gi = g[i];
    p[i] *= 1.f - lr * wd;
    const float mi = b1 * m[i] + (1.f - b1) * gi, vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
  }
}
__global__ void unscale_kernel(float* g, float* found_inf, float s, int64_t n) {
  EG_CUDA_LOOP(i, n) {
    const float v = g[i];
    if (!isfinite(v)) *found_inf = 1.f;  // every writer writes the same value
    g[i] = v * s;
  }
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

void amp_unscale(Tensor& grad, Tensor& found_inf, double inv_scale) {
  require_f32(grad, "amp_unscale");
  const int64_t n = grad.numel();
  if (!n) return;
  unscale_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(grad.data<float>(), found_inf.data<float>(),
                                                           float(inv_scale), n);
  cuda::after_launch("amp_unscale");
}

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

}  // namespace eg::cudak
