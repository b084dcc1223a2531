// Freezing policies: what `egeria train --freeze` selects. A policy watches training
// (loss, LR, activations, gradients) and decides which units are frozen; the trainer
// applies the decision (apply_frozen_layers) and logs the events.
//
//   none        never freezes (the baseline)
//   static      freezes the first K units at epoch E, or a set of units (--static-units)
//   freezeout   Brock et al. 2017: module i freezes at fraction t_i of training,
//               t_i = t0 + (1 - t0) i / (L - 1) (linear schedule; their per-layer LR
//               annealing to zero is not applied, the run's LR schedule is kept)
//   autofreeze  AutoFreeze-style (Liu et al. 2021, the paper's §6 baseline): every n
//               steps the relative change of each active module's gradient norm; the
//               front module freezes when its change is below the given percentile
//               of the active modules' changes
//   egeria      the paper: plasticity against a reference model, Algorithm 1
//               (freeze/tracker.h), evaluated asynchronously (freeze/controller.h)
//   smartfrz    Li et al. 2023: an attention predictor, trained offline, reads each
//               active unit's tailored weight history at every freezing stage and
//               names the units that freeze (freeze/smartfrz.h); prefix or any order
// Each behind this interface in a file of its own, freeze/policy_NAME.cpp (none, the
// baseline, beside make_policy's table in freeze/policy.cpp): freeze/policies.h.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/deferred_read.h"
#include "freeze/controller.h"
#include "freeze/partition.h"
#include "freeze/tracker.h"
#include "models/model.h"
#include "quant/reference.h"

