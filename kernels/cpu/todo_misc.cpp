// TEMPORARY placeholders for the misc group, deleted as the real kernels land.
#include "kernels/cpu/cpu.h"

namespace eg::cpu {
using namespace ops;
void binary_fwd(Binary, const Tensor&, const Tensor&, Tensor&) { EG_THROW("binary_fwd: not implemented yet"); }
void scale(const Tensor&, Tensor&, double) { EG_THROW("scale: not implemented yet"); }
void axpy(const Tensor&, Tensor&, double) { EG_THROW("axpy: not implemented yet"); }
void sum_to(const Tensor&, Tensor&) { EG_THROW("sum_to: not implemented yet"); }
void broadcast_to(const Tensor&, Tensor&) { EG_THROW("broadcast_to: not implemented yet"); }
void softmax_fwd(const Tensor&, Tensor&, bool) { EG_THROW("softmax_fwd: not implemented yet"); }
void softmax_bwd(const Tensor&, const Tensor&, Tensor&, bool) { EG_THROW("softmax_bwd: not implemented yet"); }
void cross_entropy_fwd(const Tensor&, const Tensor&, Tensor&, Tensor&, const CrossEntropyParams&) { EG_THROW("cross_entropy_fwd: not implemented yet"); }
void cross_entropy_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, const CrossEntropyParams&) { EG_THROW("cross_entropy_bwd: not implemented yet"); }
void layernorm_fwd(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&, double) { EG_THROW("layernorm_fwd: not implemented yet"); }
void layernorm_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) { EG_THROW("layernorm_bwd: not implemented yet"); }
void embedding_fwd(const Tensor&, const Tensor&, Tensor&) { EG_THROW("embedding_fwd: not implemented yet"); }
void embedding_bwd(const Tensor&, const Tensor&, Tensor&) { EG_THROW("embedding_bwd: not implemented yet"); }
void dropout_fwd(const Tensor&, Tensor&, Tensor&, double, uint64_t, uint64_t) { EG_THROW("dropout_fwd: not implemented yet"); }
void dropout_bwd(const Tensor&, const Tensor&, Tensor&, double) { EG_THROW("dropout_bwd: not implemented yet"); }
void sum_squares(const Tensor&, Tensor&) { EG_THROW("sum_squares: not implemented yet"); }
void cast(const Tensor&, Tensor&) { EG_THROW("cast: not implemented yet"); }
}  // namespace eg::cpu
