#include "models/transformer.h"

#include <cmath>
#include <map>

namespace eg::models {

namespace {

class FeedForward : public nn::Module {
 public:
  FeedForward(int64_t d, int64_t ff, double p, Generator& g) {
    l1 = register_module("linear1", std::make_shared<nn::Linear>(d, ff, true, g));
    l2 = register_module("linear2", std::make_shared<nn::Linear>(ff, d, true, g));
    drop = register_module("dropout", std::make_shared<nn::Dropout>(p, g));
  }
  Tensor forward(const Tensor& x) override { return l2->forward(drop->forward(fn::relu(l1->forward(x)))); }
  std::string type_name() const override { return "FeedForward"; }
  std::shared_ptr<nn::Linear> l1, l2;
  std::shared_ptr<nn::Dropout> drop;
};

class EncoderLayer : public nn::Module {
 public:
  EncoderLayer(const TransformerConfig& c, Generator& g) {
    attn = register_module("self_attn", std::make_shared<nn::MultiHeadAttention>(c.d_model, c.heads, c.dropout, g));
    ffn = register_module("ffn", std::make_shared<FeedForward>(c.d_model, c.ffn, c.dropout, g));
    ln1 = register_module("norm1", std::make_shared<nn::LayerNorm>(c.d_model));
    ln2 = register_module("norm2", std::make_shared<nn::LayerNorm>(c.d_model));
    drop = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, g));
  }
  Tensor run(const Tensor& x, const Tensor& mask) {
    Tensor h = ln1->forward(fn::add(x, drop->forward(attn->forward(x, x, x, mask, false))));
    return ln2->forward(fn::add(h, drop->forward(ffn->forward(h))));
  }
  std::string type_name() const override { return "EncoderLayer"; }
  std::shared_ptr<nn::MultiHeadAttention> attn;
  std::shared_ptr<FeedForward> ffn;
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<nn::Dropout> drop;
};

class DecoderLayer : public nn::Module {
 public:
  DecoderLayer(const TransformerConfig& c, Generator& g) {
    self_attn =
        register_module("self_attn", std::make_shared<nn::MultiHeadAttention>(c.d_model, c.heads, c.dropout, g));
    cross_attn =
        register_module("cross_attn", std::make_shared<nn::MultiHeadAttention>(c.d_model, c.heads, c.dropout, g));
    ffn = register_module("ffn", std::make_shared<FeedForward>(c.d_model, c.ffn, c.dropout, g));
    ln1 = register_module("norm1", std::make_shared<nn::LayerNorm>(c.d_model));
    ln2 = register_module("norm2", std::make_shared<nn::LayerNorm>(c.d_model));
    ln3 = register_module("norm3", std::make_shared<nn::LayerNorm>(c.d_model));
    drop = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, g));
  }
  Tensor run(const Tensor& y, const Tensor& memory, const Tensor& src_mask, const Tensor& tgt_mask) {
    Tensor h = ln1->forward(fn::add(y, drop->forward(self_attn->forward(y, y, y, tgt_mask, true))));
    h = ln2->forward(fn::add(h, drop->forward(cross_attn->forward(h, memory, memory, src_mask, false))));
    return ln3->forward(fn::add(h, drop->forward(ffn->forward(h))));
  }
  // run() at one new position y [B, 1, E] (Note [Incremental decoding]): the self-attention
  // over the earlier positions' keys and values in `cache`, the cross-attention over the
  // memory's (projected once: mem_kh, mem_vh).
  Tensor run_step(const Tensor& y, nn::KVCache& cache, int64_t capacity, const Tensor& mem_kh, const Tensor& mem_vh,
                  const Tensor& src_mask) {
    Tensor h = ln1->forward(fn::add(y, drop->forward(self_attn->forward_step(y, cache, capacity))));
    h = ln2->forward(fn::add(h, drop->forward(cross_attn->attend(h, mem_kh, mem_vh, src_mask, false))));
    return ln3->forward(fn::add(h, drop->forward(ffn->forward(h))));
  }
  std::string type_name() const override { return "DecoderLayer"; }
  std::shared_ptr<nn::MultiHeadAttention> self_attn, cross_attn;
  std::shared_ptr<FeedForward> ffn;
  std::shared_ptr<nn::LayerNorm> ln1, ln2, ln3;
  std::shared_ptr<nn::Dropout> drop;
};

}  // namespace

