// The training loop's state (train/run.cpp) and what a checkpoint holds beyond it: the
// model's and optimizer's tensors, the freezing state, the task's own state, every rank's
// RNG state, the world size and the gradient sync's byte count; and how a resume puts
// them back.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/strategy.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/task.h"

namespace eg::optim {
class Optimizer;
}

namespace eg::train {

class FreezeRun;

// A split's metrics by split name ("valid", "test").
using SplitMetrics = std::map<std::string, Metrics>;

// The loop's own counters: everything a resumed run needs to carry on as the
// uninterrupted one would. JSON only at the checkpoint boundary.
struct LoopState {
  int64_t epoch = 0, batch = 0;  // where the next step is: its epoch and batch in it
  int64_t step = 0;  // steps taken
  double train_seconds = 0;
  int64_t samples = 0;  // trained on, every rank's
  double epoch_loss_sum = 0;  // this epoch's step losses so far, and their number
  int64_t epoch_loss_n = 0;
  int64_t best_epoch = 0;  // 1-based; 0: none evaluated yet
  SplitMetrics best, last;  // the best epoch's and the last epoch's evaluations
  double time_to_target = -1;  // train_seconds when --target-accuracy was reached; -1: not yet

  nlohmann::json to_json() const;
  static LoopState from_json(const nlohmann::json& state);
};

// The value of `name` in `split`'s metrics, or `otherwise`.
double metric(const SplitMetrics& m, const std::string& split, const std::string& name, double otherwise = 0);

// The loop's parts a checkpoint is made from and restored into.
struct RunParts {
  models::Model& model;
  optim::Optimizer& opt;
  FreezeRun& freezing;
  Task& task;
  dist::Strategy& strategy;
};

// Collective (every rank calls it before each checkpoint): averages the BatchNorm running
// statistics over the ranks, gathers every rank's RNG state, and returns the state to
// write (the loop's, the freezing's, the task's, the RNGs', the world size, the global
// batch, the sync's bytes) with the tensors (model/, optim/, freeze/).
struct CheckpointContents {
  TensorMap tensors;
  nlohmann::json state;
};
CheckpointContents checkpoint_contents(RunParts& p, const LoopState& loop, int64_t global_batch);

// Puts `ck` back into the run after checking it: every result-affecting option of
// `recorded` (the run's options as config.json records them) and every value the task
// resolved must equal the checkpoint's. Loads the tensors, the freezing and task state and
// this rank's RNG state, and returns the loop's state.
LoopState restore_checkpoint(const Checkpoint& ck, RunParts& p, const TrainConfig& recorded, int64_t steps_per_epoch);

}  // namespace eg::train
