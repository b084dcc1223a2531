#include "train/translation_task.h"

#include <cstdio>
#include <unordered_map>

#include "autograd/node.h"
#include "core/parallel.h"
#include "train/checkpoint.h"
#include "train/freezing.h"

namespace eg::train {

using json = nlohmann::json;

namespace {

constexpr int64_t kEvalBatch = 64;
// Greedy decoding stops at eos, or at 1.2 x the source length + 10 tokens. A trained model
// emits eos long before; the bound caps the cost of an untrained one.
int64_t decode_limit(int64_t src_len) { return src_len + src_len / 5 + 10; }

// The longest training batch's length: --max-len tokens (eos or bos included), padded.
int64_t padded_len(const TrainConfig& c) { return data::padded_length(c.max_len, c.pad_to_multiple); }

std::vector<data::SentencePair> read_split(const std::string& dir, const std::string& name, int64_t limit) {
  const std::string p = dir + "/" + name + ".tsv";
  EG_CHECK(file_exists(p), "cannot open '", p, "': no such file. Run `tools/get-data datasets` for the English-",
           "Spanish pairs (datasets/en-es), or pass --data-dir DIR holding train.tsv, valid.tsv and test.tsv");
  auto pairs = data::read_tsv_pairs(p);
  if (limit > 0 && limit < int64_t(pairs.size())) pairs.resize(size_t(limit));
  return pairs;
}

TextSplit make_split(const std::vector<data::SentencePair>& pairs, const data::Tokenizer& tok, int64_t max_len,
                     bool train) {
  // Training drops pairs longer than max_len; evaluation cuts them, so every sentence counts.
  auto t = std::make_shared<data::TokenizedPairs>(data::tokenize_pairs(pairs, tok, max_len, train));
  EG_CHECK(t->size() > 0, "every sentence pair is longer than --max-len ", max_len, " tokens");
  TextSplit s;
  for (int64_t o : t->origin) s.refs.push_back(pairs[size_t(o)].tgt);
  s.pairs = std::move(t);
  return s;
}

// BLEU is computed on detokenised text (the tokenizer's decode), split into words at
// spaces after ASCII punctuation is split off as words of its own (roughly sacreBLEU's
// 13a tokenisation), case-sensitive. Unlike BLEU on SentencePiece pieces it does not
// depend on the vocabulary, so runs with different --vocab-size compare.
std::vector<std::string> bleu_words(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) w.push_back(cur);
    cur.clear();
  };
  for (char ch : s) {
    if (ch == ' ' || ch == '\t' || ch == '\n') {
      flush();
    } else if (std::string(".,;:!?\"()[]{}").find(ch) != std::string::npos) {
      flush();
      w.emplace_back(1, ch);
    } else {
      cur += ch;
    }
  }
  flush();
  return w;
}

models::BleuCounts text_bleu_counts(const std::vector<std::string>& hyps, const std::vector<std::string>& refs) {
  std::unordered_map<std::string, int64_t> vocab;
  auto ids = [&](const std::string& s) {
    std::vector<int64_t> v;
    for (auto& w : bleu_words(s)) v.push_back(vocab.emplace(w, int64_t(vocab.size())).first->second);
    return v;
  };
  std::vector<std::vector<int64_t>> h, r;
  for (size_t i = 0; i < hyps.size(); ++i) {
    h.push_back(ids(hyps[i]));
    r.push_back(ids(refs[i]));
  }
  return models::bleu_counts(h, r);
}

}  // namespace

json arch_json(const models::TransformerConfig& a) {
  return {{"vocab", a.vocab},           {"d_model", a.d_model},       {"heads", a.heads},     {"ffn", a.ffn},
          {"enc_layers", a.enc_layers}, {"dec_layers", a.dec_layers}, {"max_len", a.max_len}, {"dropout", a.dropout},
          {"pad_id", a.pad_id},         {"bos_id", a.bos_id},         {"eos_id", a.eos_id}};
}

