#include "freeze/plasticity.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace eg::freeze {

Tensor sp_gram(const Tensor& a) {
  EG_CHECK(a.defined() && a.dim() >= 2, "SP loss: an activation needs a batch dimension and features, got shape ",
           a.defined() ? shape_str(a.shape()) : std::string("(undefined)"));
  EG_CHECK(a.dtype() == DType::f32 || a.dtype() == DType::f64, "SP loss: activations must be f32 or f64, got ",
           dtype_name(a.dtype()));
  const int64_t b = a.size(0);
  EG_CHECK(b >= 2, "SP loss compares samples within a batch; it needs at least 2, got ", b);
  const Tensor& x = a;  // tensors are dense (views only reshape or slice rows)
  Tensor g = Tensor::empty({b, b}, x.dtype(), x.device());
  ops::call(ops::sp_gram, x.reshape({b, x.numel() / b}), g);
  return g;
}

double sp_loss_from_grams(const Tensor& ga, const Tensor& gb) {
  EG_CHECK(ga.shape() == gb.shape() && ga.dim() == 2 && ga.size(0) == ga.size(1), "SP loss: Gram matrices of shapes ",
           shape_str(ga.shape()), " and ", shape_str(gb.shape()), " cannot be compared");
  Tensor a = ga, b = gb;
  if (a.device() != b.device()) {
    a = a.to(Device::cpu());
    b = b.to(Device::cpu());
  }
  if (a.dtype() != b.dtype()) {
    a = a.to(DType::f64);
    b = b.to(DType::f64);
  }
  Tensor out = Tensor::empty({1}, a.dtype(), a.device());
  ops::call(ops::sp_loss, a, b, out);
  return out.item();
}

double sp_loss(const Tensor& a_train, const Tensor& a_ref) {
  EG_CHECK(a_train.shape() == a_ref.shape(), "SP loss: the training activation has shape ", shape_str(a_train.shape()),
           " but the reference's is ", shape_str(a_ref.shape()));
  return sp_loss_from_grams(sp_gram(a_train), sp_gram(a_ref));
}

}  // namespace eg::freeze
