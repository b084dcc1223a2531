// The 16-bit batch norm's passes (batchnorm16.cu, Note [16-bit batch norm]), which
// batchnorm.cu's ops call for bf16 and f16 activations, x and its companions already in
// the layout they compute in (NCHW or NHWC); and the per-channel sum behind a 16-bit
// convolution's bias gradient (conv2d.cu).
#pragma once
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

void bn16_fwd_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& save_mean,
                    Tensor& save_invstd, Tensor& running_mean, Tensor& running_var, double momentum, double eps,
                    ops::BnAct act, const Tensor& residual);
void bn16_fwd_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                    const Tensor& running_var, Tensor& y, double eps, ops::BnAct act, const Tensor& residual);
void bn16_bwd(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
              Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training, ops::BnAct act, const Tensor& act_y,
              Tensor& dresidual, bool accumulate);

// db[c] = sum of dy over (N, H, W) for dy [N, C, H, W] of any of the three dtypes, db f32:
// a convolution's bias gradient beside 16-bit activations.
void channel_sum(const Tensor& dy, Tensor& db);

}  // namespace eg::cudak