models::TransformerConfig arch_from_json(const json& j) {
  models::TransformerConfig a;
  a.vocab = j.at("vocab"), a.d_model = j.at("d_model"), a.heads = j.at("heads"), a.ffn = j.at("ffn");
  a.enc_layers = j.at("enc_layers"), a.dec_layers = j.at("dec_layers"), a.max_len = j.at("max_len");
  a.dropout = j.at("dropout"), a.pad_id = j.at("pad_id"), a.bos_id = j.at("bos_id"), a.eos_id = j.at("eos_id");
  return a;
}

TextSplit read_text_split(const std::string& dir, const std::string& name, int64_t limit, const data::Tokenizer& tok,
                          int64_t max_len, bool train) {
  return make_split(read_split(dir, name, limit), tok, max_len, train);
}

std::string translation_data_dir(const std::string& d) {
  const std::string dir = d.empty() ? "datasets/en-es" : d;
  auto has = [](const std::string& p) { return file_exists(p + "/train.tsv"); };
  return !has(dir) && has(dir + "/en-es") ? dir + "/en-es" : dir;
}

void TranslationTask::setup(const TrainConfig& c, dist::Communicator& comm) {
  c_ = c;
  comm_ = &comm;
  dev_ = Device::parse(c.device);
  // ---- data and tokenizer
  dir_ = translation_data_dir(c.data_dir);
  auto train_pairs = read_split(dir_, "train", 0);
  const std::string tp = data::tokenizer_path(dir_, c.vocab_size);
  // Rank 0 alone trains a missing tokenizer (written atomically); the others wait for it.
  if (comm.rank() == 0) {
    if (!file_exists(tp)) {
      std::printf("training a SentencePiece tokenizer (%lld pieces, both languages) on %zu pairs -> %s\n",
                  (long long)c.vocab_size, train_pairs.size(), tp.c_str());
      std::fflush(stdout);
    }
    // A fixed thread count, not the run's: SentencePiece's unigram trainer sums its
    // statistics per thread, so the same data trained with --threads 1 and 2 gave two
    // tokenizers. 16 is SentencePiece's own default.
    tok_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load_or_train(train_pairs, tp, c.vocab_size, 16));
  }
  comm.barrier();
  if (comm.rank() != 0) tok_ = std::make_unique<data::Tokenizer>(data::Tokenizer::load(tp));
  if (c.train_limit > 0 && c.train_limit < int64_t(train_pairs.size())) train_pairs.resize(size_t(c.train_limit));
  train_ = make_split(train_pairs, *tok_, c.max_len, true);
  valid_ = read_text_split(dir_, "valid", c.test_limit, *tok_, c.max_len, false);
  test_ = read_text_split(dir_, "test", c.test_limit, *tok_, c.max_len, false);

  // ---- model
  mc_ = arch_ ? *arch_ : models::transformer_preset(c.model, tok_->vocab_size());
  const data::SpecialIds sp = tok_->special_ids();  // See Note [Special token ids]
  mc_.vocab = tok_->vocab_size();
  mc_.pad_id = sp.pad, mc_.bos_id = sp.bos, mc_.eos_id = sp.eos;
  EG_CHECK(c.max_len <= mc_.max_len, "--max-len ", c.max_len, " exceeds the ", mc_.max_len, " positions of model ",
           c.model);
  EG_CHECK(padded_len(c) <= mc_.max_len, "--pad-to-multiple ", c.pad_to_multiple, " pads --max-len ", c.max_len,
           " sentences to ", padded_len(c), " tokens, more than the ", mc_.max_len, " positions of model ", c.model);
  // Dropout draws from the generator the model was built with (not the default one), so
  // that generator lives as long as the model and its state is in every checkpoint.
  gen_ = Generator(c.seed);
  model_ = std::make_shared<models::Transformer>(mc_, gen_);
  model_->to(dev_);
  // The most ids a training batch holds: --batch-size sentences of the padded longest
  // length, or --max-tokens (which counts padded lengths), or one pair longer than that.
  graph_reserve_ = c.max_tokens > 0 ? std::max(c.max_tokens, padded_len(c)) : c.batch_size * padded_len(c);
  src_up_ = std::make_unique<StagedUpload>(dev_);
  tgt_in_up_ = std::make_unique<StagedUpload>(dev_);
  tgt_out_up_ = std::make_unique<StagedUpload>(dev_);

  data::BatcherOptions bo;
  bo.batch_size = c.batch_size;
  bo.max_tokens = c.max_tokens;
  bo.pad_to_multiple = c.pad_to_multiple;
  bo.seed = c.seed;
  bo.ids = sp;
  bo.shard_rank = comm.rank(), bo.shards = comm.size();
  batcher_ = std::make_unique<data::TranslationBatcher>(train_.pairs, bo);
  steps_per_epoch_ = int64_t(batcher_->epoch_plan(0).size());
}

