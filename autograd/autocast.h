// Mixed precision as torch.autocast: a thread-local scope in which the differentiable
// functions choose their compute dtype. See Note [Autocast].
#pragma once
#include "core/tensor.h"

namespace eg::autograd {

// Note [Autocast]
// Within an Autocast(bf16) scope (the training step's forward and loss, and evaluation,
// under --precision bf16), as PyTorch's autocast defines it:
//   * convolutions, linear layers and matmuls run in bf16: a floating input is cast
//     (fn::cast, an autograd node whose gradient comes back in the input's dtype), a
//     weight's bf16 copy comes from the scope's weight cache (autocast_weight), the
//     output is bf16, and weight and bias gradients are written in f32 straight from
//     bf16 operands (f32 accumulation), so the gradient buckets and the optimizer stay
//     f32 (master weights);
//   * batch norm, activations, pooling, same-shape elementwise ops and gradient
//     accumulation take the bf16 activations as they come (f32 statistics, parameters
//     and arithmetic; Note [bf16 kernels] in kernels/ops.h);
//   * everything else (attention until its bf16 kernel lands, softmax, losses,
//     layer norm, dropout, reductions) casts a bf16 input to f32 first
//     (fn::detail::f32_input): the loss is f32.
// Outside a scope nothing is cast, and a bf16 tensor given to those functions is still
// promoted, never misread. Backward runs outside the scope: each node's backward
// produces its gradients in the dtypes its forward recorded. An Autocast(f16) scope
// (--precision fp16, CUDA only: the CPU kernels take bf16, not f16) does the same in
// f16, its loss scaled against f16's narrow range (optim/loss_scaler.h).
class Autocast {
 public:
  explicit Autocast(DType low);  // f32: a scope that casts nothing
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DType prev_;
};

// The current scope's 16-bit dtype, or f32 outside any scope.
DType autocast_dtype();

// `w` (a parameter, not recorded) in the scope's dtype: cast once per outermost scope
// (autocast's weight cache: a weight used by several convolutions is cast once), and,
// for a weight that does not require grad (a frozen unit's), once for as long as it is
// neither changed (its version) nor trained again.
Tensor autocast_weight(const Tensor& w);

}  // namespace eg::autograd
