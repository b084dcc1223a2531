// TEMPORARY placeholders for the conv group, deleted as the real kernels land.
#include "kernels/cpu/cpu.h"

namespace eg::cpu {
using namespace ops;
void conv2d_fwd(const Tensor&, const Tensor&, const Tensor&, Tensor&, const Conv2dParams&) { EG_THROW("conv2d_fwd: not implemented yet"); }
void conv2d_bwd_data(const Tensor&, const Tensor&, Tensor&, const Conv2dParams&) { EG_THROW("conv2d_bwd_data: not implemented yet"); }
void conv2d_bwd_weight(const Tensor&, const Tensor&, Tensor&, Tensor&, const Conv2dParams&) { EG_THROW("conv2d_bwd_weight: not implemented yet"); }
void batchnorm_fwd_train(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, Tensor&, double, double) { EG_THROW("batchnorm_fwd_train: not implemented yet"); }
void batchnorm_fwd_infer(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, double) { EG_THROW("batchnorm_fwd_infer: not implemented yet"); }
void batchnorm_bwd(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&, bool) { EG_THROW("batchnorm_bwd: not implemented yet"); }
void pool2d_fwd(const Tensor&, Tensor&, Tensor&, const Pool2dParams&) { EG_THROW("pool2d_fwd: not implemented yet"); }
void pool2d_bwd(const Tensor&, const Tensor&, Tensor&, const Pool2dParams&) { EG_THROW("pool2d_bwd: not implemented yet"); }
void global_avgpool_fwd(const Tensor&, Tensor&) { EG_THROW("global_avgpool_fwd: not implemented yet"); }
void global_avgpool_bwd(const Tensor&, Tensor&) { EG_THROW("global_avgpool_bwd: not implemented yet"); }
}  // namespace eg::cpu
