// TEMPORARY until autograd/engine.cpp lands.
#include "core/tensor.h"
namespace eg {
void Tensor::backward(const Tensor&, bool) const { EG_THROW("autograd not implemented yet"); }
}  // namespace eg
