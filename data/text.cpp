#include "data/text.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <unordered_map>

#include "core/rng.h"

namespace eg::data {

// ---- TSV sentence pairs

namespace {

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string::npos; }

}  // namespace

std::vector<SentencePair> read_tsv_pairs(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EG_CHECK(f.good(), "cannot open '", path, "': no such file or not readable");
  std::vector<SentencePair> pairs;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t tab = line.find('\t');
    EG_CHECK(tab != std::string::npos, path, ":", lineno, ": expected 'source<TAB>target', found no tab");
    EG_CHECK(line.find('\t', tab + 1) == std::string::npos, path, ":", lineno,
             ": expected 'source<TAB>target', found more than one tab");
    SentencePair p{line.substr(0, tab), line.substr(tab + 1)};
    EG_CHECK(!blank(p.src), path, ":", lineno, ": the source (before the tab) is empty");
    EG_CHECK(!blank(p.tgt), path, ":", lineno, ": the target (after the tab) is empty");
    pairs.push_back(std::move(p));
  }
  EG_CHECK(!f.bad(), "error while reading '", path, "'");
  EG_CHECK(!pairs.empty(), "'", path, "' is empty: expected lines of 'source<TAB>target'");
  return pairs;
}

// ---- tokenizer

struct Tokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

// Both sides of every pair, one sentence at a time: one vocabulary for both languages.
class PairSentences : public sentencepiece::SentenceIterator {
 public:
  explicit PairSentences(const std::vector<SentencePair>& p) : pairs_(p) {}
  bool done() const override { return i_ >= 2 * pairs_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return i_ % 2 ? pairs_[i_ / 2].tgt : pairs_[i_ / 2].src; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<SentencePair>& pairs_;
  size_t i_ = 0;
};

void write_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    EG_CHECK(f.good(), "cannot write '", tmp, "': ", std::strerror(errno), " (is the data directory writable?)");
    f.write(bytes.data(), std::streamsize(bytes.size()));
    f.flush();
    if (!f.good()) {
      std::remove(tmp.c_str());
      EG_THROW("cannot write '", tmp, "' (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    EG_THROW("cannot rename '", tmp, "' to '", path, "': ", std::strerror(e));
  }
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EG_CHECK(f.good(), "cannot open tokenizer model '", path, "': no such file or not readable");
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto impl = std::make_shared<Impl>();
  auto st = impl->sp.LoadFromSerializedProto(bytes);
  EG_CHECK(st.ok(), "'", path, "' is not a SentencePiece model (", st.ToString(), "); delete it to retrain");
  const SpecialIds s;
  EG_CHECK(impl->sp.pad_id() == s.pad && impl->sp.bos_id() == s.bos && impl->sp.eos_id() == s.eos &&
               impl->sp.unk_id() == s.unk,
           "tokenizer '", path, "' uses pad/bos/eos/unk ids ", impl->sp.pad_id(), "/", impl->sp.bos_id(), "/",
           impl->sp.eos_id(), "/", impl->sp.unk_id(), ", egeria needs ", s.pad, "/", s.bos, "/", s.eos, "/", s.unk,
           "; delete it to retrain");
  Tokenizer t;
  t.impl_ = std::move(impl);
  t.path_ = path;
  return t;
}

Tokenizer Tokenizer::train(const std::vector<SentencePair>& pairs, const std::string& path, int64_t vocab,
                           int threads) {
  EG_CHECK(!pairs.empty(), "cannot train a tokenizer on no sentence pairs");
  EG_CHECK(vocab > 4, "tokenizer vocabulary size must exceed the 4 special ids, got ", vocab);
  const SpecialIds s;  // See Note [Special token ids]
  // Unigram LM (Kudo 2018) over raw text: no pre-tokenisation, so decoding restores the
  // exact spacing. hard_vocab_limit=false lets a small corpus have fewer pieces.
  const std::unordered_map<std::string, std::string> args = {{"model_type", "unigram"},
                                                             {"vocab_size", std::to_string(vocab)},
                                                             {"character_coverage", "1.0"},
                                                             {"hard_vocab_limit", "false"},
                                                             {"pad_id", std::to_string(s.pad)},
                                                             {"bos_id", std::to_string(s.bos)},
                                                             {"eos_id", std::to_string(s.eos)},
                                                             {"unk_id", std::to_string(s.unk)},
                                                             {"num_threads", std::to_string(std::max(1, threads))},
                                                             {"minloglevel", "2"}};
  PairSentences it(pairs);
  std::string model;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  EG_CHECK(st.ok(), "training the tokenizer for '", path, "' failed: ", st.ToString());
  write_atomic(path, model);
  return load(path);
}

Tokenizer Tokenizer::load_or_train(const std::vector<SentencePair>& pairs, const std::string& path, int64_t vocab,
                                   int threads) {
  if (std::ifstream(path).good()) return load(path);
  return train(pairs, path, vocab, threads);
}

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  auto st = impl_->sp.Encode(text, &ids);
  EG_CHECK(st.ok(), "tokenizer '", path_, "' cannot encode \"", text.substr(0, 80), "\": ", st.ToString());
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  const SpecialIds s;
  std::vector<int> v;
  for (int64_t i : ids) {
    EG_CHECK(i >= 0 && i < vocab_size(), "tokenizer '", path_, "': id ", i, " is outside the vocabulary of ",
             vocab_size());
    if (i != s.pad && i != s.bos && i != s.eos) v.push_back(int(i));
  }
  std::string out;
  auto st = impl_->sp.Decode(v, &out);
  EG_CHECK(st.ok(), "tokenizer '", path_, "' cannot decode: ", st.ToString());
  return out;
}

