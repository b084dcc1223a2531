// Op cases: binary ops with broadcasting, scale, axpy, sum_to, broadcast_to.
#include "tests/op_cases.h"

namespace eg::testing {
namespace {

const char* binary_name(ops::Binary op) {
  switch (op) {
    case ops::Binary::add: return "add";
    case ops::Binary::sub: return "sub";
    case ops::Binary::mul: return "mul";
    case ops::Binary::div: return "div";
  }
  return "?";
}

// c = a op b with b broadcast; the backward is written with binary_fwd and sum_to,
// exactly as autograd/functions_math.cpp does it.
void add_binary(std::vector<OpCase>& v, ops::Binary op, const std::string& variant, Shape as, Shape bs, bool big) {
  OpCase c;
  c.name = std::string("binary/") + binary_name(op) + "_" + variant;
  c.make_inputs = [as, bs, op](DType dt) {
    Tensor b = op == ops::Binary::div ? uniform(bs, dt, 32, 0.5, 2.0) : randn(bs, dt, 32);
    return Tensors{randn(as, dt, 31), b};
  };
  Shape cs = as;  // a is always full-size here except in the "both" variant
  for (size_t i = 0; i < cs.size(); ++i) cs[i] = std::max(as[i], bs[i]);
  c.forward = [op, cs](ops::Backend b, const Tensors& in) {
    Tensor out = empty_on(in[0], cs, in[0].dtype());
    ops::run(ops::binary_fwd, b, op, in[0], in[1], out);
    return Tensors{out};
  };
  c.backward = [op, cs](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
    auto times = [&](ops::Binary k, const Tensor& x, const Tensor& y) {
      Tensor t = empty_on(in[0], cs, in[0].dtype());
      ops::run(ops::binary_fwd, b, k, x, y, t);
      return t;
    };
    auto reduce = [&](const Tensor& g, const Tensor& like) {
      Tensor r = empty_like(like);
      ops::run(ops::sum_to, b, g, r);
      return r;
    };
    Tensor ga = dout[0], gb = dout[0];
    if (op == ops::Binary::mul)
      ga = times(ops::Binary::mul, dout[0], in[1]), gb = times(ops::Binary::mul, dout[0], in[0]);
    if (op == ops::Binary::div) {
      ga = times(ops::Binary::div, dout[0], in[1]);
      gb = times(ops::Binary::div, times(ops::Binary::mul, dout[0], out[0]), in[1]);
    }
    Tensor da = reduce(ga, in[0]), db = reduce(gb, in[1]);
    if (op == ops::Binary::sub || op == ops::Binary::div) ops::run(ops::scale, b, db, db, -1.0);
    return Tensors{da, db};
  };
  c.uses = {uses(ops::binary_fwd), uses(ops::sum_to), uses(ops::scale)};
  c.gradcheck = !big;
  c.bench = big;
  c.bench_backward = false;
  c.bytes = double(shape_numel(cs)) * 4 * 3;
  v.push_back(c);
}

void add_axpy_broadcast(std::vector<OpCase>& v, const std::string& variant, Shape full, Shape small, bool big) {
  OpCase c;
  c.name = "broadcast_to/" + variant;
  c.make_inputs = [small](DType dt) { return Tensors{randn(small, dt, 41)}; };
  c.forward = [full](ops::Backend b, const Tensors& in) {
    Tensor y = empty_on(in[0], full, in[0].dtype());
    ops::run(ops::broadcast_to, b, in[0], y);
    Tensor z = y.clone();
    ops::run(ops::axpy, b, y, z, 0.5);  // z = 1.5 y: exercises axpy
    return Tensors{z};
  };
  c.backward = [](ops::Backend b, const Tensors& in, const Tensors&, const Tensors& dout) {
    Tensor dx = empty_like(in[0]);
    ops::run(ops::sum_to, b, dout[0], dx);
    ops::run(ops::scale, b, dx, dx, 1.5);
    return Tensors{dx};
  };
  c.uses = {uses(ops::broadcast_to), uses(ops::axpy), uses(ops::sum_to), uses(ops::scale)};
  c.gradcheck = !big;
  c.bench = big;
  c.bytes = double(shape_numel(full)) * 4 * 4;
  v.push_back(c);
}

// The bf16 twin of a same-shape binary case, forward only (its backward's sum_to is f32
// only; Note [bf16 kernels]).
void add_bf16_forward_twin(std::vector<OpCase>& v) {
  add_bf16_twin(v);
  v.back().backward = nullptr;
  v.back().uses = {uses(ops::binary_fwd)};
}

// z = 1.5 (x + 0.5 y), through axpy and scale (in place, as autograd accumulates
// gradients), same shapes in any layout. f32_sum: x and z f32 whatever y's dtype (a bf16
// gradient added into an f32 sum, as autocast's casts' backward does).
void add_axpy_scale(std::vector<OpCase>& v, const std::string& variant, Shape s, bool big, bool f32_sum = false) {
  OpCase c;
  c.name = "axpy_scale/" + variant;
  c.make_inputs = [s, f32_sum](DType dt) {
    return Tensors{randn(s, f32_sum ? param_dtype(dt) : dt, 51), randn(s, dt, 52)};
  };
  c.forward = [](ops::Backend b, const Tensors& in) {
    // In place into a copy of x in its layout (only cpu kernels write nChw16c).
    Tensor z = b == ops::Backend::cpu ? in[0].clone() : in[0].to_plain().clone();
    ops::run(ops::axpy, b, in[1], z, 0.5);
    ops::run(ops::scale, b, z, z, 1.5);
    return Tensors{z};
  };
  c.uses = {uses(ops::axpy), uses(ops::scale)};
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(shape_numel(s)) * 4 * 5;
  v.push_back(c);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  for (ops::Binary op : {ops::Binary::add, ops::Binary::sub, ops::Binary::mul, ops::Binary::div}) {
    add_binary(v, op, "same", {2, 3, 4, 5}, {2, 3, 4, 5}, false);
    add_bf16_forward_twin(v);
    add_binary(v, op, "channel", {2, 3, 4, 5}, {1, 3, 1, 1}, false);
    add_binary(v, op, "rows", {6, 7}, {1, 7}, false);
    add_binary(v, op, "column", {6, 7}, {6, 1}, false);
    add_binary(v, op, "scalar", {3, 4, 5}, {1, 1, 1}, false);
    add_binary(v, op, "inner2", {2, 3, 4, 5}, {1, 1, 4, 5}, false);
  }
  // nChw16c (Note [Blocked activations]): both blocked, one blocked, and a blocked
  // operand of a per-channel broadcast (computed plain).
  add_binary(v, ops::Binary::add, "same_nchw16c", {2, 16, 4, 5}, {2, 16, 4, 5}, false);
  block_inputs(v.back(), {0, 1}, true);
  add_bf16_forward_twin(v);
  add_binary(v, ops::Binary::mul, "same_nchw16c_b_plain", {2, 32, 3, 3}, {2, 32, 3, 3}, false);
  block_inputs(v.back(), {0}, false);
  add_bf16_forward_twin(v);
  add_binary(v, ops::Binary::sub, "same_plain_b_nchw16c", {2, 16, 3, 3}, {2, 16, 3, 3}, false);
  block_inputs(v.back(), {1}, true);
  add_bf16_forward_twin(v);
  add_binary(v, ops::Binary::mul, "channel_nchw16c", {2, 16, 4, 5}, {1, 16, 1, 1}, false);
  block_inputs(v.back(), {0}, true);
  add_binary(v, ops::Binary::add, "resnet_residual", {128, 16, 32, 32}, {128, 16, 32, 32}, true);
  add_bf16_forward_twin(v);
  add_nhwc_twin(v, {0, 1}, false);  // NHWC on CUDA (Note [Channels-last activations on CUDA])
  add_nhwc_twin(v, {0}, false, "_nhwc_a_only");  // b plain: converted to a's layout
  // 105 values: 13 vectors of 8 and a tail of 1 on CUDA (Note [Vector loads]).
  add_binary(v, ops::Binary::sub, "same_tail", {3, 5, 7}, {3, 5, 7}, false);
  add_bf16_forward_twin(v);
  add_binary(v, ops::Binary::mul, "resnet_channel", {128, 16, 32, 32}, {1, 16, 1, 1}, true);
  add_axpy_scale(v, "small", {2, 3, 4, 5}, false);
  add_bf16_twin(v);
  add_axpy_scale(v, "tail", {3, 5, 7}, false);
  add_bf16_twin(v);
  add_axpy_scale(v, "f32_sum_tail", {3, 5, 7}, false, true);
  add_bf16_twin(v);
  add_nhwc_twin(v, {1}, false);  // an NHWC bf16 x into a plain f32 y
  add_axpy_scale(v, "nchw16c_x_plain", {2, 32, 3, 3}, false);
  block_inputs(v.back(), {0}, false);
  add_bf16_twin(v);
  add_axpy_scale(v, "resnet", {128, 16, 32, 32}, true);
  block_inputs(v.back(), {0, 1}, false);
  add_bf16_twin(v);
  add_nhwc_twin(v, {1}, false);  // an NHWC x added into a plain y
  add_axpy_broadcast(v, "channel", {2, 3, 4, 5}, {1, 3, 1, 1}, false);
  add_axpy_broadcast(v, "middle", {2, 3, 4, 5}, {2, 1, 4, 1}, false);
  add_axpy_broadcast(v, "scalar", {4, 5}, {1, 1}, false);
  add_axpy_broadcast(v, "resnet_channel", {128, 64, 8, 8}, {1, 64, 1, 1}, true);
});

}  // namespace
}  // namespace eg::testing
