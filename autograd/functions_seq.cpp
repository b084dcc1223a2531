// Differentiable softmax, cross-entropy, layer norm, embedding, dropout, attention.
#include "autograd/check.h"
#include "autograd/functions.h"

namespace eg::fn {

using namespace detail;
using autograd::Node;
using autograd::Tensors;

namespace {
Tensor softmax_impl(const Tensor& x_in, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  const Tensor x = f32_input(x_in, name, "input");
  EG_CHECK(x.dim() >= 1 && x.size(-1) > 0, name, ": input must have a non-empty last dimension");
  Tensor y = empty_like(x);
  ops::call(ops::softmax_fwd, x, y, log);
  autograd::record_function(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {x}, {&y}, {y.detach()},
                            [log](const Tensors& g, const Tensors& s, const Node&) {
    Tensor dx = empty_like(s[0]);
    ops::call(ops::softmax_bwd, g[0], s[0], dx, log);
    return Tensors{dx};
  });
  return y;
}
}  // namespace

Tensor softmax(const Tensor& x) { return softmax_impl(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_impl(x, true); }

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, double ls, int64_t ignore_index) {
  check_dim(logits_in, 2, "cross_entropy", "logits");
  const Tensor logits = f32_input(logits_in, "cross_entropy", "logits");
  check_dim(target, 1, "cross_entropy", "target");
  EG_CHECK(target.dtype() == DType::s64, "cross_entropy: target must be s64 class indices, got ",
           dtype_name(target.dtype()));
  EG_CHECK(target.size(0) == logits.size(0), "cross_entropy: ", logits.size(0), " rows of logits but ", target.size(0),
           " targets");
  EG_CHECK(ls >= 0 && ls < 1, "cross_entropy: label_smoothing must be in [0, 1), got ", ls);
  EG_CHECK(target.device() == logits.device(), "cross_entropy: target is on ", target.device().str(),
           " but logits are on ", logits.device().str());
  if (target.device().is_cpu()) {
    const int64_t* t = target.data<int64_t>();
    for (int64_t i = 0; i < target.numel(); ++i)
      EG_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < logits.size(1)), "cross_entropy: target ", t[i], " at row ",
               i, " is not a class index in [0, ", logits.size(1), ")");
  }
  ops::CrossEntropyParams p{ls, ignore_index};
  Tensor loss = empty_as(logits, {1}), lse = empty_as(logits, {logits.size(0)});
  ops::call(ops::cross_entropy_fwd, logits, target, loss, lse, p);
  autograd::record_function("CrossEntropyBackward", {logits}, {&loss}, {logits.detach(), target, lse},
                            [p](const Tensors& g, const Tensors& s, const Node&) {
    Tensor dl = empty_like(s[0]);
    ops::call(ops::cross_entropy_bwd, g[0], s[0], s[1], s[2], dl, p);
    return Tensors{dl};
  });
  return loss;
}

Tensor layer_norm(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, double eps) {
  const Tensor x = f32_input(x_in, "layer_norm", "input");
  check_same(x, gamma, "layer_norm", "weight");
  check_same(x, beta, "layer_norm", "bias");
  const int64_t d = x.size(-1);
  EG_CHECK(gamma.numel() == d && beta.numel() == d, "layer_norm: input's last dimension is ", d,
           " but the weight/bias have ", gamma.numel(), "/", beta.numel(), " elements");
  Tensor x2 = x.detach().reshape({-1, d});
  Tensor y = empty_like(x), mean = empty_as(x, {x2.size(0)}), rstd = empty_as(x, {x2.size(0)});
  Tensor y2 = y.reshape({-1, d});
  ops::call(ops::layernorm_fwd, x2, gamma, beta, y2, mean, rstd, eps);
  autograd::record_function("LayerNormBackward", {x, gamma, beta}, {&y}, {x2, gamma, mean, rstd},
                            [xs = x.shape()](const Tensors& g, const Tensors& s, const Node& n) {
    Tensor dx;
    if (n.needs_input_grad(0)) dx = empty_like(s[0]);
    bool into = false;  // gamma's and beta's gradients added into their .grad
    auto [dg, db] = param_grads(n, 1, n.needs_input_grad(1), s[1].shape(), 2, n.needs_input_grad(2), s[1].shape(),
                                s[1].dtype(), s[1].device(), into);
    ops::call(ops::layernorm_bwd, g[0].reshape(s[0].shape()), s[0], s[1], s[2], s[3], dx, dg, db, into);
    return Tensors{dx.defined() ? dx.reshape(xs) : dx, dg, db};
  });
  return y;
}

