// The training loop: one for every task (train/task.h). fit() in train/run.cpp is the
// recipe, each phase a function of its own: set up the process (threads, loader workers),
// plan the resume, build the run (the task's data and model, the optimizer and schedule,
// the freezing), then for each epoch its steps, its evaluation and its checkpoint; and
// the summary. The loop's state is one LoopState (train/run_state.h); data parallelism is
// one dist::Strategy (dist/strategy.h).
#pragma once
#include <cstdint>
#include <string>

#include "dist/communicator.h"
#include "train/config.h"
#include "train/task.h"

namespace eg::train {

struct Summary {
  double final_test_accuracy = 0, final_test_loss = 0, final_test_bleu = 0;
  // The best epoch is chosen on the validation split when there is one (--val-fraction,
  // translation's valid.tsv), else on test; these are its figures.
  int64_t best_epoch = 0;
  double best_test_accuracy = 0, best_valid_accuracy = 0, best_valid_loss = 0, best_valid_bleu = 0;
  double train_seconds = 0, images_per_second = 0, tokens_per_second = 0, time_to_target_seconds = -1;
  int64_t steps = 0;
  bool completed = false;  // false when --stop-after-steps ended the invocation
  std::string freeze_report;  // one line on the freezing (train/freezing.h); empty for none
  int64_t frozen_units_final = 0;  // freezing units frozen at the end
  // The share of the run's backward FLOPs that frozen units saved (freezes that an
  // unfreeze undid count too): above 0 when anything froze at any step.
  double backward_flops_saved_fraction = 0;
};

// Trains `task` as `c` says, writing c.out's files: config.json, metrics.jsonl,
// freeze.jsonl, checkpoint.safetensors (and checkpoint-<step>.safetensors with
// --keep-checkpoints), best.safetensors (with a validation split), model.safetensors and
// summary.json. Throws eg::Error on bad input or a non-finite loss, after which the last
// good checkpoint is still in place. Trains on the process's ranks (dist::world()), or on
// `comm`'s: see Note [Data-parallel training] in dist/strategy.h.
Summary fit(Task& task, const TrainConfig& c);
Summary fit(Task& task, const TrainConfig& c, dist::Communicator& comm);

}  // namespace eg::train