namespace eg::freeze {

enum class FrozenBn { batch, running };  // Note [Frozen BatchNorm semantics]
// --freeze-bn-settle auto: 20 batches of 128 (2,560 samples) at the frozen weights;
// measured in docs/fine-tuning.md, "Settling the frozen batch norms".
constexpr int64_t kBnSettleAutoSteps = 20;

// Note [Frozen sets]
// What is frozen is a set of units, ascending unit indices. Its prefix (units 0 .. p-1
// all in it) runs as the paper's frozen front: under no-grad, no backward at all, its
// outputs cacheable. A frozen unit behind a trainable one still runs the backward to its
// input, for the units before it, but computes no weight gradients (its parameters do
// not require grad, so the autograd nodes skip them), takes no optimizer step and is in
// no gradient bucket, so its parameters stay bitwise as they were and data-parallel
// ranks do not send them. The policies of the paper freeze prefixes; --freeze static
// with --static-units freezes any set.
using UnitSet = std::vector<int64_t>;
UnitSet first_units(int64_t k);  // {0, 1, ..., k - 1}
int64_t prefix_length(const UnitSet& s);  // p: units 0 .. p - 1 are all in s
enum class ReferenceScope { unit, network };  // Note [The reference's scope]

// The mean cross-entropy of the best prediction that ignores its input, given how often
// each target class occurs in the training data: the entropy of those frequencies, mixed
// with the uniform distribution as label smoothing mixes the targets ((1 - s) p + s / C,
// C = counts.size()). A model no better than this has learned nothing from its inputs.
double constant_prediction_loss(const std::vector<int64_t>& counts, double label_smoothing);

// --freeze smartfrz (freeze/policy_smartfrz.cpp, Note [SmartFRZ's freezing stage]).
enum class SmartFrzOrder { prefix, any };
struct SmartFrzOptions {
  std::string predictor;  // its file (train/ loads it into PolicyConfig); empty: the installed one
  SmartFrzOrder order = SmartFrzOrder::prefix;
  int64_t window = 0;  // records in a unit's window (0: the predictor's)
  int64_t record_every = 0;  // steps between records (0: an epoch's steps / window, at least 1)
  int64_t stage_every = 0;  // steps between freezing stages (0: an epoch's, or a tenth of the run)
  // A unit freezes when the predictor's P(freeze) is at least this: 0.99, where the shipped
  // predictor's precision on models it never saw was at least 0.9 for every one
  // (docs/results/2026-12-04-smartfrz-predictor.md).
  double threshold = 0.99;
  // The most units one stage may freeze, front first (0: every unit the order allows). One:
  // a stage that froze every unit the predictor named froze them all together after the
  // first LR decay, and cost more accuracy than freezing them a stage apart
  // (docs/results/2026-12-04-smartfrz-predictor.md).
  int64_t max_per_stage = 1;
  // A unit is named for freezing when its P(freeze) is at least the threshold at this many
  // stages in a row: the predictor's answer for one unit can spike for a single stage, and
  // on ResNet-20 freezing at one stage's word cost 0.5-0.8 pt more than at two stages'
  // (docs/results/2026-12-04-smartfrz-predictor.md).
  int64_t patience = 2;
  // Freezing stages begin once the mean training loss of the steps since the last stage is
  // at most start_below x PolicyConfig::constant_loss (Note [SmartFRZ waits for learning]
  // in freeze/policy_smartfrz.cpp); 0: from the first stage, as published.
  double start_below = 0.75;
  // Any policy: record every unit's tailored weights, and the Gram of its output on a probe
  // batch of `probe` training samples, every record_every steps, into the run's
  // smartfrz-records.safetensors: the predictor's training data (train/smartfrz_record.h).
  bool record = false;
  int64_t probe = 32;
  // For tests and embedders, not an option: replaces the predictor, given the units and
  // their windows' features [units, window, tailor]; returns P(freeze) per unit.
  std::function<std::vector<double>(const std::vector<int64_t>& units, const Tensor& windows)> predict;
};

// The freezing options as a user sets them: a TrainConfig holds one (`freezing`), the
// rows of the option table (train/options.cpp) point into it, and the policies, the
// tracker (`tracker`) and the controller (`reference`) read it as it is. A new freezing
// option is a field here (or in TrackerOptions, ControllerOptions), its row, and the code
// that reads it.
struct FreezeOptions {
  std::string policy = "none";  // policy_names()
  PartitionMode units = PartitionMode::automatic;  // the freezing units (freeze/partition.h)
  std::string unit_regex;  // non-empty: units by parameter name
  TrackerOptions tracker;  // egeria's Algorithm 1 (interval also used by autofreeze)
  // egeria's reference model. Its `gpu` is the training device's and its `max_cpu_load`
  // comes from reference_max_load (max_cpu_load()), when the policy starts.
  ControllerOptions reference;
  ReferenceScope reference_scope = ReferenceScope::unit;
  // The reference forward runs only while the machine's CPU load is at most this
  // percentage; 0 is "auto": 50 when training on a GPU with apply_on_arrival, as the
  // paper, else 100 (never waiting: CPU training keeps the cores busy by design, and
  // acting at the next evaluation step would wait there for a held-back reference).
  double reference_max_load = 0;
  // egeria, evaluated in the background: act on an evaluation's result as soon as it
  // arrives (the paper; the step it lands on depends on timing, so two runs with the same
  // seed can decide differently), instead of at the next evaluation step, waiting for it
  // there if it is late (the default: the same run makes the same decisions).
  bool apply_on_arrival = false;
  FrozenBn bn = FrozenBn::batch;
  // bn running: steps a newly frozen unit's BatchNorms keep the batch's statistics while
  // their running statistics become those batches' average (Note [Settling a frozen
  // BatchNorm] in layers/layers.h); 0: they switch at the freeze; -1: auto
  // (bn_settle_steps()).
  int64_t bn_settle = -1;
  int64_t bn_settle_steps() const {
    return bn != FrozenBn::running ? 0 : bn_settle < 0 ? kBnSettleAutoSteps : bn_settle;
  }
  // egeria, for embedders with cyclic LR schedules: called at every step while a unit is
  // frozen with (step, LR); true unfreezes every unit (freeze.jsonl: an "unfreeze" with
  // reason "custom"), as an LR fall does. Its answers must be a function of (step, LR)
  // for a resumed run to repeat the same decisions. Not an option: it is not in
  // config.json and a resume cannot check it.
  std::function<bool(int64_t, double)> unfreeze_hook;
  int64_t static_modules = -1, static_epoch = -1;  // static (-1: half the modules / epochs)
  std::vector<int64_t> static_units;  // static: this set instead of the front static_modules
  double freezeout_t0 = 0.5;
  double autofreeze_percentile = 50;
  SmartFrzOptions smartfrz;
  // The activation cache of the frozen prefix (cache/, the paper's §4.3): skips the
  // prefix's forward for samples seen since the last freeze; needs bn running and
  // per-sample augmentation (or none).
  bool cache = false;
  std::string cache_dir;  // set: its entries go to a file there; empty: in memory when
      // they take at most half the available memory, else in the run's folder