TransformerConfig transformer_preset(const std::string& name, int64_t vocab) {
  TransformerConfig c;
  c.vocab = vocab;
  if (name == "transformer-base") return c;
  if (name == "transformer-tiny") {
    c.enc_layers = c.dec_layers = 2;
    return c;
  }
  if (name == "transformer-small") {  // the base model's depth at half its width
    c.d_model = 256, c.heads = 4, c.ffn = 1024;
    return c;
  }
  EG_THROW("unknown transformer preset '", name, "' (transformer-base, transformer-small, transformer-tiny)");
}

Transformer::Transformer(const TransformerConfig& c, Generator& g) : cfg_(c) {
  EG_CHECK(c.vocab > 3 && c.d_model % 2 == 0 && c.max_len > 0, "Transformer: bad configuration (vocab ", c.vocab,
           ", d_model ", c.d_model, ")");
  embedding_ = register_module("embedding", std::make_shared<nn::Embedding>(c.vocab, c.d_model, g));
  {  // N(0, d^-1/2) so that the sqrt(d) scaling yields unit-variance inputs
    Tensor w = Tensor::randn({c.vocab, c.d_model}, g);
    float* p = w.data<float>();
    for (int64_t i = 0; i < w.numel(); ++i) p[i] *= float(1.0 / std::sqrt(double(c.d_model)));
    embedding_->weight.copy_(w);
  }
  Tensor pos = Tensor::empty({c.max_len, c.d_model});
  for (int64_t t = 0; t < c.max_len; ++t)
    for (int64_t i = 0; i < c.d_model / 2; ++i) {
      double a = double(t) / std::pow(10000.0, 2.0 * double(i) / double(c.d_model));
      pos.data<float>()[t * c.d_model + 2 * i] = float(std::sin(a));
      pos.data<float>()[t * c.d_model + 2 * i + 1] = float(std::cos(a));
    }
  positions_ = register_buffer("positions", pos);
  drop_ = register_module("dropout", std::make_shared<nn::Dropout>(c.dropout, g));
  for (int64_t i = 0; i < c.enc_layers; ++i) {
    auto l = register_module("encoder." + std::to_string(i), std::make_shared<EncoderLayer>(c, g));
    enc_.push_back(l);
    units_.emplace_back("encoder." + std::to_string(i), l);
  }
  for (int64_t i = 0; i < c.dec_layers; ++i) {
    auto l = register_module("decoder." + std::to_string(i), std::make_shared<DecoderLayer>(c, g));
    dec_.push_back(l);
    units_.emplace_back("decoder." + std::to_string(i), l);
  }
  units_.emplace_back("embedding", embedding_);  // also the output projection: the head
}

Tensor Transformer::padding_mask(const Tensor& ids) const {
  Tensor m = Tensor::empty(ids.shape(), DType::u8, ids.device());
  ops::call(ops::token_mask, ids, m, cfg_.pad_id, true);
  return m;
}

