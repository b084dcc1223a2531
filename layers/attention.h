// Multi-head attention (Vaswani et al.): q/k/v/out projections around scaled
// dot-product attention. Inputs are [B, T, E]; heads are split to [B, H, T, Dh].
#pragma once
#include <utility>
#include "layers/layers.h"

namespace eg::nn {

// The keys and values of the positions a self-attention has seen so far, for decoding
// one position at a time (MultiHeadAttention::forward_step): after the projections,
// time-major [capacity, B, E], so that a new position's row is written in place.
struct KVCache {
  Tensor k, v;
  int64_t length = 0;  // positions held
};

class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, Generator& g = default_generator());
  // query [B, T, E], key/value [B, S, E]; key_padding_mask u8 [B, S] (1 = padding) or
  // undefined; causal masks future keys (T == S).
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = Tensor(),
                 bool causal = false);
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }  // self-attention
  // key/value [B, S, E] projected and split into heads: ([B, H, S, Dh], [B, H, S, Dh]).
  std::pair<Tensor, Tensor> project_kv(const Tensor& key, const Tensor& value);
  // forward's attention of query [B, T, E] over keys and values project_kv made.
  Tensor attend(const Tensor& query, const Tensor& kh, const Tensor& vh, const Tensor& key_padding_mask = Tensor(),
                bool causal = false);
  // Causal self-attention of one new position x [B, 1, E] over the positions in `cache`
  // and itself, as forward(x, x, x, {}, true) over all of them would give at the last;
  // x's key and value join the cache, which holds at most `capacity` positions. For
  // inference: nothing is recorded for autograd.
  Tensor forward_step(const Tensor& x, KVCache& cache, int64_t capacity);
  std::string type_name() const override { return "MultiHeadAttention"; }
  int64_t embed_dim, num_heads;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, out_proj;
  std::shared_ptr<Dropout> attn_dropout;
};

// [B, T, H*Dh] <-> [B, H, T, Dh], differentiable.
Tensor split_heads(const Tensor& x, int64_t heads);
Tensor merge_heads(const Tensor& x);

}  // namespace eg::nn