  // The reference's CPU-load gate as a share of the machine (ControllerOptions::max_cpu_load)
  // when training on `training`.
  double max_cpu_load(Device training) const;
};

// What a policy is made from: the options, and what the run derives.
struct PolicyConfig : FreezeOptions {
  PolicyConfig() = default;
  explicit PolicyConfig(FreezeOptions o) : FreezeOptions(std::move(o)) {}
  models::ModelConfig model;
  // The freezing units the policy counts in (freeze/partition.h); empty: every layer
  // module is a unit. Policies decide in units; the trainer maps a prefix of units to
  // a prefix of layer modules (Partition::layer_prefix).
  Partition partition;
  // egeria: builds an untrained model of the training model's architecture for the
  // reference (empty: models::build_model(model)).
  quant::ModelFactory make_model;
  int64_t total_steps = 0, steps_per_epoch = 0;
  // The training loss of the best prediction that ignores the input: the entropy of the
  // training targets' frequencies (constant_prediction_loss), set by the task; 0: unknown.
  double constant_loss = 0;
  Device device = Device::cpu();  // the training device (a "-gpu" reference runs there)
  uint64_t seed = 0;  // the run's (smartfrz: the positions it records)
  // smartfrz: the predictor file's tensors and metadata, as train/ read them
  // (SmartFrzOptions::predictor names the file).
  std::map<std::string, Tensor> smartfrz_weights;
  std::map<std::string, std::string> smartfrz_metadata;
};

struct StepInfo {
  int64_t step = 0;  // the step just taken (1-based count of optimizer steps)
  int64_t epoch = 0;  // 0-based
  double lr = 0;
  // The step's loss, on its way to the host when the step deferred its read (Note
  // [Deferred reads] in core/deferred_read.h): value() waits for it (a host sync on a
  // GPU), so a policy reads it only when it needs it.
  DeferredScalar loss{0.0};
  Tensor x2;  // Transformers: the batch's target input ids (x holds the source's)
  // egeria, --freeze-reference-scope unit: the training model's input to the captured
  // unit (the output of the layer module before it), for the reference to start from.
  Tensor unit_input;
  // false: every sample of the global batch was left out (--skip-bad-images), so the step
  // has no loss and updated nothing; a policy takes no reading from it.
  bool trained = true;
  bool unit_scope = false;  // the reference runs the read units alone (Note [The reference's scope])
  // egeria, readings ahead of the front: the outputs of the layer modules capture_more()
  // asked for, by layer module.
  std::map<int64_t, Tensor> captured_more{};
};

// The training losses of the steps since the last clear(), summed on the host (Note
// [Deferred reads]): add() keeps a step's loss unread and reads the older ones lagged (a
// later step's kernels are queued behind each but the newest); sum() reads the newest
// too (a host sync on a GPU: at a policy's check steps and checkpoints only).
class StepLosses {
 public:
  void add(const DeferredScalar& loss);
  double sum() const;
  int64_t count() const { return n_; }
  double mean() const { return n_ > 0 ? sum() / double(n_) : 0.0; }
  void clear() { restore(0, 0); }
  void restore(double sum, int64_t count);  // a checkpoint's sum() and count()

 private:
  void read(bool all) const;
  mutable std::vector<DeferredScalar> unread_;
  mutable double sum_ = 0;
  int64_t n_ = 0;
};

class FreezePolicy {
 public:
  virtual ~FreezePolicy() = default;
  // Before the forward of step `step` (0-based): the layer module (not unit) whose
  // output the trainer should capture for this step, or -1.
  virtual int64_t capture_module(int64_t /*step*/) const { return -1; }
  // With a capture_module, more layer modules whose outputs the trainer should capture
  // (StepInfo::captured_more).
  virtual std::vector<int64_t> capture_more(int64_t /*step*/) const { return {}; }
  // After the optimizer step. `captured` is the captured module output and `x` the input
  // batch on the host, the reference model's (both undefined when no capture was asked
  // for); gradients are still in place.
  virtual void after_step(const StepInfo& s, const Tensor& x, const Tensor& captured, models::Model& m) = 0;
  // The units that should be frozen now (Note [Frozen sets]).
  virtual UnitSet frozen_units() const = 0;
  // Decisions and evaluations since the last call, as freeze.jsonl lines.
  virtual std::vector<nlohmann::json> take_log() { return {}; }
  // Everything needed to continue the same decisions after a resume.
  virtual nlohmann::json state() const { return nlohmann::json::object(); }
  virtual void load_state(const nlohmann::json&) {}
  // Tensors of that state (egeria: the reference model's snapshot), checkpointed with it.
  virtual std::map<std::string, Tensor> state_tensors() const { return {}; }
  virtual void load_state_tensors(const std::map<std::string, Tensor>&) {}
  // Figures for summary.json (evaluations_dropped, reference seconds, ...).
  virtual nlohmann::json stats() const { return nlohmann::json::object(); }
  // Returns once nothing of the policy runs beside training (Egeria: its reference's
  // readings in flight are done; their results wait for the next step as before).
  virtual void quiesce() {}
};

// `num_modules` is the model's number of layer modules; the policy counts in units of
// c.partition (one per layer module when it is empty).
std::unique_ptr<FreezePolicy> make_policy(const PolicyConfig& c, int64_t num_modules);
std::vector<std::string> policy_names();

// Freezes the layer modules `layers` (ascending indices) and unfreezes the rest (frozen
// parameters drop their gradients: they own no gradient memory while frozen). Returns
// true on a change.
bool apply_frozen_layers(models::Model& m, const std::vector<int64_t>& layers);
// Freezes layer modules [0, k) and unfreezes the rest.
bool apply_frozen_prefix(models::Model& m, int64_t k);
}  // namespace eg::freeze