std::string TranslationTask::description() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s: %lld training pairs (%lld longer than --max-len %lld dropped), %lld valid, %lld test; "
                "vocabulary %lld (%s); %s: %lld parameters, %lld batches per epoch",
                c_.dataset.c_str(), (long long)train_.pairs->size(), (long long)train_.pairs->dropped,
                (long long)c_.max_len, (long long)valid_.pairs->size(), (long long)test_.pairs->size(),
                (long long)mc_.vocab, tok_->path().c_str(), c_.model.c_str(), (long long)model_->num_parameters(),
                (long long)steps_per_epoch_);
  return buf;
}

json TranslationTask::resolved() const { return {{"arch", arch_json(mc_)}}; }

void TranslationTask::configure_freezing(freeze::PolicyConfig& pc) const {
  // Note [Freezing a Transformer]: the reference is built with this run's architecture.
  pc.model.vocab = mc_.vocab;
  // The targets the loss scores: each training target's ids and its eos (tgt_out).
  std::vector<int64_t> counts(size_t(mc_.vocab), 0);
  for (const auto& t : train_.pairs->tgt) {
    for (int64_t id : t)
      if (id >= 0 && id < mc_.vocab) ++counts[size_t(id)];
    if (mc_.eos_id >= 0 && mc_.eos_id < mc_.vocab) ++counts[size_t(mc_.eos_id)];
  }
  pc.constant_loss = freeze::constant_prediction_loss(counts, c_.label_smoothing);
  pc.make_model = [mc = mc_] {
    Generator g(0);
    return models::ModelPtr(std::make_shared<models::Transformer>(mc, g));
  };
}

bool TranslationTask::next_batch() {
  for (auto* up : {src_up_.get(), tgt_in_up_.get(), tgt_out_up_.get()})  // staged, never trained on: dropped
    if (up->staged()) up->take([](const Tensor&) { return Tensor(); });
  if (!batcher_->next(batch_)) return false;
  if (!batch_.ids.empty()) {
    src_up_->stage(batch_.src);
    tgt_in_up_->stage(batch_.tgt_in);
    tgt_out_up_->stage(batch_.tgt_out);
  }
  return true;
}

StepOutput TranslationTask::training_step(FreezeRun& fr) {
  if (batch_.ids.empty()) return {};  // this rank's share of a short batch is empty
  // The step's own tensors: clones of the device copies (the staging buffers are reused),
  // on the CPU the batch itself.
  auto own = [](const Tensor& t) { return t.is_cuda() ? t.clone() : t; };
  const Tensor src = src_up_->take(own), tgt_in = tgt_in_up_->take(own);
  return step_from(fr, src, tgt_in, tgt_out_up_->take(own));
}

StepOutput TranslationTask::step_from(FreezeRun& fr, const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out) {
  StepOutput out;
  const Tensor host_src = batch_.src;
  Tensor logits = fr.forward({src, tgt_in, [host_src] { return host_src; }, batch_.tgt_in}, batch_.ids, dev_);
  const int64_t n = tgt_out.numel();
  out.loss =
      fn::cross_entropy(fn::reshape(logits, {n, logits.size(2)}), tgt_out.reshape({n}), c_.label_smoothing, mc_.pad_id);
  out.samples = batch_.tgt_tokens;  // target tokens, as fairseq's wps
  return out;
}

