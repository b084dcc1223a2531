// Differentiable elementwise math with broadcasting, reductions, views and matmul.
#include <algorithm>

#include "autograd/autocast.h"
#include "autograd/check.h"
#include "autograd/functions.h"

namespace eg::fn {

using namespace detail;
using autograd::Node;
using autograd::Tensors;

namespace {

Shape pad_left(const Shape& s, size_t rank) {
  Shape r(rank - s.size(), 1);
  r.insert(r.end(), s.begin(), s.end());
  return r;
}

Shape broadcast_shape(const Shape& a, const Shape& b, const char* fn) {
  size_t rank = std::max(a.size(), b.size());
  Shape pa = pad_left(a, rank), pb = pad_left(b, rank), c(rank);
  for (size_t i = 0; i < rank; ++i) {
    EG_CHECK(pa[i] == pb[i] || pa[i] == 1 || pb[i] == 1, fn, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dimension ", i, ")");
    c[i] = pa[i] == 1 ? pb[i] : pa[i];
  }
  return c;
}

// Sums g (shape c) down to `target` (a broadcast source shape); returns g itself when equal.
Tensor reduce_to(const Tensor& g, const Shape& target) {
  if (g.shape() == target) return g;
  Tensor r = empty_as(g, pad_left(target, g.shape().size()));
  ops::call(ops::sum_to, g, r);
  return r.reshape(target);
}

Tensor binary(ops::Binary op, const Tensor& a_in, const Tensor& b_in, const char* name) {
  check_defined(a_in, name, "first operand");
  check_defined(b_in, name, "second operand");
  // 16-bit operands of one dtype and shape stay so (f32 arithmetic); any other mix
  // computes in f32.
  const bool half = is_half(a_in.dtype()) && b_in.dtype() == a_in.dtype() && a_in.shape() == b_in.shape();
  const Tensor a = half ? a_in : f32_input(a_in, name, "first operand");
  const Tensor b = half ? b_in : f32_input(b_in, name, "second operand");
  check_same(a, b, name, "second operand");
  Shape cs = broadcast_shape(a.shape(), b.shape(), name);
  Tensor ap = a.reshape(pad_left(a.shape(), cs.size())), bp = b.reshape(pad_left(b.shape(), cs.size()));
  Tensor c = empty_as(a, cs);
  ops::call(ops::binary_fwd, op, ap, bp, c);
  Tensors saved;
  if (op == ops::Binary::mul) saved = {ap, bp};
  if (op == ops::Binary::div) saved = {bp, c.detach()};
  autograd::record_function(name, {a, b}, {&c}, saved,
                            [op, as = a.shape(), bs = b.shape()](const Tensors& g, const Tensors& s, const Node& n) {
    Tensor da, db;
    const Tensor& gc = g[0];
    auto times = [&](ops::Binary k, const Tensor& x, const Tensor& y) {
      Tensor t = empty_like(gc);
      ops::call(ops::binary_fwd, k, x, y, t);
      return t;
    };
    switch (op) {
      case ops::Binary::add:
      case ops::Binary::sub:
        if (n.needs_input_grad(0)) da = reduce_to(gc, as);
        if (n.needs_input_grad(1)) {
          db = reduce_to(gc, bs);
          if (op == ops::Binary::sub) {
            Tensor neg = empty_like(db);
            ops::call(ops::scale, db, neg, -1.0);
            db = neg;
          }
        }
        break;
      case ops::Binary::mul:
        if (n.needs_input_grad(0)) da = reduce_to(times(ops::Binary::mul, gc, s[1]), as);
        if (n.needs_input_grad(1)) db = reduce_to(times(ops::Binary::mul, gc, s[0]), bs);
        break;
      case ops::Binary::div:  // c = a / b: da = g / b, db = -g c / b
        if (n.needs_input_grad(0)) da = reduce_to(times(ops::Binary::div, gc, s[0]), as);
        if (n.needs_input_grad(1)) {
          Tensor t = times(ops::Binary::div, times(ops::Binary::mul, gc, s[1]), s[0]);
          Tensor r = reduce_to(t, bs);
          Tensor neg = empty_like(r);
          ops::call(ops::scale, r, neg, -1.0);
          db = neg;
        }
        break;
    }
    return Tensors{da, db};
  });
  return c;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary(ops::Binary::add, a, b, "add"); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(ops::Binary::sub, a, b, "sub"); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(ops::Binary::mul, a, b, "mul"); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(ops::Binary::div, a, b, "div"); }

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "cast", "input");
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  ops::call(ops::cast, x, y);
  autograd::record_function("CastBackward", {x}, {&y}, {},
                            [from = x.dtype()](const Tensors& g, const Tensors&, const Node& n) {
    // Into its destination (the f32 sum of what several autocast layers read) in the pass
    // that would cast it: axpy reads either width. Not into a narrower one: the sum would
    // round once where the cast and the add round twice.
    const bool widening = dtype_size(from) >= dtype_size(g[0].dtype());
    if (Tensor dest = widening ? destination_for(n, 0, g[0].shape(), from, g[0].device()) : Tensor(); dest.defined()) {
      ops::call(ops::axpy, g[0], dest, 1.0);
      return Tensors{dest};
    }
    Tensor dx = Tensor::empty(g[0].shape(), from, g[0].device());
    ops::call(ops::cast, g[0], dx);
    return Tensors{dx};
  });
  return y;
}

