// Transformer encoder-decoder (Vaswani et al. 2017), post-LN as in the paper:
// shared source/target embeddings scaled by sqrt(d) plus sinusoidal positions,
// N encoder layers (self-attention, FFN), N decoder layers (causal self-attention,
// cross-attention, FFN), each sub-layer wrapped as LN(x + Dropout(sublayer(x))), and
// an output projection tied to the embedding. transformer-base: 6+6 layers, d=512,
// 8 heads, FFN 2048; transformer-tiny: 2+2 layers of the same shape.
#pragma once
#include "core/rng.h"
#include "layers/attention.h"
#include "models/model.h"

namespace eg::models {

struct TransformerConfig {
  int64_t vocab = 8000, d_model = 512, heads = 8, ffn = 2048, enc_layers = 6, dec_layers = 6, max_len = 256;
  double dropout = 0.1;
  int64_t pad_id = 0, bos_id = 1, eos_id = 2;
};
TransformerConfig transformer_preset(const std::string& name, int64_t vocab);  // "transformer-base" / "-tiny"

class Transformer : public Model {
 public:
  Transformer(const TransformerConfig& c, Generator& g);
  // src [B, S], tgt_in [B, T] (s64 token ids; pad_id marks padding) -> logits [B, T, vocab].
  Tensor forward(const Tensor& src, const Tensor& tgt_in);
  Tensor encode(const Tensor& src, Tensor& src_mask);
  Tensor decode(const Tensor& memory, const Tensor& src_mask, const Tensor& tgt_in);
  // Greedy decoding: [B, <= max_len] ids, starting after bos, stopping at eos.
  std::vector<std::vector<int64_t>> greedy_decode(const Tensor& src, int64_t max_len);
  std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const override { return units_; }
  bool sequential() const override { return false; }
  double flops_per_sample() const override;  // per target token, at sequence length 32
  std::string type_name() const override { return "Transformer"; }
  const TransformerConfig& config() const { return cfg_; }

 private:
  Tensor embed(const Tensor& ids);
  Tensor padding_mask(const Tensor& ids) const;
  TransformerConfig cfg_;
  std::shared_ptr<nn::Embedding> embedding_;
  Tensor positions_;  // [max_len, d] sinusoids (buffer)
  std::vector<std::shared_ptr<nn::Module>> enc_, dec_;
  std::shared_ptr<nn::Dropout> drop_;
  std::vector<std::pair<std::string, nn::ModulePtr>> units_;
};

// Corpus BLEU-4 (Papineni et al.) with the brevity penalty, over token sequences; 0..100.
double corpus_bleu(const std::vector<std::vector<int64_t>>& hyps, const std::vector<std::vector<int64_t>>& refs);

}  // namespace eg::models
