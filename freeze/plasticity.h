// Plasticity (Egeria §4.2.1): the similarity-preserving loss between a module's
// output activations in the training model and in the reference model, for the same
// input batch. Activations are flattened per sample (A [b, ...] -> Q [b, F]); the
// b x b Gram matrix Q Q^T is normalised row by row; P = ||G_T - G_R||_F^2 / b^2.
// The Gram is computed on the activation's device (a CUDA kernel on the GPU), so only
// the b x b matrix has to travel to the CPU where the reference side lives.
#pragma once
#include "core/tensor.h"

namespace eg::freeze {

// Row-normalised Gram matrix [b, b] (f32, on a's device) of a [b, ...] (f32 or f64).
Tensor sp_gram(const Tensor& a);
// ||ga - gb||_F^2 / b^2; both b x b, moved to the CPU when on different devices.
double sp_loss_from_grams(const Tensor& ga, const Tensor& gb);
// SP loss of two activations of the same shape.
double sp_loss(const Tensor& a_train, const Tensor& a_ref);

}  // namespace eg::freeze