// Note [Padding in a reading]
// Egeria compares a layer module's output in the training and the reference model through
// the Gram matrix of the batch's flattened outputs. A padding position's output is
// whatever the layer makes of a pad token; it never reaches a real token (attention masks
// it), but it would enter the Gram, so the same sentences padded to another length would
// read differently. The outputs Egeria compares (the captured one, layer_output) have
// their padding positions zeroed: the flattened rows then hold the real tokens' values
// and zeros, and a longer padding adds only zeros. The int8 reference quantises each
// token from its own range (Note [Per-token activation scales] in quant/int8.h), so its
// padding does not move the real tokens' scales either.
Tensor Transformer::without_padding(const Tensor& h, const Tensor& ids) const {
  // 1 at real tokens, 0 at padding, as f32 [B, T, 1], made on the ids' device.
  Tensor real = Tensor::empty(ids.shape(), DType::u8, ids.device());
  ops::call(ops::token_mask, ids, real, cfg_.pad_id, false);
  Tensor keep = Tensor::empty({ids.size(0), ids.size(1), 1}, DType::f32, ids.device());
  ops::call(ops::cast, real.reshape(keep.shape()), keep);
  return fn::mul(h, keep);
}

Tensor Transformer::embed(const Tensor& ids, int64_t first) {
  EG_CHECK(ids.dim() == 2 && ids.dtype() == DType::s64, "Transformer: token ids must be s64 [B, T], got ",
           dtype_name(ids.dtype()), shape_str(ids.shape()));
  EG_CHECK(first + ids.size(1) <= cfg_.max_len, "Transformer: sequence of ", first + ids.size(1),
           " tokens exceeds max_len ", cfg_.max_len);
  Tensor e = fn::scale(embedding_->forward(ids), std::sqrt(double(cfg_.d_model)));
  Tensor pos = positions_.slice(first, first + ids.size(1)).reshape({1, ids.size(1), cfg_.d_model});
  return drop_->forward(fn::add(e, pos));
}

Tensor Transformer::encode(const Tensor& src, Tensor& src_mask) {
  src_mask = padding_mask(src);
  Tensor h = embed(src);
  for (auto& l : enc_) h = static_cast<EncoderLayer&>(*l).run(h, src_mask);
  return h;
}

Tensor Transformer::decode(const Tensor& memory, const Tensor& src_mask, const Tensor& tgt_in) {
  Tensor tgt_mask = padding_mask(tgt_in), h = embed(tgt_in);
  for (auto& l : dec_) h = static_cast<DecoderLayer&>(*l).run(h, memory, src_mask, tgt_mask);
  return fn::linear(h, embedding_->weight, Tensor());  // tied output projection
}

Tensor Transformer::forward(const Tensor& src, const Tensor& tgt_in) {
  Tensor src_mask;
  Tensor memory = encode(src, src_mask);
  return decode(memory, src_mask, tgt_in);
}

Tensor Transformer::forward_frozen(const Tensor& src, const Tensor& tgt_in, int64_t frozen, Capture* capture) {
  const int64_t ne = int64_t(enc_.size()), nd = int64_t(dec_.size());
  EG_CHECK(frozen >= 0 && frozen <= ne + nd, "Transformer: ", frozen, " frozen layer modules, but only the ", ne + nd,
           " encoder and decoder layers can freeze (the embedding is the head)");
  if (frozen == 0 && !(capture && capture->any())) return forward(src, tgt_in);
  // Runs f under no-grad when `off`.
  auto maybe_no_grad = [](bool off, auto&& f) {
    if (!off) return f();
    autograd::NoGradGuard ng;
    return f();
  };
  auto keep = [&](int64_t layer, const Tensor& h) {  // See Note [Padding in a reading]
    if (capture && capture->wants(layer))
      capture->keep(layer, without_padding(h.detach(), layer < ne ? src : tgt_in));
  };
  const Tensor src_mask = padding_mask(src), tgt_mask = padding_mask(tgt_in);
  Tensor h = maybe_no_grad(frozen > 0, [&] { return embed(src); });
  for (int64_t i = 0; i < ne; ++i) {
    h = maybe_no_grad(i < frozen, [&] { return static_cast<EncoderLayer&>(*enc_[size_t(i)]).run(h, src_mask); });
    keep(i, h);
  }
  const Tensor memory = h;
  h = maybe_no_grad(frozen > ne, [&] { return embed(tgt_in); });
  for (int64_t j = 0; j < nd; ++j) {
    h = maybe_no_grad(ne + j < frozen,
                      [&] { return static_cast<DecoderLayer&>(*dec_[size_t(j)]).run(h, memory, src_mask, tgt_mask); });
    keep(ne + j, h);
  }
  return fn::linear(h, embedding_->weight, Tensor());
}

