// The training loop: one for every task (train/task.h). It reads top to bottom in
// train/run.cpp: the process (device, threads), the task's data and model, the
// optimizer and schedule, the output directory and resume, the epochs and steps with
// the freezing hooks, evaluation and the best epoch, and the summary.
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

// Note [Data-parallel training]
// Under an MPI launcher (mpirun -np N egeria train ...) every rank runs fit() on the same
// configuration and `comm` joins them; started plainly, comm is the local world of one.
// - --batch-size is per rank; a global batch is N of them. Each epoch's order is a pure
//   function of (seed, epoch) and each rank takes an interleaved share of every global
//   batch (the tasks' loaders), so the global batches do not depend on N.
// - Each step the ranks exchange their loss sums and sample (token) counts and a hash of
//   their gradient buckets' layout, before backward: the loss is normalised by the global
//   count (each rank's mean is scaled by its share of the count, and the gradients are
//   summed), a NaN on any rank stops every rank at the same step, and ranks that would
//   all-reduce different buckets stop with an error instead of hanging.
// - The gradient buckets are all-reduced during backward (dist/grad_sync.h); frozen
//   parameters are in no bucket and never sent. The freezing policy runs on rank 0 and
//   its decision reaches every rank after every step (Note [Freezing across ranks]).
// - BatchNorm keeps per-rank batch statistics, as PyTorch DDP; running statistics are
//   averaged over the ranks before every evaluation and checkpoint. Evaluation is
//   sharded and reduced from counts.
// - Rank 0 alone writes the run's files. Every rank reads the checkpoint on --resume (so
//   --out must be on storage every rank sees). A checkpoint records the world size and the
//   global batch; a resume on another number of ranks keeps the global batch, adjusting
//   --batch-size (refused when it does not divide).
// - Each rank's dropout draws from a generator of its own; their states are in the
//   checkpoint, so a resume on the same number of ranks is bit-identical on the CPU.

// Trains `task` as `c` says, writing c.out's files: config.json, metrics.jsonl,
// freeze.jsonl, checkpoint.safetensors (and checkpoint-<step>.safetensors with
// --keep-checkpoints), best.safetensors (with a validation split), model.safetensors and
// summary.json. Throws eg::Error on bad input or a non-finite loss, after which the last
// good checkpoint is still in place. Trains on the process's ranks (dist::world()), or on
// `comm`'s: see Note [Data-parallel training].
Summary fit(Task& task, const TrainConfig& c);
Summary fit(Task& task, const TrainConfig& c, dist::Communicator& comm);

}  // namespace eg::train
