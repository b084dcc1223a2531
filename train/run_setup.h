// The training loop's state and set-up phases (train/run.cpp's fit() is the recipe that
// calls them): the Run every phase works on; the process, the resume plan, the run's
// parts, its files, and the checkpoint (train/run_setup.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dist/strategy.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/freezing.h"
#include "train/graphed_step.h"
#include "train/run_state.h"
#include "train/task.h"

namespace eg::train {

// Everything one invocation of fit() holds, built phase by phase.
struct Run {
  Run(Task& t, const TrainConfig& given, dist::Communicator& comm)
      : given(given), c(given), dp(comm, given.device, given.grad_sync, given.loss_scale), task(t) {}

  const TrainConfig& given;
  TrainConfig c;  // as this process resolved it: its GPU, threads, workers, batch size
  dist::Strategy dp;
  Task& task;
  models::Model* model = nullptr;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::LrSchedule> sched;
  std::unique_ptr<FreezeRun> freezing;
  std::unique_ptr<Checkpoints> ckpts;
  nlohmann::json config;  // config.json
  std::string metrics;  // metrics.jsonl
  int64_t steps_per_epoch = 0, steps_this_run = 0;
  LoopState state;
  // This invocation's steps by their host syncs (Note [Host syncs] in core/device.h):
  // count -> steps. The most common count is the steady state's.
  std::map<int64_t, int64_t> steps_by_host_syncs;
  // The newest step while its loss is still on its way to the host (Note [Deferred
  // reads]): settle_loss() reads it, stops the run if it is not finite, and adds it to
  // the epoch's mean loss; behind the next step's kernels, or before anything reads the
  // loop's state or writes a file.
  struct PendingLoss {
    DeferredScalar loss, grad_norm;  // the norm with --grad-clip
    int64_t step = 0, epoch = 0, batch = 0;  // the step's, as stop_not_finite names them
    bool trained = false;  // a sample of the global batch was kept
    // Loss scaling's, read late as the loss: the scale and the overflow flag; the step's
    // learning rate and whether its own log line comes (else an overflow logs it here).
    DeferredScalar loss_scale, overflow;
    double lr = 0;
    bool logs = false;
    int64_t count = 0;  // its samples (target tokens) of every rank
  };
  std::optional<PendingLoss> pending;
  // --cuda-graphs on: the captured steps (a graph per batch shape), and what they were
  // captured with (the frozen layer prefix, the task's graph inputs' moves).
  std::unique_ptr<GraphedStep> graphed;
  std::vector<int64_t> graphs_valid_for;
  double last_loss = NAN, last_grad_norm = NAN;  // the newest settled step's (log and progress lines)
  double last_loss_scale = 0;
  bool last_overflow = false;

  bool lead() const { return dp.lead(); }
  RunParts parts() { return {*model, *opt, *freezing, task, dp}; }
  // config.json and the resume check see --device as given, not the GPU each rank took.
  TrainConfig as_recorded() const {
    TrainConfig r = c;
    r.device = given.device;
    return r;
  }
  void log(const nlohmann::json& line) const {
    if (lead()) append_json_line(metrics, line);
  }
};

// The process: threads, loader workers, convolution algorithms (config.json records them).
void set_up_process(Run& r);
// Every rank reads the checkpoint to resume from (none: a fresh run); its world size may
// change the per-rank batch.
std::optional<Checkpoint> plan_resume(Run& r);
// The task's data and model, the optimizer and schedule, the freezing.
void build_run(Run& r, bool resuming);
// The run's files: the checkpoint put back (into r.state), or a fresh directory; config.json.
void start_or_resume(Run& r, std::optional<Checkpoint>& ck);
// A checkpoint of the run as it is (collective; rank 0 writes), its last loss settled first.
void save_checkpoint(Run& r);
// The pending step's loss (and gradient norm) read (lagged: with later kernels queued
// behind it, so not a host sync), checked (a non-finite one stops the run, nothing saved)
// and the loss counted into the epoch's mean; nothing when no step is pending.
void settle_loss(Run& r, bool lagged);

}  // namespace eg::train