Tensor scale(const Tensor& x, double alpha) {
  check_defined(x, "scale", "input");
  if (!is_half(x.dtype())) check_float(x, "scale", "input");
  Tensor y = empty_like(x);
  ops::call(ops::scale, x, y, alpha);
  autograd::record_function("ScaleBackward", {x}, {&y}, {}, [alpha](const Tensors& g, const Tensors&, const Node&) {
    Tensor dx = empty_like(g[0]);
    ops::call(ops::scale, g[0], dx, alpha);
    return Tensors{dx};
  });
  return y;
}

Tensor scale_by(const Tensor& x, const Tensor& coef) {
  check_defined(x, "scale_by", "input");
  EG_CHECK(x.dtype() == DType::f32, "scale_by: an f32 input, got ", x.str());
  Tensor y = empty_like(x);
  ops::call(ops::scale_by, x, y, coef);
  autograd::record_function("ScaleByBackward", {x}, {&y}, {coef}, [](const Tensors& g, const Tensors& s, const Node&) {
    Tensor dx = empty_like(g[0]);
    ops::call(ops::scale_by, g[0], dx, s[0]);
    return Tensors{dx};
  });
  return y;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor y = x.detach().reshape(shape);
  autograd::record_function(
      "ReshapeBackward", {x}, {&y}, {},
      [xs = x.shape()](const Tensors& g, const Tensors&, const Node&) { return Tensors{g[0].reshape(xs)}; });
  return y;
}

Tensor sum(const Tensor& x_in, std::vector<int> dims, bool keepdim) {
  const Tensor x = f32_input(x_in, "sum", "input");
  Shape keep = x.shape();
  for (int& d : dims) {
    if (d < 0) d += x.dim();
    EG_CHECK(d >= 0 && d < x.dim(), "sum: dimension out of range for shape ", shape_str(x.shape()));
    keep[size_t(d)] = 1;
  }
  Shape out;
  for (int i = 0; i < x.dim(); ++i)
    if (keepdim || std::find(dims.begin(), dims.end(), i) == dims.end()) out.push_back(keep[size_t(i)]);
  Tensor yk = empty_as(x, keep);
  ops::call(ops::sum_to, x, yk);
  Tensor y = yk.reshape(out.empty() ? Shape{1} : out);
  autograd::record_function("SumBackward", {x}, {&y}, {},
                            [xs = x.shape(), keep](const Tensors& g, const Tensors&, const Node&) {
    Tensor dx = empty_as(g[0], xs);
    ops::call(ops::broadcast_to, g[0].reshape(keep), dx);
    return Tensors{dx};
  });
  return y;
}

Tensor sum(const Tensor& x) {
  std::vector<int> all(size_t(x.dim()));
  for (int i = 0; i < x.dim(); ++i) all[size_t(i)] = i;
  return sum(x, all, false);
}

Tensor argmax(const Tensor& x_in) {
  const Tensor x = is_half(x_in.dtype()) ? cast(x_in, DType::f32) : x_in;  // on its device
  EG_CHECK(x.dim() >= 1 && x.size(-1) > 0, "argmax: needs a tensor with a non-empty last dimension, got ",
           shape_str(x.shape()));
  Shape s = x.shape();
  s.pop_back();
  Tensor idx = Tensor::empty(s, DType::s64, x.device());
  ops::call(ops::argmax_rows, x, idx);
  return idx;
}

Tensor mean(const Tensor& x, std::vector<int> dims, bool keepdim) {
  int64_t n = 1;
  for (int d : dims) n *= x.size(d);
  return scale(sum(x, dims, keepdim), 1.0 / double(std::max<int64_t>(n, 1)));
}

