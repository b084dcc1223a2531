// Differentiable functions: each validates its inputs in the user's terms, allocates
// outputs, runs the op's forward through the registry, and records a Node whose
// backward calls the op's backward kernels for exactly the inputs that need a gradient.
#pragma once
#include <vector>

#include "autograd/node.h"
#include "core/rng.h"
#include "kernels/ops.h"

namespace eg::fn {

// ---- convolution, normalisation, pooling, activations (functions_nn.cpp)
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const ops::Conv2dParams& p);
// training: batch statistics, running stats updated in place (when defined).
// !training: running statistics. See Note [Frozen BatchNorm semantics] in layers/layers.h.
// act: relu(batch_norm(x)) or relu6(batch_norm(x)) in one fused op (one pass fewer each
// way than the activation after it, and one activation fewer kept for the backward).
// residual (shaped like x): act(batch_norm(x) + residual), a residual block's end in one
// pass each way instead of three (add, ReLU and the batch norm's own).
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor running_mean, Tensor running_var,
                  bool training, double momentum, double eps, ops::BnAct act = ops::BnAct::none,
                  const Tensor& residual = Tensor());
Tensor activation(const Tensor& x, ops::Act act);
inline Tensor relu(const Tensor& x) { return activation(x, ops::Act::relu); }
inline Tensor relu6(const Tensor& x) { return activation(x, ops::Act::relu6); }
inline Tensor gelu(const Tensor& x) { return activation(x, ops::Act::gelu); }
Tensor pool2d(const Tensor& x, const ops::Pool2dParams& p);
Tensor global_avg_pool(const Tensor& x);  // [N, C, H, W] -> [N, C]

// ---- precision (functions_math.cpp; Note [Autocast] in autograd/autocast.h)
// x as `dtype` (f32, f64, bf16, f16); the gradient comes back in x's dtype.
Tensor cast(const Tensor& x, DType dtype);

// ---- math (functions_math.cpp)
Tensor add(const Tensor& a, const Tensor& b);  // numpy broadcasting
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);
// x times the one element of `coef` (f64 on x's device, read there: loss scaling's scale),
// rounded to f32 as scale's alpha is; x f32.
Tensor scale_by(const Tensor& x, const Tensor& coef);
// Sum over `dims` (negative counts from the end); keepdim keeps them as size 1.
Tensor sum(const Tensor& x, std::vector<int> dims, bool keepdim = false);
Tensor sum(const Tensor& x);  // all elements -> [1]
Tensor mean(const Tensor& x, std::vector<int> dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor reshape(const Tensor& x, const Shape& shape);  // differentiable view
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);  // 2-D or batched 3-D
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias);  // x [..., K] -> [..., N]
// Index of the largest value of each row (last dim), s64 [...]: the first on ties, a NaN
// never wins (ops::argmax_rows). Not differentiable.
Tensor argmax(const Tensor& x);
Tensor softmax(const Tensor& x);  // last dim
Tensor log_softmax(const Tensor& x);  // last dim
// Mean cross-entropy over rows not equal to ignore_index: logits [N, C], target s64 [N].
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0,
                     int64_t ignore_index = -100);
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);
Tensor embedding(const Tensor& ids, const Tensor& table);
// Identity unless training and p > 0; draws counters from `gen`.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask,
                                    bool causal, double scale = 0.0);

}  // namespace eg::fn
