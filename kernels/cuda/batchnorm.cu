// Batch norm on CUDA. f32: cuDNN's spatial batch norm (saveInvVariance is exactly our
// invstd = 1/sqrt(var + eps); running variance is the unbiased one, as ops.h), and our
// kernels for the inference-mode backward (frozen statistics). bf16 and f16 activations
// (mixed precision; parameters, statistics and their gradients f32, Note [bf16 kernels]
// in kernels/ops.h): batchnorm16.cu's passes (Note [16-bit batch norm]), in the layout
// the activations come in.
#include <algorithm>

#include "kernels/cuda/batchnorm16.cuh"
#include "kernels/cuda/cudnn_desc.cuh"

namespace eg::cudak {
namespace {

// f32, inference-mode backward (statistics are constants).
__global__ void bn_infer_bwd_dx_kernel(const float* dy, const float* gamma, const float* invstd, float* dx, int64_t c,
                                       int64_t hw, int64_t n) {
  EG_CUDA_LOOP(i, n) {
    const int64_t ch = (i / hw) % c;
    dx[i] = dy[i] * gamma[ch] * invstd[ch];
  }
}
// Per channel: dgamma = sum dy (x - mean) invstd, dbeta = sum dy.
__global__ void bn_param_grad_kernel(const float* dy, const float* x, const float* mean, const float* invstd, float* dg,
                                     float* db, int64_t n, int64_t c, int64_t hw) {
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    float sg = 0.f, sb = 0.f;
    for (int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) {
      const int64_t i = (k / hw) * c * hw + ch * hw + k % hw;
      sg += dy[i] * (x[i] - mean[ch]) * invstd[ch];
      sb += dy[i];
    }
    sg = block_sum(sg);
    sb = block_sum(sb);
    if (threadIdx.x == 0) {
      if (dg) dg[ch] = sg;
      if (db) db[ch] = sb;
    }
  }
}

bool is16(const Tensor& t) { return t.defined() && (t.dtype() == DType::bf16 || t.dtype() == DType::f16); }

}  // namespace

void batchnorm_fwd_train(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& save_mean,
                         Tensor& save_invstd, Tensor& running_mean, Tensor& running_var, double momentum, double eps,
                         ops::BnAct act, const Tensor& residual_in) {
  const bool run = running_mean.defined() && running_var.defined();
  const bool half = is16(x_in) || is16(y) || is16(residual_in);
  const Format f = compute_layout(x_in, half);
  const Tensor x = x_in.to_format(f), residual = residual_in.to_format(f);
  y.set_format(f);
  if (half)  // Note [16-bit batch norm] in batchnorm16.cu
    return bn16_fwd_train(x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var, momentum, eps, act,
                          residual);
  require_f32(x, "batch_norm");
  cudnnHandle_t h = cuda::cudnn_handle();
  TensorDesc xd(x.shape()), pd({1, x.size(1), 1, 1});
  const float one = 1.f, zero = 0.f;
  EG_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x.raw(), xd.d, y.raw(), pd.d, gamma.raw(), beta.raw(), momentum,
      run ? running_mean.raw() : nullptr, run ? running_var.raw() : nullptr, std::max(eps, CUDNN_BN_MIN_EPSILON),
      save_mean.raw(), save_invstd.raw()));
  // Residual and activation as their own elementwise passes, in place (cuDNN's fused
  // BN-add-activation wants NHWC half).
  if (residual.defined()) binary_fwd(ops::Binary::add, y, residual, y);
  if (act != ops::BnAct::none) act_fwd(ops::unfused(act), y, y);
}

void batchnorm_fwd_infer(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                         const Tensor& running_var, Tensor& y, double eps, ops::BnAct act, const Tensor& residual_in) {
  const bool half = is16(x_in) || is16(y) || is16(residual_in);
  const Format f = compute_layout(x_in, half);
  const Tensor x = x_in.to_format(f), residual = residual_in.to_format(f);
  y.set_format(f);
  if (half) return bn16_fwd_infer(x, gamma, beta, running_mean, running_var, y, eps, act, residual);
  require_f32(x, "batch_norm");
  cudnnHandle_t h = cuda::cudnn_handle();
  TensorDesc xd(x.shape()), pd({1, x.size(1), 1, 1});
  const float one = 1.f, zero = 0.f;
  EG_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x.raw(), xd.d,
                                                         y.raw(), pd.d, gamma.raw(), beta.raw(), running_mean.raw(),
                                                         running_var.raw(), std::max(eps, CUDNN_BN_MIN_EPSILON)));
  if (residual.defined()) binary_fwd(ops::Binary::add, y, residual, y);
  if (act != ops::BnAct::none) act_fwd(ops::unfused(act), y, y);
}

