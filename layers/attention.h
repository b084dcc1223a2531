// Multi-head attention (Vaswani et al.): q/k/v/out projections around scaled
// dot-product attention. Inputs are [B, T, E]; heads are split to [B, H, T, Dh].
#pragma once
#include "layers/layers.h"

namespace eg::nn {

class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, Generator& g = default_generator());
  // query [B, T, E], key/value [B, S, E]; key_padding_mask u8 [B, S] (1 = padding) or
  // undefined; causal masks future keys (T == S).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = Tensor(),
                 bool causal = false);
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }  // self-attention
  std::string type_name() const override { return "MultiHeadAttention"; }
  int64_t embed_dim, num_heads;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
  std::shared_ptr<Dropout> attn_dropout;
};

// [B, T, H*Dh] <-> [B, H, T, Dh], differentiable.
Tensor split_heads(const Tensor& x, int64_t heads);
Tensor merge_heads(const Tensor& x);

}  // namespace eg::nn
