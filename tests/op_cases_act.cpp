// Op cases: activations (relu, relu6, gelu).
#include "tests/op_cases.h"

namespace eg::testing {
namespace {

void add_act(std::vector<OpCase>& v, const char* name, ops::Act act, Shape shape, bool big) {
  OpCase c;
  c.name = std::string("act/") + name + (big ? "_resnet" : "_small");
  // Inputs span the kinks (0 and 6) so both sides of each are exercised.
  c.make_inputs = [shape](DType dt) { return Tensors{randn(shape, dt, 11, 4.0)}; };
  c.forward = [act](ops::Backend b, const Tensors& in) {
    Tensor y = empty_like(in[0]);
    ops::run(ops::act_fwd, b, act, in[0], y);
    return Tensors{y};
  };
  c.backward = [act](ops::Backend b, const Tensors& in, const Tensors&, const Tensors& dout) {
    Tensor dx = empty_like(in[0]);
    ops::run(ops::act_bwd, b, act, dout[0], in[0], dx);
    return Tensors{dx};
  };
  c.uses = {uses(ops::act_fwd), uses(ops::act_bwd)};
  c.gradcheck = !big;
  c.bench = big;
  c.bench_backward = true;
  c.bytes = double(shape_numel(shape)) * 4 * (2 + 3);
  v.push_back(c);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  for (auto [name, act] :
       {std::pair{"relu", ops::Act::relu}, std::pair{"relu6", ops::Act::relu6}, std::pair{"gelu", ops::Act::gelu}}) {
    add_act(v, name, act, {2, 3, 5, 7}, false);
    add_bf16_twin(v);
    add_act(v, name, act, {128, 16, 32, 32}, true);
    add_bf16_twin(v);
  }
  // nChw16c (Note [Blocked activations]): blocked x with blocked and with plain dy.
  add_act(v, "relu_nchw16c", ops::Act::relu, {2, 32, 3, 5}, false);
  block_inputs(v.back(), {0}, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, true);  // NHWC on CUDA (Note [Channels-last activations on CUDA])
  add_act(v, "gelu_nchw16c_dy_plain", ops::Act::gelu, {2, 16, 3, 5}, false);
  block_inputs(v.back(), {0}, false);
  add_bf16_twin(v);
  add_nhwc_twin(v, {0}, false);
});

}  // namespace
}  // namespace eg::testing