Tensor Transformer::layer_output(const Tensor& src, const Tensor& tgt_in, int64_t layer) {
  const int64_t ne = int64_t(enc_.size()), nd = int64_t(dec_.size());
  EG_CHECK(layer >= 0 && layer <= ne + nd, "Transformer: no layer module ", layer, " (it has ", ne + nd + 1, ")");
  autograd::NoGradGuard ng;
  const Tensor src_mask = padding_mask(src);
  Tensor h = embed(src);
  for (int64_t i = 0; i < ne && i <= layer; ++i) h = static_cast<EncoderLayer&>(*enc_[size_t(i)]).run(h, src_mask);
  if (layer < ne) return without_padding(h, src);  // See Note [Padding in a reading]
  EG_CHECK(tgt_in.defined(), "Transformer: the output of decoder layer ", layer - ne, " needs the target input ids");
  const Tensor memory = h, tgt_mask = padding_mask(tgt_in);
  h = embed(tgt_in);
  for (int64_t j = 0; j < nd && ne + j <= layer; ++j)
    h = static_cast<DecoderLayer&>(*dec_[size_t(j)]).run(h, memory, src_mask, tgt_mask);
  return without_padding(layer == ne + nd ? fn::linear(h, embedding_->weight, Tensor()) : h, tgt_in);
}

// Note [Incremental decoding]
// Greedy decoding feeds each token back one position at a time. Run as training runs,
// over the whole prefix at every token, its cost grows with the square of the length, and
// it projects every position onto the vocabulary to use the last. Positions only look
// back (causal self-attention; layer norm, the FFN and the projection are per position),
// so the new position's output is all a step needs: each decoder layer keeps its
// self-attention's keys and values of the earlier positions (nn::KVCache), the memory's
// keys and values are projected once per batch, and only the new position is projected
// onto the vocabulary, as fairseq's and Hugging Face's incremental decoders do. Its
// logits are the full recomputation's up to rounding
// (Models.TransformerIncrementalDecodingPicksTheTokensOfTheFullRecomputation).
// A row is done at eos, or at a pad token (its output ends there either way); done rows
// are fed pad until the batch is done, and their outputs are ignored.
std::vector<std::vector<int64_t>> Transformer::greedy_decode(const Tensor& src, int64_t max_len) {
  autograd::NoGradGuard ng;
  Tensor src_mask;
  const Tensor memory = encode(src, src_mask);
  return greedy_decode(memory, src_mask, max_len);
}

