// Finite-difference gradient check of a whole differentiable function through the
// autograd engine (f64 inputs on the CPU). For op kernels the op table in tests/
// does this per op; this checks compositions: layers, attention, losses.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace eg::autograd {

struct GradcheckResult {
  bool ok = true;
  double worst = 0;  // largest |analytic - numeric| / (atol + rtol |numeric|)
  std::string detail;  // where the worst element is
};

// f maps inputs to one output tensor; the check uses loss = sum(out * w) with a fixed
// random w. Inputs that require grad are checked element by element.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                          double eps = 1e-6, double atol = 1e-6, double rtol = 1e-4);

}  // namespace eg::autograd
