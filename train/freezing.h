// The freezing side of the training loop (train/run.cpp) and of its tasks: freezing
// units and policy from the
// configuration; which layer module to capture; after each optimizer step the policy's
// decision applied and logged (metrics.jsonl "freeze" lines, freeze.jsonl); its state
// in checkpoints; its figures in summary.json.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cache/activation_cache.h"
#include "dist/strategy.h"
#include "freeze/policy.h"
#include "train/config.h"
#include "train/smartfrz_record.h"

namespace eg::nn {
class BatchNorm2d;
}

namespace eg::train {

// One line for the end of a run with a freezing policy, from its summary.json fields:
// what is frozen at the end, the backward FLOPs saved over the run (freezes undone by an
// unfreeze count too), and for Egeria the evaluations
// and the reference's overhead. Empty for --freeze none.
std::string freeze_report(const nlohmann::json& summary);

// summary.json's reference_overhead_fraction, a share of training time: the training
// thread's time in the policy, plus the background threads' CPU time spread over the
// training threads where the reference works on the training's own cores (CPU training,
// or a reference on the training GPU evaluated inline, --freeze-sync), plus a GPU
// reference's device time in the background (freeze_stats.reference_gpu_seconds: its
// readings' spans on their side stream, an upper bound of what they took from the step).
// Beside GPU training a CPU reference runs on cores the step does not use (the paper's
// setting): its CPU time is reported (freeze_stats.reference_cpu_seconds) but not
// counted; what it takes from the data loader's cores shows in the wall time.
double reference_overhead_fraction(double policy_seconds, double background_cpu_seconds, int training_threads,
                                   bool background_on_training_cores, double train_seconds,
                                   double reference_gpu_seconds = 0);

// Note [Freezing across ranks]
// In data-parallel training the policy (and Egeria's reference model) runs on rank 0
// alone, the paper's single controller: it sees the global loss, and the gradients after
// their all-reduce. After every step rank 0 broadcasts the frozen units, and
// every rank applies it before the next forward, so all ranks freeze and unfreeze at the
// same step and rebuild the same gradient buckets (the loop checks their layout before
// each all-reduce). The broadcast is the frozen set (Note [Frozen sets]), a flag per
// unit. BatchNorm running statistics are averaged over the ranks whenever the
// frozen set changes, since a frozen prefix may run on them (--freeze-bn running). Only
// rank 0 writes the logs.
class FreezeRun {
 public:
  // `model` is the training model; `pc` the policy's configuration (policy_config(c)
  // plus the model and run length). It appends to DIR/metrics.jsonl and DIR/freeze.jsonl.
  FreezeRun(const TrainConfig& c, models::Model& model, freeze::PolicyConfig pc, const std::string& out_dir,
            const dist::Strategy& strategy);

  // Layer modules (not units) to run under no-grad now: the frozen set's prefix (Note
  // [Frozen sets] in freeze/policy.h).
  int64_t frozen_layers() const { return part_.layer_prefix(freeze::prefix_length(frozen_)); }
  const freeze::UnitSet& frozen_units() const { return frozen_; }

  // --freeze-cache on: keep the frozen prefix's outputs for `entries` keys, a training
  // sample's each (or each of its fixed augmentations': ImageTask::cache_keys; image
  // models; the trainer validated the configuration), in memory when they fit, else on
  // disk in `dir` (always there when `force_disk`).
  void use_cache(const std::string& dir, int64_t entries, bool force_disk);
  bool caching() const { return cache_ != nullptr; }

  // ---- one step. Before its forward, the loop says which step it is: the policy (rank 0)
  // then says what to capture.
  void start_step(int64_t step);
  // The batch a step's forward takes: the model's inputs x (and x2, a Transformer's target
  // input ids) on the training device as the task moved them, except x with the
  // activation cache (on the host: the cache looks its rows up and moves what it
  // computes); and the batch on the host for a CPU reference model, made only at a step
  // that takes a reading (from pixels, say: the task may have moved no f32 batch).
  struct StepBatch {
    Tensor x, x2;
    std::function<Tensor()> host_x;
    Tensor host_x2;
  };
  // The step's forward for every task: the model with its frozen prefix under no-grad
  // (Note [The frozen-prefix forward] in models/model.h), or with --freeze-cache the
  // prefix's output from the activation cache where it holds the batch's samples' keys `ids`.
  // The freezing keeps the batch and the captured outputs for after_step, its one
  // channel from the forward to the policy.
  Tensor forward(const StepBatch& b, const std::vector<int64_t>& ids, Device dev);
  // Whether this step's forward captures a layer's outputs for the policy (the host reads
  // them after the step: a step a CUDA graph replays takes none).
  bool reads_this_step() const { return capture_.layer >= 0; }
  // A replayed step ran the forward without this object seeing it (Note [Graphed steps]).
  void note_replayed_forward() { ++steps_; }
  // Before a CUDA graph's capture: the policy's work beside training (Egeria's reference,
  // which may queue GPU work from its own thread) is over.
  void quiesce() {
    if (policy_) policy_->quiesce();
  }
  // The next batch's cache keys, for the cache to gather ahead.
  void prefetch(const std::vector<int64_t>& next_ids);

  // After the optimizer step: accounting, the policy, its decision applied to the
  // model (a "freeze" line in metrics.jsonl when the frozen set changed) and its log.
  // Collective: every rank calls it every step (Note [Freezing across ranks]).
  // `s` says the step; the batch and the captures are this step's forward's.
  void after_step(const freeze::StepInfo& s, double train_seconds);