std::vector<std::vector<int64_t>> Transformer::greedy_decode(const Tensor& memory, const Tensor& src_mask,
                                                             int64_t max_len) {
  autograd::NoGradGuard ng;
  EG_CHECK(memory.dim() == 3 && memory.size(2) == cfg_.d_model, "Transformer: greedy_decode's memory must be [B, S, ",
           cfg_.d_model, "], got ", shape_str(memory.shape()));
  const int64_t b = memory.size(0);
  max_len = std::min(max_len, cfg_.max_len - 1);
  std::vector<std::pair<Tensor, Tensor>> mem_kv;
  for (auto& l : dec_) mem_kv.push_back(static_cast<DecoderLayer&>(*l).cross_attn->project_kv(memory, memory));
  std::vector<nn::KVCache> caches(dec_.size());
  std::vector<std::vector<int64_t>> seq(size_t(b), std::vector<int64_t>{cfg_.bos_id});
  std::vector<bool> done(size_t(b), false);
  for (int64_t t = 0; t < max_len; ++t) {
    std::vector<int64_t> last;
    for (auto& s : seq) last.push_back(s.back());
    Tensor h = embed(Tensor::from_vector(last, {b, 1}, memory.device()), t);
    for (size_t j = 0; j < dec_.size(); ++j)
      h = static_cast<DecoderLayer&>(*dec_[j]).run_step(h, caches[j], max_len, mem_kv[j].first, mem_kv[j].second,
                                                        src_mask);
    const std::vector<int64_t> best = fn::argmax(fn::linear(h, embedding_->weight, Tensor())).to_vector<int64_t>();
    bool all = true;
    for (int64_t i = 0; i < b; ++i) {
      int64_t next = cfg_.pad_id;
      if (!done[size_t(i)]) {
        next = best[size_t(i)];
        if (next == cfg_.eos_id || next == cfg_.pad_id) done[size_t(i)] = true;
      }
      seq[size_t(i)].push_back(next);
      all = all && done[size_t(i)];
    }
    if (all) break;
  }
  for (auto& s : seq) {  // strip bos, stop at eos
    std::vector<int64_t> out;
    for (size_t k = 1; k < s.size() && s[k] != cfg_.eos_id && s[k] != cfg_.pad_id; ++k) out.push_back(s[k]);
    s = out;
  }
  return seq;
}

double Transformer::flops_per_sample() const {
  // Per target token with source and target length L = 32: linear layers 2 * weights,
  // attention scores and mixing 4 * L * d per attention.
  const double d = double(cfg_.d_model), f = double(cfg_.ffn), L = 32;
  double enc = 2 * (4 * d * d + 2 * d * f) + 4 * L * d;
  double dec = 2 * (8 * d * d + 2 * d * f) + 8 * L * d;
  return double(cfg_.enc_layers) * enc + double(cfg_.dec_layers) * dec + 2 * d * double(cfg_.vocab);
}

BleuCounts bleu_counts(const std::vector<std::vector<int64_t>>& hyps, const std::vector<std::vector<int64_t>>& refs) {
  EG_CHECK(hyps.size() == refs.size(), "corpus_bleu: ", hyps.size(), " hypotheses for ", refs.size(), " references");
  BleuCounts c{};  // match[4], total[4], hyp_len, ref_len
  for (size_t s = 0; s < hyps.size(); ++s) {
    const auto &h = hyps[s], &r = refs[s];
    c[8] += double(h.size());
    c[9] += double(r.size());
    for (size_t n = 1; n <= 4; ++n) {
      std::map<std::vector<int64_t>, int> rc;
      for (size_t i = 0; i + n <= r.size(); ++i)
        ++rc[std::vector<int64_t>(r.begin() + long(i), r.begin() + long(i + n))];
      for (size_t i = 0; i + n <= h.size(); ++i) {
        auto it = rc.find(std::vector<int64_t>(h.begin() + long(i), h.begin() + long(i + n)));
        if (it != rc.end() && it->second > 0) {
          --it->second;
          ++c[n - 1];
        }
        ++c[n + 3];
      }
    }
  }
  return c;
}

double bleu_from_counts(const BleuCounts& c) {
  const double hyp_len = c[8], ref_len = c[9];
  if (hyp_len == 0) return 0;
  double log_p = 0;
  for (int n = 0; n < 4; ++n) {
    if (c[size_t(n)] == 0) return 0;
    log_p += 0.25 * std::log(c[size_t(n)] / c[size_t(n) + 4]);
  }
  double bp = hyp_len < ref_len ? std::exp(1 - ref_len / hyp_len) : 1.0;
  return 100.0 * bp * std::exp(log_p);
}

double corpus_bleu(const std::vector<std::vector<int64_t>>& hyps, const std::vector<std::vector<int64_t>>& refs) {
  return bleu_from_counts(bleu_counts(hyps, refs));
}

}  // namespace eg::models