Tensor mean(const Tensor& x) { return scale(sum(x), 1.0 / double(std::max<int64_t>(x.numel(), 1))); }

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool ta, bool tb) {
  // Under autocast both operands in its dtype, the product too (Note [Autocast]).
  const DType low = autograd::autocast_dtype();
  const bool autocast = low != DType::f32 && is_floating(a_in.dtype()) && is_floating(b_in.dtype());
  const Tensor a = autocast ? cast(a_in, low) : f32_input(a_in, "matmul", "first operand");
  const Tensor b = autocast ? cast(b_in, low) : f32_input(b_in, "matmul", "second operand");
  check_same(a, b, "matmul", "second operand");
  EG_CHECK((a.dim() == 2 && b.dim() == 2) || (a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0)),
           "matmul: operands must both be 2-D, or 3-D with the same batch size; got ", shape_str(a.shape()), " and ",
           shape_str(b.shape()));
  const int r = a.dim();
  int64_t m = ta ? a.size(r - 1) : a.size(r - 2), k = ta ? a.size(r - 2) : a.size(r - 1);
  int64_t kb = tb ? b.size(r - 1) : b.size(r - 2), n = tb ? b.size(r - 2) : b.size(r - 1);
  EG_CHECK(k == kb, "matmul: inner dimensions differ (", k, " vs ", kb, ") for ", shape_str(a.shape()), " and ",
           shape_str(b.shape()));
  Shape cs = r == 2 ? Shape{m, n} : Shape{a.size(0), m, n};
  Tensor c = empty_as(a, cs);
  ops::call(ops::gemm, a, b, c, ta, tb, 1.0, 0.0);
  autograd::record_function("MatmulBackward", {a, b}, {&c}, {a, b},
                            [ta, tb](const Tensors& g, const Tensors& s, const Node& nd) {
    Tensor da, db;
    if (nd.needs_input_grad(0)) {
      da = empty_like(s[0]);
      if (!ta) ops::call(ops::gemm, g[0], s[1], da, false, !tb, 1.0, 0.0);
      else ops::call(ops::gemm, s[1], g[0], da, tb, true, 1.0, 0.0);
    }
    if (nd.needs_input_grad(1)) {
      db = empty_like(s[1]);
      if (!tb) ops::call(ops::gemm, s[0], g[0], db, !ta, false, 1.0, 0.0);
      else ops::call(ops::gemm, g[0], s[0], db, true, ta, 1.0, 0.0);
    }
    return Tensors{da, db};
  });
  return c;
}

Tensor linear(const Tensor& x_in, const Tensor& w, const Tensor& bias) {
  // Under autocast (Note [Autocast]): x and the weight's cached copy in its dtype, the
  // output too; the weight's and bias's gradients in theirs.
  const DType low = autograd::autocast_dtype();
  check_dim(w, 2, "linear", "weight");
  check_float(w, "linear", "weight");
  check_same(w, bias, "linear", "bias");
  const bool autocast = low != DType::f32 && is_floating(x_in.dtype());
  const Tensor x = autocast ? cast(x_in, low) : f32_input(x_in, "linear", "input");
  const Tensor wl = autocast ? autograd::autocast_weight(w) : w;
  if (!autocast) check_same(x, w, "linear", "weight");
  EG_CHECK(x.device() == w.device(), "linear: weight is on ", w.device().str(), " but the input is on ",
           x.device().str());
  EG_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input's last dimension is ", x.size(-1),
           " but the layer expects ", w.size(1), " features (input ", shape_str(x.shape()), ")");
  if (bias.defined()) EG_CHECK(bias.dim() == 1 && bias.size(0) == w.size(0), "linear: bias must be [", w.size(0), "]");
  Tensor x2 = x.detach().reshape({-1, w.size(1)});
  Tensor y2 = empty_as(x, {x2.size(0), w.size(0)});
  ops::call(ops::linear_fwd, x2, wl, bias, y2);
  Shape ys = x.shape();
  ys.back() = w.size(0);
  Tensor y = y2.reshape(ys);
  autograd::record_function(
      "LinearBackward", {x, w, bias}, {&y}, {x2, wl},
      [xs = x.shape(), has_bias = bias.defined(), wt = w.dtype()](const Tensors& g, const Tensors& s, const Node& n) {
    Tensor g2 = g[0].reshape({-1, s[1].size(0)});
    // dx added into its destination (the sum of an input several layers read: a layer
    // norm's output read by the attention's projections), seen as [M, K].
    Tensor dx, into_x;
    if (n.needs_input_grad(0)) into_x = destination_for(n, 0, xs, s[0].dtype(), s[0].device());
    if (into_x.defined() && into_x.is_blocked()) into_x = Tensor();  // its [M, K] view would be a copy
    if (n.needs_input_grad(0)) dx = into_x.defined() ? into_x.reshape(s[0].shape()) : empty_like(s[0]);
    bool into = false;  // the weight's and bias's gradients added into their .grad
    auto [dw, db] = param_grads(n, 1, n.needs_input_grad(1), s[1].shape(), 2, has_bias && n.needs_input_grad(2),
                                {s[1].size(0)}, wt, s[1].device(), into);
    ops::call(ops::linear_bwd, g2, s[0], s[1], dx, dw, db, into_x.defined(), into);
    return Tensors{into_x.defined() ? into_x : dx.defined() ? dx.reshape(xs) : dx, dw, db};
      });
  return y;
}

}  // namespace eg::fn
