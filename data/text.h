// Sentence-pair data for translation: a TSV reader that names the file and line of
// every problem, a SentencePiece tokenizer trained on first use and stored beside the
// data, and a batcher that groups pairs of similar length (fairseq-style) in an order
// that is a pure function of (seed, epoch), so a resumed run sees the same batches.
//
// SentencePiece stays behind Tokenizer's pimpl: no public header includes it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace eg::data {

struct SentencePair {
  std::string src, tgt;
};

// Reads "source<TAB>target" lines (UTF-8 bytes are passed through unchecked; a final
// '\r' is dropped). Throws naming the file, and the line where there is one, for: a
// missing or unreadable file, an empty file, a line without exactly one tab, an empty
// (or all-blank) side.
std::vector<SentencePair> read_tsv_pairs(const std::string& path);

// Note [Special token ids]
// The tokenizer reserves pad = 0, bos = 1, eos = 2, unk = 3: the first three are the
// defaults of models::TransformerConfig (pad_id, bos_id, eos_id), so a model built from
// a preset and a batch built here agree without translation. The trainer still copies
// them into the model's configuration from the tokenizer, so the tokenizer is the one
// source of truth.
struct SpecialIds {
  int64_t pad = 0, bos = 1, eos = 2, unk = 3;
};

class Tokenizer {
 public:
  // Loads a SentencePiece model file. Throws naming the file if it is missing or invalid.
  static Tokenizer load(const std::string& model_path);
  // Trains one unigram model with a vocabulary shared by both sides of `pairs` and writes
  // it to `model_path` atomically (a temporary file renamed into place, so an interrupted
  // training never leaves half a model). `vocab_size` is an upper bound on small corpora.
  static Tokenizer train(const std::vector<SentencePair>& pairs, const std::string& model_path, int64_t vocab_size,
                         int threads = 1);
  // `model_path` if it exists, else trains it from `pairs` (see train()).
  static Tokenizer load_or_train(const std::vector<SentencePair>& pairs, const std::string& model_path,
                                 int64_t vocab_size, int threads = 1);

  std::vector<int64_t> encode(const std::string& text) const;  // no bos/eos
  std::string decode(const std::vector<int64_t>& ids) const;  // special ids are skipped
  std::vector<std::string> pieces(const std::vector<int64_t>& ids) const;
  int64_t vocab_size() const;
  SpecialIds special_ids() const { return {}; }  // See Note [Special token ids]
  const std::string& path() const { return path_; }

 private:
  Tokenizer() = default;  // only load() and train() make one
  struct Impl;
  std::shared_ptr<const Impl> impl_;
  std::string path_;
};

// Where a data directory keeps its tokenizer: DIR/spm-<vocab_size>.model.
std::string tokenizer_path(const std::string& data_dir, int64_t vocab_size);

// Token ids of every pair, computed once. Each side holds its ids only (no bos/eos);
// a side may use at most max_len - 1 ids, so that with the bos or eos the batcher adds
// it fits max_len positions. Longer pairs are dropped (drop_long) or cut to fit.
struct TokenizedPairs {
  std::vector<std::vector<int64_t>> src, tgt;
  std::vector<int64_t> origin;  // index of each kept pair in the input
  int64_t dropped = 0, truncated = 0;
  int64_t size() const { return int64_t(src.size()); }
};
TokenizedPairs tokenize_pairs(const std::vector<SentencePair>& pairs, const Tokenizer& tok, int64_t max_len,
                              bool drop_long);

struct TranslationBatch {
  Tensor src;  // s64 [B, S]: source ids + eos, padded with pad
  Tensor tgt_in;  // s64 [B, T]: bos + target ids, padded
  Tensor tgt_out;  // s64 [B, T]: target ids + eos, padded
  std::vector<int64_t> ids;  // pair indices (into TokenizedPairs), in batch order
  int64_t index = 0;  // batch index within the epoch
  int64_t src_tokens = 0, tgt_tokens = 0;  // non-pad positions of src and tgt_out
};

// A batch side of `tokens` positions padded up to a multiple of `multiple`
// (BatcherOptions::pad_to_multiple).
inline int64_t padded_length(int64_t tokens, int64_t multiple) { return (tokens + multiple - 1) / multiple * multiple; }

struct BatcherOptions {
  int64_t batch_size = 64;  // sentences per batch, when max_tokens is 0
  int64_t max_tokens = 0;  // > 0: as many pairs as fit B * (longest side + 1, padded) <= max_tokens
  int64_t pool_batches = 100;  // length-sorting window, in batches
  // Source and target lengths padded up to a multiple of this (fairseq's
  // --required-seq-len-multiple): a few batch shapes instead of one per length, which
  // CUDA graphs capture one by one. Padding is masked, so it changes only rounding and
  // dropout's draws. max_tokens counts the padded lengths (as many pairs of a length as fit).
  int64_t pad_to_multiple = 1;
  bool shuffle = true;  // false: corpus order, sorted by length (evaluation)
  uint64_t seed = 0;
  SpecialIds ids;
  // Data-parallel training: batch_size and max_tokens are per rank, the epoch is planned
  // in global batches of `shards` times them, and next() gives this rank the pairs
  // shard_rank, shard_rank + shards, ... of each (similar lengths, as the batch is
  // length-sorted). A share may be empty (a short last batch): next() then gives a batch
  // without ids or tensors, and the rank still takes part in the step.
  int shard_rank = 0, shards = 1;
};

// Note [Length-bucketed batch order]
// Padding is waste, so pairs of similar length should share a batch; sorting the whole
// corpus would make every epoch the same and the batch lengths monotonic. As fairseq
// does: shuffle the pairs (a pure function of (seed, epoch)), cut the shuffled list into
// pools of pool_batches batches, sort each pool by length, cut it into batches, then
// shuffle the order of all the epoch's batches. The plan of an epoch depends on nothing
// else, so resuming at batch k replays batches k, k+1, ... of the uninterrupted run.
class TranslationBatcher {
 public:
  TranslationBatcher(std::shared_ptr<const TokenizedPairs> data, BatcherOptions o);
  // The epoch's batches as lists of pair indices. See Note [Length-bucketed batch order].
  std::vector<std::vector<int64_t>> epoch_plan(int64_t epoch) const;
  // Starts (or resumes) an epoch at batch `start_batch`.
  void start_epoch(int64_t epoch, int64_t start_batch = 0);
  // This rank's share of the epoch's next batch, or false at its end.
  bool next(TranslationBatch& b);
  int64_t batches_in_epoch() const { return int64_t(plan_.size()); }
  TranslationBatch make_batch(const std::vector<int64_t>& pair_ids, int64_t index) const;
  const TokenizedPairs& data() const { return *data_; }

 private:
  std::shared_ptr<const TokenizedPairs> data_;
  BatcherOptions opt_;
  std::vector<std::vector<int64_t>> plan_;
  int64_t next_ = 0;
};

}  // namespace eg::data
