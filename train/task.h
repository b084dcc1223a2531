// What a task plugs into the training loop (train/run.h): the data, the model, one
// batch's forward and loss, and evaluation. The loop owns everything else: the epochs
// and steps, the optimizer and LR schedule, checkpoints and resume, the logs and the
// progress line, the NaN stop, the best epoch, and the freezing hooks.
//
// Note [The task interface]
// The split follows PyTorch Lightning's LightningModule/Trainer: a task says what a batch
// is and how it is scored, and never sees the optimizer, the files or the step count, so
// that every run (image classification, translation, a user's own model) resumes, logs
// and freezes in the same way. Unlike Lightning, a task is stateful about its data: the
// loop asks it to start an epoch at a batch (a resume point) and to load the next batch,
// and the task must make the batches of (epoch, batch index) a pure function of the seed,
// so that a resumed run sees exactly the batches the uninterrupted one would have.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "freeze/policy.h"
#include "models/model.h"
#include "train/config.h"

namespace eg::train {

class FreezeRun;  // train/freezing.h

// One training batch's forward, as the loop needs it.
struct StepOutput {
  // Scalar: the mean over the batch's `samples`. The loop checks it is finite and calls
  // backward on it. Undefined when this rank's share of the global batch is empty.
  Tensor loss;
  int64_t samples = 0;  // what the loss is a mean over and the throughput counts: images, or target tokens
};

// A split's figures by name ("loss", "accuracy", "bleu"); logged as "<split>_<name>".
using Metrics = std::map<std::string, double>;

enum class Split { valid, test };

class Task {
 public:
  virtual ~Task() = default;

  // ---- set-up: called once, before anything else, with the run's configuration and the
  // ranks it trains on (data parallelism: see Note [Data-parallel training] in dist/strategy.h).
  // --batch-size is per rank: a task loads this rank's share of each global batch, and
  // evaluates its share of each split, reducing sums and counts over `comm`. Every call
  // below is made on every rank, in the same order.
  virtual void setup(const TrainConfig& c, dist::Communicator& comm) = 0;
  virtual models::Model& model() = 0;
  // Lines printed once the data and model are ready (sizes, vocabulary); may be empty.
  virtual std::string description() const { return ""; }
  // What the task resolved beside the options (an architecture, a tokenizer): written
  // into config.json and checked on --resume to equal the checkpoint's.
  virtual nlohmann::json resolved() const { return nlohmann::json::object(); }
  // The generator of the task's randomness during training (dropout); its state is in
  // every checkpoint. The built-in tasks give the one their model was built with.
  virtual Generator& generator() { return default_generator(); }
  // The freezing policy's view of the model: how to build a reference, its input shape.
  virtual void configure_freezing(freeze::PolicyConfig&) const {}
  // Called once the loop's freezing state exists (the activation cache attaches here).
  virtual void attach(FreezeRun&) {}
  // One input sample's shape ([C, H, W] for images), written beside a run's weights and
  // checked when a run starts from them (--init-from); empty where samples vary (sentences).
  virtual Shape sample_shape() const { return {}; }
  // Units of the throughput: "images" or "tokens" (logged as "<unit>_per_second").
  virtual std::string unit() const { return "images"; }

  // ---- training data. The batches of an epoch, from `first_batch` on.
  virtual int64_t batches_per_epoch() const = 0;
  virtual void start_epoch(int64_t epoch, int64_t first_batch) = 0;
  // Loads this rank's share of the next batch; false at the epoch's end.
  virtual bool next_batch() = 0;
  // The loaded batch's forward and loss. The forward goes through freezing.forward() (the
  // frozen prefix under no-grad, or from the activation cache), which also hands the
  // batch and the captured outputs to the freezing policy.
  virtual StepOutput training_step(FreezeRun& freezing) = 0;
  // --cuda-graphs on (Note [Graphed steps] in train/graphed_step.h): a task whose step a
  // CUDA graph can capture splits training_step in two. stage_graph_batch() moves the
  // loaded batch into tensors the task keeps, outside the graph (GraphInput: batches of
  // every shape at the addresses the graphs read); it returns the batch's shape (a graph
  // serves batches of one shape), its sample count (0: this rank's share is empty, and the
  // step is training_step's) and how often those tensors have moved (every graph made
  // before a move is dropped). graph_forward() is the rest of training_step, from those
  // tensors; it runs inside a capture, so it makes no host sync.
  struct GraphBatch {
    std::vector<int64_t> shape;
    int64_t samples = 0;
    int64_t moves = 0;
  };
  virtual bool graphable() const { return false; }
  // Graphs held at once unless --cuda-graph-limit says: one for a task whose batches take
  // one shape but for a few (an epoch's short last one, whose steps then run eagerly
  // rather than hold a second step's activations on the GPU).
  virtual int64_t default_graph_limit() const { return 1; }
  virtual GraphBatch stage_graph_batch() { EG_THROW("internal: this task's step is not captured as a CUDA graph"); }
  virtual StepOutput graph_forward(FreezeRun& /*freezing*/) {
    EG_THROW("internal: this task's step is not captured as a CUDA graph");
  }

  // ---- evaluation (the model is put in eval mode by the loop and back after).
  // The splits evaluated at every epoch's end; the first picks the best epoch. A test
  // split left out here is evaluated once, at the end.
  virtual std::vector<Split> epoch_splits() const = 0;
  // The split's metrics over every rank (each evaluates its share).
  virtual Metrics evaluate(Split s) = 0;
  // The same without what is slow to compute (translation's BLEU decodes every sentence):
  // the loss at least, for --eval-every's lines between epochs.
  virtual Metrics evaluate_loss(Split s) { return evaluate(s); }
  // The metric that picks the best epoch, and whether higher is better.
  virtual std::string selection_metric() const = 0;
  virtual bool higher_is_better() const = 0;
  // summary.json fields of the task's own (parameters, FLOPs, vocabulary).
  virtual void summarize(nlohmann::json&) const {}

  // ---- the task's own state in checkpoints (counts that must survive a resume). save_state
  // is collective (every rank calls it before each checkpoint; rank 0's `state` is written).
  virtual void save_state(nlohmann::json&) {}
  virtual void load_state(const nlohmann::json&) {}
};

}  // namespace eg::train
