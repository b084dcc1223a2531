#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/functions.h"

namespace eg::autograd {

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                          double eps, double atol, double rtol) {
  for (auto& t : inputs)
    EG_CHECK(!t.requires_grad() || (t.dtype() == DType::f64 && t.device().is_cpu()),
             "gradcheck: inputs that require grad must be f64 CPU tensors");
  Tensor out0 = f(inputs);
  Generator g(1234);
  Tensor w = Tensor::randn(out0.shape(), g, DType::f64);
  auto loss_value = [&]() {
    NoGradGuard ng;
    Tensor o = f(inputs);
    double s = 0;
    for (int64_t i = 0; i < o.numel(); ++i) s += o.data<double>()[i] * w.data<double>()[i];
    return s;
  };
  for (auto& t : inputs)
    if (t.requires_grad()) t.set_grad(Tensor());
  fn::sum(fn::mul(out0, w)).backward();
  GradcheckResult r;
  for (size_t j = 0; j < inputs.size(); ++j) {
    const Tensor& t = inputs[j];
    if (!t.requires_grad()) continue;
    EG_CHECK(t.grad().defined(), "gradcheck: input ", j, " requires grad but received none");
    double* x = t.data<double>();
    const double* ga = t.grad().data<double>();
    for (int64_t e = 0; e < t.numel(); ++e) {
      const double saved = x[e];
      x[e] = saved + eps;
      double lp = loss_value();
      x[e] = saved - eps;
      double lm = loss_value();
      x[e] = saved;
      double num = (lp - lm) / (2 * eps);
      double ratio = std::fabs(ga[e] - num) / (atol + rtol * std::fabs(num));
      if (!(ratio <= r.worst)) {
        r.worst = std::isnan(ratio) ? INFINITY : ratio;
        std::ostringstream os;
        os << "input " << j << " element " << e << ": analytic " << ga[e] << ", numeric " << num;
        r.detail = os.str();
      }
    }
  }
  r.ok = r.worst <= 1.0;
  return r;
}

}  // namespace eg::autograd
