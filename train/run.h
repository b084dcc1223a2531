// The training loop: one for every task (train/task.h). It reads top to bottom in
// train/run.cpp: the process (device, threads), the task's data and model, the
// optimizer and schedule, the output directory and resume, the epochs and steps with
// the freezing hooks, evaluation and the best epoch, and the summary.
#pragma once
#include <cstdint>
#include <string>

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
};

// Trains `task` as `c` says, writing c.out's files: config.json, metrics.jsonl,
// freeze.jsonl, checkpoint.safetensors (and checkpoint-<step>.safetensors with
// --keep-checkpoints), best.safetensors (with a validation split), model.safetensors and
// summary.json. Throws eg::Error on bad input or a non-finite loss, after which the last
// good checkpoint is still in place.
Summary fit(Task& task, const TrainConfig& c);

}  // namespace eg::train
