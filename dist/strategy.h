// Data-parallel training as one object: which ranks train, on which device, how a step's
// loss and gradients are combined over them, and who writes. The training loop
// (train/run.cpp) and `egeria bench step` (train/trainer.cpp) run their steps through it.
//
// Note [Data-parallel training]
// Under an MPI launcher (mpirun -np N egeria train ...) every rank runs fit() on the same
// configuration and one Strategy joins them; started plainly, it is the world of one.
// The strategy is chosen once, from the world size and the device: a single process, CPU
// ranks (gradients over the host communicator, MPI), or GPU ranks (one GPU each,
// cuda:<local rank> unless --device names one; gradients over NCCL).
// - --batch-size is per rank; a global batch is N of them. Each epoch's order is a pure
//   function of (seed, epoch) and each rank takes an interleaved share of every global
//   batch (the tasks' loaders), so the global batches do not depend on N.
// - Each step the ranks exchange their loss sums and sample (token) counts and a hash of
//   their gradient buckets' layout, before backward: the loss is normalised by the global
//   count (each rank's mean is scaled by its share of the count, and the gradients are
//   summed), a NaN on any rank stops every rank at the same step, and ranks that would
//   all-reduce different buckets stop with an error instead of hanging. GPU ranks
//   exchange the counts and layouts alone and all-reduce the loss on the device, read a
//   step late (Note [Deferred reads across ranks] in dist/strategy.cpp).
// - The gradient buckets are all-reduced during backward (dist/grad_sync.h); frozen
//   parameters are in no bucket and never sent. The freezing policy runs on rank 0 and
//   its decision reaches every rank after every step (Note [Freezing across ranks]).
// - BatchNorm keeps per-rank batch statistics, as PyTorch DDP; running statistics are
//   averaged over the ranks before every evaluation and checkpoint and whenever the
//   frozen set changes. Evaluation is sharded and reduced from counts.
// - Rank 0 alone writes the run's files. Every rank reads the checkpoint on --resume (so
//   --out must be on storage every rank sees). A checkpoint records the world size and the
//   global batch; a resume on another number of ranks keeps the global batch, adjusting
//   --batch-size (refused when it does not divide).
// - Each rank's dropout draws from a generator of its own; their states are in the
//   checkpoint, so a resume on the same number of ranks is bit-identical on the CPU.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/deferred_read.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/grad_sync.h"
#include "optim/loss_scaler.h"

namespace eg::models {
class Model;
}
namespace eg::optim {
class Optimizer;
}

namespace eg::dist {

// What one training step came to over every rank.
struct StepResult {
  double loss = 0;  // the global mean (NaN while deferred)
  int64_t count = 0;  // samples (target tokens) of every rank
  double grad_norm = 0;  // before clipping; NaN without clipping
  // What was not finite when the step stopped before backward (the loss) or before the
  // optimizer (the gradient norm).
  enum class NotFinite { none, loss, grad_norm } not_finite = NotFinite::none;
  // Loss scaling (optim/loss_scaler.h): the scale this step's loss was multiplied by (0:
  // no scaling), and whether its gradients overflowed, so the optimizer step was skipped.
  double loss_scale = 0;
  bool skipped_overflow = false;
  // One process, or GPU ranks, without loss scaling read nothing in the step (Note
  // [Deferred reads] in core/deferred_read.h, Note [Deferred reads across ranks] in
  // dist/strategy.cpp): `loss_later` holds the loss on its way to the host, and a
  // non-finite one shows only there, after its backward and optimizer step were queued;
  // the caller stops before anything is saved (train/run.cpp). The other paths (CPU
  // ranks, loss scaling) read the loss in the step (`loss`; `loss_later` holds it too).
  bool deferred = false;
  DeferredScalar loss_later;
  DeferredScalar grad_norm_later;  // with clipping: the norm, as the loss (undefined without)
  // A deferring step with loss scaling: loss_scale and skipped_overflow, as the loss.
  DeferredScalar loss_scale_later, overflow_later;
};

// The outputs of a step left on the device (Strategy::step_on_device).
struct DeviceStep {
  Tensor loss;  // the mean loss, one f32 or f64 element; undefined without samples
  Tensor grad_norm;  // with clipping: the norm before clipping, one f64 element
  // With loss scaling: the scale this step's loss was multiplied by (f64 [1]) and whether
  // its gradients overflowed (f32 [1]: the step was skipped).
  Tensor loss_scale, found_inf;
};

// A step left on the device as its caller reads it: everything on its way to the host
// (StepResult::deferred).
StepResult deferred_result(const DeviceStep& d, int64_t samples, double grad_clip);

// The device a rank of `size` trains on, from --device: "cuda" is cuda:<local rank>, one
// GPU a rank; a named GPU (cuda:N) serves one rank a host only, as ranks sharing a GPU
// would contend for it (NCCL refuses them); cpu is every rank's. Throws on a shared GPU.
std::string rank_device_name(const std::string& device, int size, int local_rank, int local_size);

class Strategy {
 public:
  enum class Kind { single, cpu_ranks, gpu_ranks };