std::vector<std::string> Tokenizer::pieces(const std::vector<int64_t>& ids) const {
  std::vector<std::string> out;
  for (int64_t i : ids) {
    EG_CHECK(i >= 0 && i < vocab_size(), "tokenizer '", path_, "': id ", i, " is outside the vocabulary of ",
             vocab_size());
    out.push_back(impl_->sp.IdToPiece(int(i)));
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

std::string tokenizer_path(const std::string& dir, int64_t vocab) {
  return dir + "/spm-" + std::to_string(vocab) + ".model";
}

TokenizedPairs tokenize_pairs(const std::vector<SentencePair>& pairs, const Tokenizer& tok, int64_t max_len,
                              bool drop_long) {
  EG_CHECK(max_len >= 2, "the maximum sentence length must be at least 2 tokens, got ", max_len);
  TokenizedPairs t;
  const size_t cap = size_t(max_len - 1);  // room for the bos or eos
  for (size_t i = 0; i < pairs.size(); ++i) {
    auto s = tok.encode(pairs[i].src), g = tok.encode(pairs[i].tgt);
    if (s.size() > cap || g.size() > cap) {
      if (drop_long) {
        ++t.dropped;
        continue;
      }
      s.resize(std::min(s.size(), cap));
      g.resize(std::min(g.size(), cap));
      ++t.truncated;
    }
    t.src.push_back(std::move(s));
    t.tgt.push_back(std::move(g));
    t.origin.push_back(int64_t(i));
  }
  return t;
}

// ---- batcher

namespace {

// Fisher-Yates with counter-based draws: a pure function of `key`.
template <class T>
void shuffle_keyed(std::vector<T>& v, uint64_t key) {
  for (size_t i = v.size(); i > 1; --i) {
    Philox4 r = philox4x32(key, i - 1);
    std::swap(v[i - 1], v[size_t((uint64_t(r.x[0]) << 32 | r.x[1]) % i)]);
  }
}

}  // namespace

TranslationBatcher::TranslationBatcher(std::shared_ptr<const TokenizedPairs> data, BatcherOptions o)
    : data_(std::move(data)), opt_(o) {
  EG_CHECK(data_ && data_->size() > 0, "translation batcher: no sentence pairs");
  EG_CHECK(o.batch_size > 0, "translation batcher: batch size must be positive, got ", o.batch_size);
  EG_CHECK(o.shards >= 1 && o.shard_rank >= 0 && o.shard_rank < o.shards, "translation batcher: shard ", o.shard_rank,
           " of ", o.shards);
  EG_CHECK(o.max_tokens >= 0 && o.pool_batches > 0, "translation batcher: bad max_tokens ", o.max_tokens,
           " or pool_batches ", o.pool_batches);
  EG_CHECK(o.pad_to_multiple >= 1, "translation batcher: pad_to_multiple must be at least 1, got ", o.pad_to_multiple);
}

std::vector<std::vector<int64_t>> TranslationBatcher::epoch_plan(int64_t epoch) const {
  const TokenizedPairs& d = *data_;
  auto len = [&](int64_t i) { return int64_t(std::max(d.src[size_t(i)].size(), d.tgt[size_t(i)].size())) + 1; };
  std::vector<int64_t> order(size_t(d.size()));
  std::iota(order.begin(), order.end(), 0);
  const uint64_t key = opt_.seed * 0x2545F4914F6CDD1Dull + uint64_t(epoch);
  int64_t pool = d.size();  // evaluation: one pool, the whole set sorted by length
  if (opt_.shuffle) {
    shuffle_keyed(order, key);
    int64_t per_batch = opt_.batch_size * opt_.shards;
    if (opt_.max_tokens > 0) {
      int64_t total = 0;
      for (int64_t i = 0; i < d.size(); ++i) total += len(i);
      per_batch = std::max<int64_t>(1, opt_.max_tokens * opt_.shards / std::max<int64_t>(1, total / d.size()));
    }
    pool = opt_.pool_batches * per_batch;
  }
  std::vector<std::vector<int64_t>> plan;
  const int64_t max_tokens = opt_.max_tokens * opt_.shards, batch_size = opt_.batch_size * opt_.shards;
  for (int64_t p0 = 0; p0 < d.size(); p0 += pool) {
    auto b = order.begin() + p0, e = order.begin() + std::min(d.size(), p0 + pool);
    std::stable_sort(b, e, [&](int64_t x, int64_t y) { return len(x) < len(y); });
    std::vector<int64_t> cur;
    int64_t longest = 0;
    for (auto it = b; it != e; ++it) {
      const int64_t l = padded_length(std::max(longest, len(*it)), opt_.pad_to_multiple);  // as make_batch pads
      const bool full = max_tokens > 0 ? int64_t(cur.size() + 1) * l > max_tokens : int64_t(cur.size()) == batch_size;
      if (full && !cur.empty()) {
        plan.push_back(std::move(cur));
        cur.clear();
        longest = 0;
      }
      cur.push_back(*it);
      longest = std::max(longest, len(*it));
    }
    if (!cur.empty()) plan.push_back(std::move(cur));
  }
  if (opt_.shuffle) shuffle_keyed(plan, key ^ 0x9E3779B97F4A7C15ull);
  return plan;
}

void TranslationBatcher::start_epoch(int64_t epoch, int64_t start_batch) {
  plan_ = epoch_plan(epoch);
  EG_CHECK(start_batch >= 0 && start_batch <= int64_t(plan_.size()), "translation batcher: cannot start epoch ", epoch,
           " at batch ", start_batch, " of ", plan_.size());
  next_ = start_batch;
}

bool TranslationBatcher::next(TranslationBatch& b) {
  if (next_ >= int64_t(plan_.size())) return false;
  const std::vector<int64_t>& all = plan_[size_t(next_)];
  std::vector<int64_t> mine;
  for (size_t i = size_t(opt_.shard_rank); i < all.size(); i += size_t(opt_.shards)) mine.push_back(all[i]);
  if (mine.empty()) {
    b = TranslationBatch();
    b.index = next_;
  } else {
    b = make_batch(mine, next_);
  }
  ++next_;
  return true;
}

TranslationBatch TranslationBatcher::make_batch(const std::vector<int64_t>& ids, int64_t index) const {
  const TokenizedPairs& d = *data_;
  const int64_t n = int64_t(ids.size());
  size_t s_len = 0, t_len = 0;
  for (int64_t i : ids) {
    EG_CHECK(i >= 0 && i < d.size(), "translation batcher: pair ", i, " out of range (", d.size(), " pairs)");
    s_len = std::max(s_len, d.src[size_t(i)].size());
    t_len = std::max(t_len, d.tgt[size_t(i)].size());
  }
  const int64_t m = opt_.pad_to_multiple;  // + 1: eos or bos
  const int64_t S = padded_length(int64_t(s_len) + 1, m), T = padded_length(int64_t(t_len) + 1, m);
  const SpecialIds& sp = opt_.ids;
  std::vector<int64_t> src(size_t(n * S), sp.pad), tin(size_t(n * T), sp.pad), tout(size_t(n * T), sp.pad);
  TranslationBatch b;
  for (int64_t r = 0; r < n; ++r) {
    const auto &x = d.src[size_t(ids[size_t(r)])], &y = d.tgt[size_t(ids[size_t(r)])];
    int64_t* s = src.data() + r * S;
    std::copy(x.begin(), x.end(), s);
    s[x.size()] = sp.eos;
    int64_t *ti = tin.data() + r * T, *to = tout.data() + r * T;
    ti[0] = sp.bos;
    std::copy(y.begin(), y.end(), ti + 1);
    std::copy(y.begin(), y.end(), to);
    to[y.size()] = sp.eos;
    b.src_tokens += int64_t(x.size()) + 1;
    b.tgt_tokens += int64_t(y.size()) + 1;
  }
  b.src = Tensor::from_vector(src, {n, S});
  b.tgt_in = Tensor::from_vector(tin, {n, T});
  b.tgt_out = Tensor::from_vector(tout, {n, T});
  b.ids = ids;
  b.index = index;
  return b;
}

}  // namespace eg::data