Task::GraphBatch TranslationTask::stage_graph_batch() {
  GraphBatch g;
  if (batch_.ids.empty()) return g;
  // Written in place: the graph of this shape reads these tensors' storage.
  auto place = [&](GraphInput& in, StagedUpload& up, const Tensor& host) {
    Tensor view = in.place(host.shape(), DType::s64, dev_, graph_reserve_);
    (void)up.take([&](const Tensor& d) {
      view.copy_(d);
      return Tensor();
    });
    return view;
  };
  graph_src_ = place(src_in_, *src_up_, batch_.src);
  graph_tgt_in_ = place(tgt_in_in_, *tgt_in_up_, batch_.tgt_in);
  graph_tgt_out_ = place(tgt_out_in_, *tgt_out_up_, batch_.tgt_out);
  g.shape = {batch_.src.size(0), batch_.src.size(1), batch_.tgt_in.size(1)};
  g.samples = batch_.tgt_tokens;
  g.moves = src_in_.moves() + tgt_in_in_.moves() + tgt_out_in_.moves();
  return g;
}

StepOutput TranslationTask::graph_forward(FreezeRun& fr) {
  return step_from(fr, graph_src_, graph_tgt_in_, graph_tgt_out_);
}

Metrics TranslationTask::evaluate(Split s) {
  return evaluate_translation(*model_, s == Split::valid ? valid_ : test_, *tok_, dev_, comm_);
}

Metrics TranslationTask::evaluate_loss(Split s) {
  return evaluate_translation(*model_, s == Split::valid ? valid_ : test_, *tok_, dev_, comm_, false);
}

Metrics evaluate_translation(models::Transformer& m, const TextSplit& s, const data::Tokenizer& tok, Device dev,
                             dist::Communicator* comm, bool bleu) {
  autograd::NoGradGuard ng;
  const bool was_training = m.is_training();
  m.eval();
  data::BatcherOptions o;
  o.batch_size = kEvalBatch;
  o.shuffle = false;  // sorted by length: little padding, and decoding ends together
  o.ids = tok.special_ids();
  data::TranslationBatcher batcher(s.pairs, o);
  const auto plan = batcher.epoch_plan(0);
  const size_t rank = comm ? size_t(comm->rank()) : 0, ranks = comm ? size_t(comm->size()) : 1;
  std::vector<std::string> hyps, refs;
  double loss = 0, tokens = 0;
  for (size_t k = rank; k < plan.size(); k += ranks) {  // this rank's share of the batches
    const data::TranslationBatch b = batcher.make_batch(plan[k], int64_t(k));
    // m.forward, with the encoder's output kept for the decoding.
    Tensor src_mask;
    const Tensor memory = m.encode(b.src.to(dev), src_mask);
    Tensor logits = m.decode(memory, src_mask, b.tgt_in.to(dev));
    const int64_t n = b.tgt_out.numel();
    loss +=
        fn::cross_entropy(logits.reshape({n, logits.size(2)}), b.tgt_out.reshape({n}).to(dev), 0.0, o.ids.pad).item() *
        double(b.tgt_tokens);
    tokens += double(b.tgt_tokens);
    if (!bleu) continue;
    auto out = m.greedy_decode(memory, src_mask, decode_limit(memory.size(1)));
    for (size_t r = 0; r < out.size(); ++r) {
      hyps.push_back(tok.decode(out[r]));
      refs.push_back(s.refs[size_t(b.ids[r])]);
    }
  }
  const models::BleuCounts bc = text_bleu_counts(hyps, refs);
  std::vector<double> counts(bc.begin(), bc.end());
  counts.push_back(loss), counts.push_back(tokens);
  if (ranks > 1) {
    Tensor t = Tensor::from_vector(counts, {int64_t(counts.size())});
    comm->all_reduce(t);
    counts = t.to_vector<double>();
  }
  models::BleuCounts total;
  std::copy_n(counts.begin(), total.size(), total.begin());
  if (was_training) m.train();
  Metrics r = {{"loss", counts[10] / std::max(counts[11], 1.0)}};
  if (bleu) r["bleu"] = models::bleu_from_counts(total);
  return r;
}

void TranslationTask::summarize(json& sj) const {
  sj["parameters"] = model_->num_parameters();
  sj["flops_per_token"] = model_->flops_per_sample();
  sj["vocab_size"] = mc_.vocab;
}

}  // namespace eg::train