  // `device` as --device gives it ("cpu", "cuda", "cuda:1"); throws when it names a GPU
  // this build or machine lacks. `sync`: how the gradient buckets travel; `scaling`: the
  // loss scaling of 16-bit gradients.
  Strategy(Communicator& comm, const std::string& device, GradSyncOptions sync, optim::LossScaleOptions scaling = {});
  ~Strategy();
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  Kind kind() const { return kind_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  bool lead() const { return comm_.rank() == 0; }  // writes the files and prints
  // The host communicator: tasks shard their data and reduce their metrics over it.
  Communicator& comm() const { return comm_; }
  Device device() const { return device_; }  // this rank's
  // This rank's seed of its own dropout stream (rank 0's is the single-process run's).
  uint64_t rank_seed(uint64_t seed) const;
  // "data-parallel over 2 ranks (mpi): ..." for rank 0 to print; empty for one process.
  std::string describe(int64_t batch_size, int threads) const;

  // One step after the forward: the global loss (agreed over the ranks, scaling this
  // rank's `loss`, a mean over its `samples`, by its share of the global count), backward
  // with the gradient sync (and the loss scale, when scaling), clipping to `grad_clip`
  // (> 0), and the optimizer's step when any rank had a sample. Stops before backward
  // (non-finite loss) or before the optimizer (non-finite gradient norm), saying which in
  // the result; under loss scaling a non-finite gradient skips the step instead. One
  // process, or GPU ranks, without scaling defer the reads of the loss and of the
  // gradient norm instead (StepResult::deferred).
  StepResult step(const Tensor& loss, int64_t samples, optim::Optimizer& opt, int64_t step, double grad_clip);

  // Whether step() is all device work (one process), as a CUDA graph can capture it (Note
  // [Graphed steps] in train/graphed_step.h).
  bool steps_on_device() const;
  // That step with nothing read nor sent to the host: backward (from the loss times the
  // scale, with loss scaling), the unscale and its flag, clipping, the optimizer's step
  // (when `samples` > 0; skipped on the device at an overflow), the scale's update; the
  // loss (f32 or f64, a 16-bit one widened), the norm before clipping (undefined
  // without), the scale and the flag are left on the device. With loss scaling the loss
  // is f32.
  DeviceStep step_on_device(const Tensor& loss, int64_t samples, optim::Optimizer& opt, double grad_clip);

  // Every rank's BatchNorm running statistics become their mean over the ranks (in place).
  void average_running_stats(models::Model& m) const;

  // The gradient sync's figures (data-parallel runs only).
  const GradSync* sync() const { return sync_.get(); }
  // Checkpoints and summary.json: the gradient sync's byte count and statistics, the
  // loss scaler's state.
  void save(nlohmann::json& state) const;
  void load(const nlohmann::json& state);
  void summarize(nlohmann::json& summary) const;

 private:
  // step() with the loss read at once: data parallelism agrees on it, scaling acts on it
  // before the optimizer.
  StepResult step_reading(const Tensor& loss, int64_t samples, optim::Optimizer& opt, int64_t step, double grad_clip);
  // step() of ranks whose gradient communicator enqueues (GPU ranks, NCCL): nothing read
  // in the step (Note [Deferred reads across ranks] in dist/strategy.cpp).
  StepResult step_ranks_deferred(const Tensor& loss, int64_t samples, optim::Optimizer& opt, int64_t step,
                                 double grad_clip);
  Communicator& grad_comm() const { return nccl_ ? *nccl_ : comm_; }

  Communicator& comm_;
  Kind kind_ = Kind::single;
  Device device_;
  Device prev_training_device_;  // this thread's, put back when the run ends (Note [Host syncs])
  GradSyncOptions sync_options_;
  optim::LossScaler scaler_;
  std::unique_ptr<Communicator> nccl_;  // GPU ranks' gradients
  std::unique_ptr<GradSync> sync_;
};

}  // namespace eg::dist
