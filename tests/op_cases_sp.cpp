// Op cases: SP-loss pieces (row-normalised Gram matrix, squared distance). The shapes
// are the plasticity evaluations of ResNet-56 on 32x32 inputs (batch 128: module
// outputs of 16x32x32, 32x16x16, 64x8x8) and of a Transformer layer (64 x 32 tokens x 512).
#include "tests/op_cases.h"

namespace eg::testing {
namespace {

void add_gram(std::vector<OpCase>& v, const std::string& variant, Shape s, bool big) {
  OpCase c;
  c.name = "sp_gram/" + variant;
  c.make_inputs = [s](DType dt) { return Tensors{randn(s, dt, 31)}; };
  c.forward = [](ops::Backend b, const Tensors& in) {
    const int64_t n = in[0].size(0);
    Tensor g = empty_on(in[0], {n, n}, in[0].dtype());
    ops::run(ops::sp_gram, b, in[0], g);
    return Tensors{g};
  };
  c.uses = {uses(ops::sp_gram)};
  c.fwd_tol = {1e-5, 1e-3};
  c.gradcheck = false;
  c.bench = big;
  const double n = double(s[0]), f = double(shape_numel(s)) / n;
  c.flops = 2 * n * n * f;
  v.push_back(c);
}

void add_loss(std::vector<OpCase>& v, const std::string& variant, int64_t n, bool big) {
  OpCase c;
  c.name = "sp_loss/" + variant;
  c.make_inputs = [n](DType dt) { return Tensors{randn({n, n}, dt, 32, 0.1), randn({n, n}, dt, 33, 0.1)}; };
  c.forward = [](ops::Backend b, const Tensors& in) {
    Tensor out = empty_on(in[0], {1}, in[0].dtype());
    ops::run(ops::sp_loss, b, in[0], in[1], out);
    return Tensors{out};
  };
  c.uses = {uses(ops::sp_loss)};
  c.fwd_tol = {1e-7, 1e-4};
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(n * n) * 4 * 2;
  v.push_back(c);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  add_gram(v, "small", {5, 3, 2, 2}, false);
  add_gram(v, "odd_batch", {37, 70}, false);
  add_gram(v, "b128_16x32x32", {128, 16, 32, 32}, true);
  add_gram(v, "b128_32x16x16", {128, 32, 16, 16}, true);
  add_gram(v, "b128_64x8x8", {128, 64, 8, 8}, true);
  add_gram(v, "b64_32tok_d512", {64, 32, 512}, true);
  add_loss(v, "small", 7, false);
  add_loss(v, "b128", 128, true);
});

}  // namespace
}  // namespace eg::testing
