// Translation as a task of the training loop (train/task.h): a Transformer trained on
// sentence pairs (DIR/{train,valid,test}.tsv, "source<TAB>target"), tokenised by a
// SentencePiece model kept beside the data (DIR/spm-<vocab>.model, trained on first
// use), with label-smoothed cross-entropy; evaluation is the validation loss (per token,
// unsmoothed), which picks the best epoch, and BLEU of greedy translations.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/staged_upload.h"
#include "data/text.h"
#include "models/transformer.h"
#include "train/graphed_step.h"
#include "train/task.h"

namespace eg::train {

// The directory a translation run reads: --data-dir, else datasets/en-es (where
// `tools/get-data datasets` puts it). A directory holding en-es/train.tsv is also accepted.
std::string translation_data_dir(const std::string& data_dir);

// A split's token ids (batches, loss) and the reference text of each kept pair (BLEU).
struct TextSplit {
  std::shared_ptr<const data::TokenizedPairs> pairs;
  std::vector<std::string> refs;
};

// DIR/<name>.tsv (its first `limit` pairs when > 0), tokenised: training drops pairs
// longer than `max_len` tokens, evaluation cuts them, so every sentence counts.
TextSplit read_text_split(const std::string& dir, const std::string& name, int64_t limit, const data::Tokenizer& tok,
                          int64_t max_len, bool train);

// A Transformer architecture in config.json's "arch" form, and back.
nlohmann::json arch_json(const models::TransformerConfig& a);
models::TransformerConfig arch_from_json(const nlohmann::json& j);

class TranslationTask : public Task {
 public:
  // `arch`, when given, replaces the preset named by --model (its vocabulary is set from
  // the tokenizer): tests train small models this way.
  explicit TranslationTask(std::optional<models::TransformerConfig> arch = std::nullopt) : arch_(std::move(arch)) {}
  void setup(const TrainConfig& c, dist::Communicator& comm) override;
  models::Model& model() override {
    EG_CHECK(model_, "TranslationTask::model(): train::fit builds the model (from TrainConfig::model); to start from ",
             "weights, set TrainConfig::init_from");
    return *model_;
  }
  std::string description() const override;
  nlohmann::json resolved() const override;
  Generator& generator() override { return gen_; }
  void configure_freezing(freeze::PolicyConfig& pc) const override;
  std::string unit() const override { return "tokens"; }
  int64_t batches_per_epoch() const override { return steps_per_epoch_; }
  void start_epoch(int64_t epoch, int64_t first_batch) override { batcher_->start_epoch(epoch, first_batch); }
  bool next_batch() override;
  StepOutput training_step(FreezeRun& fr) override;
  bool graphable() const override { return true; }
  int64_t default_graph_limit() const override { return 8; }  // a shape per pair of padded lengths
  GraphBatch stage_graph_batch() override;
  StepOutput graph_forward(FreezeRun& fr) override;
  std::vector<Split> epoch_splits() const override { return {Split::valid}; }
  Metrics evaluate(Split s) override;
  Metrics evaluate_loss(Split s) override;  // no BLEU: no decoding
  std::string selection_metric() const override { return "loss"; }
  bool higher_is_better() const override { return false; }
  void summarize(nlohmann::json& summary) const override;

 private:
  std::optional<models::TransformerConfig> arch_;
  TrainConfig c_;
  dist::Communicator* comm_ = nullptr;
  Device dev_;
  std::string dir_;
  std::unique_ptr<data::Tokenizer> tok_;
  TextSplit train_, valid_, test_;
  models::TransformerConfig mc_;
  Generator gen_;
  std::shared_ptr<models::Transformer> model_;
  std::unique_ptr<data::TranslationBatcher> batcher_;
  int64_t steps_per_epoch_ = 0;
  data::TranslationBatch batch_;
  // The batch's source, target input and target output ids on their way to the device as
  // soon as the batch is known (Note [Staged uploads] in core/staged_upload.h): the host
  // waits for none of the copies (a batch of another shape than the last is copied after
  // the kernels queued before it, on the device; ids are a few kilobytes).
  std::unique_ptr<StagedUpload> src_up_, tgt_in_up_, tgt_out_up_;
  // --cuda-graphs on: the batch's ids where the graphs read them, a graph per batch shape
  // (Note [Graphed steps] in train/graphed_step.h), each buffer made at once as big as
  // the largest batch can be (graph_reserve_ ids), so that it never moves.
  GraphInput src_in_, tgt_in_in_, tgt_out_in_;
  Tensor graph_src_, graph_tgt_in_, graph_tgt_out_;
  int64_t graph_reserve_ = 0;
  StepOutput step_from(FreezeRun& fr, const Tensor& src, const Tensor& tgt_in, const Tensor& tgt_out);
};

// Teacher-forced loss per target token and (with `bleu`) BLEU of greedy translations of a
// split; with `comm`, each rank evaluates its share of the batches and the token counts,
// loss sums and BLEU's n-gram counts are summed.
Metrics evaluate_translation(models::Transformer& m, const TextSplit& s, const data::Tokenizer& tok, Device dev,
                             dist::Communicator* comm = nullptr, bool bleu = true);

}  // namespace eg::train
