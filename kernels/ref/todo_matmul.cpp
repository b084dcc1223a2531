// TEMPORARY placeholders for the matmul group, deleted as the real kernels land.
#include "kernels/ref/ref.h"

namespace eg::ref {
using namespace ops;
void gemm(const Tensor&, const Tensor&, Tensor&, bool, bool, double, double) { EG_THROW("gemm: not implemented yet"); }
void linear_fwd(const Tensor&, const Tensor&, const Tensor&, Tensor&) { EG_THROW("linear_fwd: not implemented yet"); }
void linear_bwd(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) { EG_THROW("linear_bwd: not implemented yet"); }
void attention_fwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, const AttentionParams&) { EG_THROW("attention_fwd: not implemented yet"); }
void attention_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&, const AttentionParams&) { EG_THROW("attention_bwd: not implemented yet"); }
void sgd_step(Tensor&, const Tensor&, Tensor&, const SgdParams&) { EG_THROW("sgd_step: not implemented yet"); }
void adamw_step(Tensor&, const Tensor&, Tensor&, Tensor&, const AdamWParams&) { EG_THROW("adamw_step: not implemented yet"); }
}  // namespace eg::ref
