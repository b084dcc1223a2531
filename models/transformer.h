// Transformer encoder-decoder (Vaswani et al. 2017), post-LN as in the paper:
// shared source/target embeddings scaled by sqrt(d) plus sinusoidal positions,
// N encoder layers (self-attention, FFN), N decoder layers (causal self-attention,
// cross-attention, FFN), each sub-layer wrapped as LN(x + Dropout(sublayer(x))), and
// an output projection tied to the embedding. transformer-base: 6+6 layers, d=512,
// 8 heads, FFN 2048; transformer-tiny: 2+2 layers of the same shape; transformer-small:
// 6+6 layers at half the width (d=256, 4 heads, FFN 1024), whose layers each cost a
// small share of a step, as the base model's do.
//
// Note [Freezing a Transformer]
// Layer modules, front to back: encoder.0 .. encoder.N-1, decoder.0 .. decoder.N-1,
// and last "embedding": the shared embedding, which is also the output projection (the
// head), and is never frozen. With the first k layer modules frozen (forward_frozen,
// Note [The frozen-prefix forward] in models/model.h)
// they run under no-grad, and so does the embedding lookup that feeds them: while any
// encoder layer is frozen the source-side embedding gets no gradient, and once decoder
// layers are frozen neither does the target side; the embedding keeps training through
// the output projection. That is what makes a frozen front cheap (no backward through
// it at all); keeping the embedding's gradient from the source side would need the
// whole backward through the frozen encoder.
#pragma once
#include <array>
#include "core/rng.h"
#include "layers/attention.h"
#include "models/model.h"

namespace eg::models {

struct TransformerConfig {
  int64_t vocab = 8000, d_model = 512, heads = 8, ffn = 2048, enc_layers = 6, dec_layers = 6, max_len = 256;
  double dropout = 0.1;
  int64_t pad_id = 0, bos_id = 1, eos_id = 2;
};
TransformerConfig transformer_preset(const std::string& name,
                                     int64_t vocab);  // "transformer-base" / "-small" / "-tiny"

class Transformer : public Model {
 public:
  Transformer(const TransformerConfig& c, Generator& g);
  // src [B, S], tgt_in [B, T] (s64 token ids; pad_id marks padding) -> logits [B, T, vocab].
  Tensor forward(const Tensor& src, const Tensor& tgt_in);
  // The same with layer modules [0, frozen) run under no-grad (Note [Freezing a
  // Transformer]), the captured outputs with their padding positions zeroed (Note
  // [Padding in a reading]).
  Tensor forward_frozen(const Tensor& src, const Tensor& tgt_in, int64_t frozen, Capture* capture = nullptr) override;
  // Layer module `layer`'s output with its padding positions zeroed, as the captured one
  // of forward_frozen.
  Tensor layer_output(const Tensor& src, const Tensor& tgt_in, int64_t layer) override;
  Tensor encode(const Tensor& src, Tensor& src_mask);
  Tensor decode(const Tensor& memory, const Tensor& src_mask, const Tensor& tgt_in);
  // Greedy decoding: [B, <= max_len] ids, starting after bos, stopping at eos (Note
  // [Incremental decoding] in models/transformer.cpp).
  std::vector<std::vector<int64_t>> greedy_decode(const Tensor& src, int64_t max_len);
  // The same from the encoder's output and source mask (encode's), made once for both the
  // loss and the decoding in evaluation.
  std::vector<std::vector<int64_t>> greedy_decode(const Tensor& memory, const Tensor& src_mask, int64_t max_len);
  std::vector<std::pair<std::string, nn::ModulePtr>> layer_modules() const override { return units_; }
  bool sequential() const override { return false; }
  double flops_per_sample() const override;  // per target token, at sequence length 32
  std::string type_name() const override { return "Transformer"; }
  const TransformerConfig& config() const { return cfg_; }

 private:
  Tensor embed(const Tensor& ids, int64_t first = 0);  // ids [B, T] at positions first .. first + T - 1
  Tensor padding_mask(const Tensor& ids) const;
  Tensor without_padding(const Tensor& h, const Tensor& ids) const;  // h [B, T, C] zero where ids is pad
  TransformerConfig cfg_;
  std::shared_ptr<nn::Embedding> embedding_;
  Tensor positions_;  // [max_len, d] sinusoids (buffer)
  std::vector<std::shared_ptr<nn::Module>> enc_, dec_;
  std::shared_ptr<nn::Dropout> drop_;
  std::vector<std::pair<std::string, nn::ModulePtr>> units_;
};

// Corpus BLEU-4 (Papineni et al.) with the brevity penalty, over token sequences; 0..100.
double corpus_bleu(const std::vector<std::vector<int64_t>>& hyps, const std::vector<std::vector<int64_t>>& refs);
// The same in two halves, so that shards of a corpus can be summed (data-parallel
// evaluation): the counts are the clipped n-gram matches and n-gram totals for n = 1..4,
// then the hypothesis and reference lengths; the counts of a corpus are the sums of its parts'.
using BleuCounts = std::array<double, 10>;
BleuCounts bleu_counts(const std::vector<std::vector<int64_t>>& hyps, const std::vector<std::vector<int64_t>>& refs);
double bleu_from_counts(const BleuCounts& c);

}  // namespace eg::models
