// Op cases: softmax, log-softmax, cross-entropy and the argmax of rows.
#include <cmath>

#include "tests/op_cases.h"

namespace eg::testing {
namespace {

void add_softmax(std::vector<OpCase>& v, bool log, const std::string& variant, Shape s, bool big) {
  OpCase c;
  c.name = std::string(log ? "log_softmax/" : "softmax/") + variant;
  c.make_inputs = [s](DType dt) { return Tensors{randn(s, dt, 51, 3.0)}; };
  c.forward = [log](ops::Backend b, const Tensors& in) {
    Tensor y = empty_like(in[0]);
    ops::run(ops::softmax_fwd, b, in[0], y, log);
    return Tensors{y};
  };
  c.backward = [log](ops::Backend b, const Tensors&, const Tensors& out, const Tensors& dout) {
    Tensor dx = empty_like(out[0]);
    ops::run(ops::softmax_bwd, b, dout[0], out[0], dx, log);
    return Tensors{dx};
  };
  c.uses = {uses(ops::softmax_fwd), uses(ops::softmax_bwd)};
  c.gradcheck = !big;
  c.bench = big;
  c.bench_backward = true;
  c.bytes = double(shape_numel(s)) * 4 * 5;
  v.push_back(c);
}

void add_ce(std::vector<OpCase>& v, const std::string& variant, int64_t n, int64_t k, double ls, bool ignore,
            bool big) {
  OpCase c;
  c.name = "cross_entropy/" + variant;
  ops::CrossEntropyParams p{ls, -100};
  c.make_inputs = [n, k, ignore](DType dt) {
    Tensor t = randint({n}, 0, k, 53);
    if (ignore) t.data<int64_t>()[1] = -100;
    return Tensors{randn({n, k}, dt, 52, 2.0), t};
  };
  c.forward = [p, n](ops::Backend b, const Tensors& in) {
    Tensor loss = empty_on(in[0], {1}, in[0].dtype()), lse = empty_on(in[0], {n}, in[0].dtype());
    ops::run(ops::cross_entropy_fwd, b, in[0], in[1], loss, lse, p);
    return Tensors{loss, lse};
  };
  c.backward = [p](ops::Backend b, const Tensors& in, const Tensors& out, const Tensors& dout) {
    Tensor dl = empty_like(in[0]);
    ops::run(ops::cross_entropy_bwd, b, dout[0], in[0], in[1], out[1], dl, p);
    return Tensors{dl, Tensor()};
  };
  c.uses = {uses(ops::cross_entropy_fwd), uses(ops::cross_entropy_bwd)};
  c.gradcheck = !big;
  c.bench = big;
  c.bench_backward = true;
  c.bytes = double(n * k) * 4 * 3;
  v.push_back(c);
}

// Rows of Gaussian logits (no ties), one with NaNs: the NaN never wins, and a row of
// NaNs gives 0. Indices must match exactly.
void add_argmax(std::vector<OpCase>& v, const std::string& variant, int64_t n, int64_t k, bool big) {
  OpCase c;
  c.name = "argmax_rows/" + variant;
  c.make_inputs = [n, k](DType dt) {
    Tensor x = randn({n, k}, dt, 54, 2.0);
    for (int64_t i = 0; i < k && n > 2; i += 2) {
      if (dt == DType::f64) x.data<double>()[k + i] = NAN, x.data<double>()[2 * k + i / 2] = NAN;
      else x.data<float>()[k + i] = NAN, x.data<float>()[2 * k + i / 2] = NAN;
    }
    return Tensors{x};
  };
  c.forward = [n](ops::Backend b, const Tensors& in) {
    Tensor idx = empty_on(in[0], {n}, DType::s64);
    ops::run(ops::argmax_rows, b, in[0], idx);
    return Tensors{idx};
  };
  c.uses = {uses(ops::argmax_rows)};
  c.fwd_tol = {1e-9, 0};  // an index off by one is a failure
  c.gradcheck = false;
  c.bench = big;
  c.bytes = double(n * k) * 4;
  v.push_back(c);
}

RegisterCases reg([](std::vector<OpCase>& v) {
  for (bool log : {false, true}) {
    add_softmax(v, log, "small", {3, 4, 7}, false);
    add_softmax(v, log, "rows_4096x1000", {4096, 1000}, true);
  }
  add_ce(v, "plain", 6, 5, 0.0, false, false);
  add_ce(v, "smoothed_ignored", 6, 5, 0.1, true, false);
  add_ce(v, "imagenet_128x1000", 128, 1000, 0.1, false, true);
  add_ce(v, "vocab_2048x8000", 2048, 8000, 0.1, false, true);
  add_argmax(v, "small", 5, 7, false);
  add_argmax(v, "vocab_2048x8000", 2048, 8000, true);
});

}  // namespace
}  // namespace eg::testing
