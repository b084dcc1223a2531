// What a checkpoint of the training loop (train/run.cpp) holds beyond the loop's own
// counters, and how a resume puts it back: the model's and optimizer's tensors, the
// freezing state, the task's own state, every rank's RNG state, the world size and the
// gradient sync's byte count.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

#include "dist/communicator.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/task.h"

namespace eg::optim {
class Optimizer;
}
namespace eg::dist {
class GradSync;
}

namespace eg::train {

class FreezeRun;

// The loop's parts a checkpoint is made from and restored into.
struct RunParts {
  models::Model& model;
  optim::Optimizer& opt;
  FreezeRun& freezing;
  Task& task;
  dist::Communicator& comm;
  dist::GradSync* sync = nullptr;  // data-parallel runs only
};

// Collective (every rank calls it before each checkpoint): averages the BatchNorm running
// statistics over the ranks, gathers every rank's RNG state, adds the parts' fields to
// `state` (freezing, task, RNG, world size, global batch, sync bytes) and returns the
// tensors to write (model/, optim/, freeze/).
TensorMap checkpoint_contents(RunParts& p, nlohmann::json& state, int64_t global_batch);

// Puts `ck` back into the run after checking it: every result-affecting option of
// `recorded` (the run's options as config.json records them) and every value the task
// resolved must equal the checkpoint's. Loads the tensors, the freezing and task state and
// this rank's RNG state; `state` takes the checkpoint's fields.
void restore_checkpoint(const Checkpoint& ck, RunParts& p, const TrainConfig& recorded, int64_t steps_per_epoch,
                        nlohmann::json& state);

}  // namespace eg::train