void batchnorm_bwd(const Tensor& dy_arg, const Tensor& x_in, const Tensor& gamma, const Tensor& mean,
                   const Tensor& invstd, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training, ops::BnAct act,
                   const Tensor& act_y_in, Tensor& dresidual, bool accumulate) {
  const bool half = is16(dy_arg) || is16(x_in) || is16(dx) || is16(act_y_in) || is16(dresidual);
  const Format f = compute_layout(x_in, half);
  const Tensor dy_in = dy_arg.to_format(f), x = x_in.to_format(f), act_y = act_y_in.to_format(f);
  if (dx.defined()) dx.set_format(f);
  if (dresidual.defined()) dresidual.set_format(f);
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  if (half)
    return bn16_bwd(dy_in, x, gamma, mean, invstd, dx, dgamma, dbeta, training, act, act_y, dresidual, accumulate);
  require_f32(x, "batch_norm backward");
  // The fused activation's mask as its own pass (act_bwd on its output, whose mask is its
  // input's; cuDNN's fused BN-activation backward wants NHWC half), written into the
  // residual's gradient when that is wanted.
  Tensor dy = dy_in;
  if (act != ops::BnAct::none) {
    dy = dresidual.defined() ? dresidual : Tensor::empty(dy_in.shape(), DType::f32, dy_in.device());
    act_bwd(ops::unfused(act), dy_in, act_y, dy);
  } else if (dresidual.defined()) {
    dresidual.copy_(dy_in);
  }
  // Added by cuDNN (betaParamDiff = 1) only in training, into both parameters'
  // gradients at cuDNN's alignment; else computed, then added.
  const bool blend = training && dgamma.defined() && dbeta.defined() && blend_aligned(dgamma) && blend_aligned(dbeta);
  if (accumulate && !blend && (dgamma.defined() || dbeta.defined())) {
    Tensor dg = ops::result_for(dgamma, true), db = ops::result_for(dbeta, true), none;
    batchnorm_bwd(dy, x, gamma, mean, invstd, dx, dg, db, training, ops::BnAct::none, none, none, false);
    for (auto [r, out] : {std::pair{&dg, &dgamma}, {&db, &dbeta}})
      if (out->defined()) axpy(*r, *out, 1.0);
    return;
  }
  if (!training) {  // statistics are constants
    if (dx.defined() && x.numel())
      bn_infer_bwd_dx_kernel<<<blocks_for(x.numel()), kThreads, 0, stream()>>>(
          dy.data<float>(), gamma.data<float>(), invstd.data<float>(), dx.data<float>(), c, hw, x.numel());
    if (dgamma.defined() || dbeta.defined())
      bn_param_grad_kernel<<<unsigned(std::min<int64_t>(c, 65535)), kThreads, 0, stream()>>>(
          dy.data<float>(), x.data<float>(), mean.data<float>(), invstd.data<float>(),
          dgamma.defined() ? dgamma.data<float>() : nullptr, dbeta.defined() ? dbeta.data<float>() : nullptr, n, c, hw);
    cuda::after_launch("batchnorm_bwd(inference)");
    return;
  }
  cudnnHandle_t h = cuda::cudnn_handle();
  TensorDesc xd(x.shape()), pd({1, c, 1, 1});
  // cuDNN writes all three gradients; skipped ones go to scratch.
  Tensor gx = dx.defined() ? dx : Tensor::empty(x.shape(), DType::f32, x.device());
  Tensor gg = dgamma.defined() ? dgamma : Tensor::empty({c}, DType::f32, x.device());
  Tensor gb = dbeta.defined() ? dbeta : Tensor::empty({c}, DType::f32, x.device());
  const float one = 1.f, zero = 0.f, beta_params = accumulate ? 1.f : 0.f;  // accumulate: both defined
  EG_CUDNN_CHECK(cudnnBatchNormalizationBackward(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &beta_params, xd.d, x.raw(),
                                                 xd.d, dy.raw(), xd.d, gx.raw(), pd.d, gamma.raw(), gg.raw(), gb.raw(),
                                                 CUDNN_BN_MIN_EPSILON, mean.raw(), invstd.raw()));
}

}  // namespace eg::cudak