Tensor embedding(const Tensor& ids, const Tensor& table) {
  check_defined(ids, "embedding", "ids");
  check_dim(table, 2, "embedding", "table");
  EG_CHECK(ids.dtype() == DType::s64, "embedding: ids must be s64, got ", dtype_name(ids.dtype()));
  EG_CHECK(ids.device() == table.device(), "embedding: ids are on ", ids.device().str(), " but the table is on ",
           table.device().str());
  if (ids.device().is_cpu()) {
    const int64_t* p = ids.data<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i)
      EG_CHECK(p[i] >= 0 && p[i] < table.size(0), "embedding: id ", p[i], " at position ", i,
               " is outside the vocabulary [0, ", table.size(0), ")");
  }
  Shape ys = ids.shape();
  ys.push_back(table.size(1));
  Tensor y = empty_as(table, ys);
  ops::call(ops::embedding_fwd, ids, table, y);
  autograd::record_function("EmbeddingBackward", {ids, table}, {&y}, {ids, table.detach()},
                            [](const Tensors& g, const Tensors& s, const Node& n) {
    Tensor dt = destination_for(n, 1, s[1].shape(), s[1].dtype(), s[1].device());  // the table's .grad
    const bool into = dt.defined();
    if (!into) dt = empty_like(s[1]);
    ops::call(ops::embedding_bwd, g[0], s[0], dt, into);
    return Tensors{Tensor(), dt};
  });
  return y;
}

Tensor dropout(const Tensor& x_in, double p, bool training, Generator& gen) {
  EG_CHECK(p >= 0 && p < 1, "dropout: probability must be in [0, 1), got ", p);
  if (!training || p == 0) return x_in;
  // 16-bit activations stay so (as under torch.autocast, which lists no dtype for dropout).
  const Tensor x = is_half(x_in.dtype()) ? x_in : f32_input(x_in, "dropout", "input");
  Tensor y = empty_like(x), mask = Tensor::empty(x.shape(), DType::u8, x.device());
  // Counted from the step's base, on the device with the seed (Note [Random state on the
  // device] in core/rng.h).
  const uint64_t offset = gen.reserve(uint64_t(x.numel())) - gen.step_base();
  ops::call(ops::dropout_fwd, x, y, mask, p, gen.state_on(x.device()), offset);
  autograd::record_function("DropoutBackward", {x}, {&y}, {mask}, [p](const Tensors& g, const Tensors& s, const Node&) {
    Tensor dx = empty_like(g[0]);
    ops::call(ops::dropout_bwd, g[0], s[0], dx, p);
    return Tensors{dx};
  });
  return y;
}

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& mask,
                                    bool causal, double scale) {
  check_dim(q_in, 4, "attention", "query");
  check_dim(k_in, 4, "attention", "key");
  check_dim(v_in, 4, "attention", "value");
  const Tensor q = f32_input(q_in, "attention", "query"), k = f32_input(k_in, "attention", "key"),
               v = f32_input(v_in, "attention", "value");
  check_same(q, k, "attention", "key");
  check_same(q, v, "attention", "value");
  EG_CHECK(k.shape() == v.shape(), "attention: key ", shape_str(k.shape()), " and value ", shape_str(v.shape()),
           " differ");
  EG_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), "attention: query ",
           shape_str(q.shape()), " does not match key ", shape_str(k.shape()), " in batch, heads or head size");
  EG_CHECK(!causal || q.size(2) == k.size(2), "attention: a causal mask needs equal query and key lengths");
  if (mask.defined())
    EG_CHECK(mask.dtype() == DType::u8 && mask.dim() == 2 && mask.size(0) == q.size(0) && mask.size(1) == k.size(2),
             "attention: key padding mask must be u8 [", q.size(0), ", ", k.size(2), "], got ",
             dtype_name(mask.dtype()), shape_str(mask.shape()));
  ops::AttentionParams p{causal, scale};
  Tensor out = empty_like(q), lse = empty_as(q, {q.size(0), q.size(1), q.size(2)});
  ops::call(ops::attention_fwd, q, k, v, mask, out, lse, p);
  autograd::record_function("AttentionBackward", {q, k, v}, {&out}, {q, k, v, mask, out.detach(), lse},
                            [p](const Tensors& g, const Tensors& s, const Node& n) {
    Tensor dq = empty_like(s[0]), dk = empty_like(s[1]), dv = empty_like(s[2]);
    ops::call(ops::attention_bwd, g[0], s[0], s[1], s[2], s[3], s[4], s[5], dq, dk, dv, p);
    return Tensors{n.needs_input_grad(0) ? dq : Tensor(), n.needs_input_grad(1) ? dk : Tensor(),
                   n.needs_input_grad(2) ? dv : Tensor()};
  });
  return out;
}

}  // namespace eg::fn
