#include "layers/attention.h"

namespace eg::nn {

namespace {
// Differentiable swap of dims 1 and 2 of a 4-D tensor (its own adjoint).
Tensor swap12(const Tensor& x) {
  const Shape& s = x.shape();
  Tensor y = Tensor::empty({s[0], s[2], s[1], s[3]}, x.dtype(), x.device());
  ops::call(ops::swap12, x, y);
  autograd::record_function("Swap12Backward", {x}, {&y}, {},
                            [xs = s](const autograd::Tensors& g, const autograd::Tensors&, const autograd::Node&) {
    Tensor dx = Tensor::empty(xs, g[0].dtype(), g[0].device());
    ops::call(ops::swap12, g[0], dx);
    return autograd::Tensors{dx};
  });
  return y;
}
}  // namespace

Tensor split_heads(const Tensor& x, int64_t heads) {
  EG_CHECK(x.dim() == 3 && x.size(2) % heads == 0, "split_heads: expected [B, T, E] with E divisible by ", heads,
           ", got ", shape_str(x.shape()));
  return swap12(fn::reshape(x, {x.size(0), x.size(1), heads, x.size(2) / heads}));
}

Tensor merge_heads(const Tensor& x) {
  EG_CHECK(x.dim() == 4, "merge_heads: expected [B, H, T, Dh], got ", shape_str(x.shape()));
  Tensor y = swap12(x);  // [B, T, H, Dh]
  return fn::reshape(y, {y.size(0), y.size(1), y.size(2) * y.size(3)});
}

MultiHeadAttention::MultiHeadAttention(int64_t e, int64_t h, double dropout, Generator& g)
    : embed_dim(e), num_heads(h) {
  EG_CHECK(e > 0 && h > 0 && e % h == 0, "MultiHeadAttention: embed_dim ", e, " must be divisible by num_heads ", h);
  q_proj = register_module("q_proj", std::make_shared<Linear>(e, e, true, g));
  k_proj = register_module("k_proj", std::make_shared<Linear>(e, e, true, g));
  v_proj = register_module("v_proj", std::make_shared<Linear>(e, e, true, g));
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, true, g));
  attn_dropout = register_module("dropout", std::make_shared<Dropout>(dropout, g));
}

Tensor MultiHeadAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal) {
  EG_CHECK(q.dim() == 3 && q.size(2) == embed_dim, "MultiHeadAttention(", embed_dim, "): query must be [B, T, ",
           embed_dim, "], got ", shape_str(q.shape()));
  EG_CHECK(k.dim() == 3 && k.size(0) == q.size(0), "MultiHeadAttention: key/value must be [B, S, ", embed_dim,
           "] with the query's batch size");
  auto [kh, vh] = project_kv(k, v);
  return attend(q, kh, vh, mask, causal);
}

std::pair<Tensor, Tensor> MultiHeadAttention::project_kv(const Tensor& k, const Tensor& v) {
  EG_CHECK(k.dim() == 3 && k.size(2) == embed_dim && k.shape() == v.shape(), "MultiHeadAttention(", embed_dim,
           "): key/value must be [B, S, ", embed_dim, "], got ", shape_str(k.shape()), " and ", shape_str(v.shape()));
  return {split_heads(k_proj->forward(k), num_heads), split_heads(v_proj->forward(v), num_heads)};
}

Tensor MultiHeadAttention::attend(const Tensor& q, const Tensor& kh, const Tensor& vh, const Tensor& mask,
                                  bool causal) {
  Tensor qh = split_heads(q_proj->forward(q), num_heads);
  Tensor a = fn::scaled_dot_product_attention(qh, kh, vh, mask, causal);
  return attn_dropout->forward(out_proj->forward(merge_heads(a)));
}

// The cache is time-major so that appending a position is one contiguous copy; the
// heads' layout [B, H, t, Dh] is made from its first t rows at each step (two
// transposes of t x B x E values, against the t x B x E x E multiply-adds that
// recomputing the earlier positions' keys and values would take).
Tensor MultiHeadAttention::forward_step(const Tensor& x, KVCache& cache, int64_t capacity) {
  EG_CHECK(x.dim() == 3 && x.size(1) == 1 && x.size(2) == embed_dim, "MultiHeadAttention(", embed_dim,
           "): forward_step takes one position [B, 1, ", embed_dim, "], got ", shape_str(x.shape()));
  autograd::NoGradGuard ng;
  const int64_t b = x.size(0), t = cache.length + 1;
  EG_CHECK(t <= capacity, "MultiHeadAttention: forward_step past the cache's ", capacity, " positions");
  auto append = [&](Tensor& rows, const Tensor& row) {  // row [B, 1, E] -> rows[t - 1]
    if (!rows.defined()) rows = Tensor::empty({capacity, b, embed_dim}, row.dtype(), row.device());
    EG_CHECK(rows.size(1) == b && rows.size(0) == capacity && rows.dtype() == row.dtype(),
             "MultiHeadAttention: forward_step's batch, capacity or dtype changed within one cache");
    rows.slice(t - 1, t).copy_(row);
    // [t, B, E] -> [B, t, E] -> [B, H, t, Dh]
    Tensor bte = Tensor::empty({1, b, t, embed_dim}, rows.dtype(), rows.device());
    ops::call(ops::swap12, rows.slice(0, t).reshape({1, t, b, embed_dim}), bte);
    return split_heads(bte.reshape({b, t, embed_dim}), num_heads);
  };
  Tensor kh = append(cache.k, k_proj->forward(x)), vh = append(cache.v, v_proj->forward(x));
  cache.length = t;
  return attend(x, kh, vh);  // the new position sees every cached one: no mask
}

}  // namespace eg::nn