  // Fields for metrics.jsonl step lines: frozen units and active parameter share.
  nlohmann::json step_fields() const;
  // The epoch's line's fields (metrics.jsonl): with the activation cache, the samples of the
  // epoch's steps served from it, computed from the input, and computed from the entries
  // of a shorter prefix (since this invocation started, in a resumed epoch), then counted
  // from zero for the next epoch.
  nlohmann::json epoch_fields();

  // Checkpoints: tensors under "freeze/" and the state's "freeze*" keys.
  void save(std::map<std::string, Tensor>& tensors, nlohmann::json& state) const;
  void load(const std::map<std::string, Tensor>& tensors, const nlohmann::json& saved, const std::string& ckpt);

  // summary.json: frozen_fraction_final, backward_flops_saved_fraction,
  // reference_overhead_fraction, evaluations_dropped, freeze_units, freeze_stats.
  void summarize(nlohmann::json& summary, int64_t steps, double train_seconds) const;

 private:
  double frozen_share(const std::vector<double>& share) const;  // of the frozen set's units
  double prefix_share(const std::vector<double>& share) const;  // of its prefix's
  double backward_saved_share() const;  // Note [Backward FLOPs a frozen set saves]
  freeze::UnitSet rank0s(const freeze::UnitSet& s) const;  // rank 0's set, on every rank (collective)
  // --freeze-reference-scope unit: the layer module whose output is the input of the unit
  // that ends at layer module `capture` (-1: none, or the unit starts the network).
  int64_t unit_input_layer(int64_t capture) const;
  Tensor cached_forward(const Tensor& x, const std::vector<int64_t>& ids, Device dev);
  // After the frozen prefix changed from `old_layers` layer modules (`old_share` of the
  // forward FLOPs): keeps the old entries below the new ones where the prefix grew
  // (Note [A growing prefix keeps its entries]), else drops every store below.
  void move_cache_boundary(int64_t old_layers, double old_share);
  void drop_below();  // the stores below, their counts kept in dropped_
  cache::CacheStats cache_stats() const;  // of every store, dropped or alive
  // --freeze-bn-settle (Note [Settling a frozen BatchNorm] in layers/layers.h): after the
  // frozen set changed, the BatchNorms that froze start settling (`was_frozen`: each of
  // batch_norms_ before); and at every step, settling ends once its steps have passed.
  void settle_batch_norms(const std::vector<char>& was_frozen);
  void count_down_settling();
  models::Model& model_;
  const dist::Strategy& dp_;
  const bool lead_;  // rank 0: runs the policy and writes the logs
  freeze::UnitSet frozen_;  // units frozen now, as every rank agreed
  std::unique_ptr<SmartFrzRecorder> recorder_;  // --smartfrz-record on (rank 0)
  std::string out_dir_;
  freeze::Partition part_;
  std::unique_ptr<freeze::FreezePolicy> policy_;
  std::vector<double> unit_params_, unit_flops_;  // shares of the model's parameters / forward FLOPs
  std::string metrics_, log_;
  double flops_saved_sum_ = 0, seconds_ = 0;  // sum over steps of the frozen FLOP share; time in the policy
  std::unique_ptr<cache::ActivationCache> cache_;
  // The entries of the prefixes the current one grew from, shortest first: each of the
  // first `layers` layer modules, `share` of the forward FLOPs.
  struct Below {
    std::unique_ptr<cache::ActivationCache> cache;
    int64_t layers = 0;
    double share = 0;
  };
  std::vector<Below> below_;
  // The stores dropped so far: their counts; and the peak of all the stores' sizes together.
  cache::CacheStats dropped_;
  std::function<std::unique_ptr<cache::ActivationCache>()> cache_made_;  // a new, empty store
  bool unit_scope_ = false;
  bool reference_on_training_cores_ = true;  // see reference_overhead_fraction
  // This step's batch on the host and captures, from start_step() and forward() to
  // after_step().
  std::function<Tensor()> host_x_;
  Tensor host_x2_;
  models::Capture capture_;
  int64_t generation_ = 0;  // bumped whenever the frozen prefix changes: the cache's key
  std::vector<std::pair<std::string, nn::BatchNorm2d*>> batch_norms_;  // the model's, by name
  int64_t bn_settle_ = 0;  // --freeze-bn-settle where the frozen BatchNorms run on running statistics
  int64_t settle_left_ = 0;  // steps until the settling BatchNorms switch (the cache waits as long)
  double fwd_flops_saved_sum_ = 0;  // sum over steps of the forward FLOP share the cache skipped
  int64_t steps_ = 0, hit_samples_ = 0, miss_samples_ = 0, lower_samples_ = 0, hit_batches_ = 0;
  int64_t epoch_hits_ = 0, epoch_misses_ = 0, epoch_lower_ = 0;
  double epoch_lower_skipped_ = 0;  // sum over those samples of the prefix's share they skipped
};

// The policy's configuration as the run's options give it: the freezing options, the
// model's name and the training device (the run adds the rest: freeze::PolicyConfig).
freeze::PolicyConfig policy_config(const TrainConfig& c);
// The trained SmartFRZ predictor that ships with egeria (share/smartfrz-predictor.safetensors),
// installed or in the source tree; empty when there is none.
std::string shipped_smartfrz_predictor();

}  // namespace eg::train
