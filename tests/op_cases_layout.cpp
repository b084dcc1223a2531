// Op cases: layout (swap12).
#include "tests/op_cases.h"

namespace eg::testing {
namespace {

void add_swap12(std::vector<OpCase>& v, const std::string& variant, Shape s, bool big) {
  OpCase c;
  c.name = "swap12/" + variant;
  c.make_inputs = [s](DType dt) { return Tensors{randn(s, dt, 21)}; };
  c.forward = [](ops::Backend b, const Tensors& in) {
    const Shape& x = in[0].shape();
    Tensor y = empty_on(in[0], {x[0], x[2], x[1], x[3]}, in[0].dtype());
    ops::run(ops::swap12, b, in[0], y);
    return Tensors{y};
  };
  c.backward = [](ops::Backend b, const Tensors& in, const Tensors&, const Tensors& dout) {
    Tensor dx = empty_like(in[0]);
    ops::run(ops::swap12, b, dout[0], dx);
    return Tensors{dx};
  };
  c.uses = {uses(ops::swap12)};
  c.fwd_tol = c.bwd_tol = {0, 0};  // a permutation is exact
  c.gradcheck = !big;
  c.bench = big;
  c.bytes = double(shape_numel(s)) * 4 * 2;
  v.push_back(c);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  add_swap12(v, "small", {2, 3, 4, 5}, false);
  add_bf16_twin(v);
  add_swap12(v, "heads_b64_t128_h8_d64", {64, 128, 8, 64}, true);
});

}  // namespace
}  // namespace eg::testing
