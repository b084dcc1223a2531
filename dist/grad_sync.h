// Data-parallel gradient synchronisation: every step, each gradient bucket of the
// optimizer (optim/buckets.h) is summed over the ranks, overlapped with backward.
//
// Note [Overlapped gradient sync]
// - The unit of communication is the optimizer's bucket. A frozen parameter is in no
//   bucket (the buckets are rebuilt at every freeze and unfreeze), so it is never sent:
//   the bytes per step fall by exactly the frozen parameters' bytes. PyTorch DDP keeps
//   all-reducing a parameter frozen after wrapping.
// - Buckets are in gradient-ready order (the reverse of the parameters'), and the engine
//   announces each parameter whose gradient is final (Note [Gradient-ready hook]). When
//   every member of the next bucket is final, its all-reduce is handed to the
//   communication thread; buckets are launched strictly in bucket order, so every rank
//   issues the same collectives in the same order. After backward, buckets still not
//   launched (members the graph did not reach) are launched, and the step waits for all.
// - On GPUs (NCCL) a launch only enqueues the all-reduce on a communication stream,
//   ordered after the gradients by CUDA events (Note [NCCL stream ordering]): it is made
//   from the training thread, and no thread is needed. The compute stream waits for
//   them once, after backward (finish()), so the rest of backward runs beside them.
// - The communication thread exists because Debian's OpenMPI makes no asynchronous
//   progress: a nonblocking all-reduce started by the training thread would only move
//   when that thread next calls MPI. The thread sleeps on a condition variable when idle
//   and runs only the communicator's calls (no OpenMP op), so it takes no core from the
//   training thread's team except while it reduces.
// - The gradients are summed, not averaged: the loop scales each rank's loss by its share
//   of the global sample (or token) count before backward, so the sum is the gradient of
//   the global mean (Strategy::step, dist/strategy.h).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dist/communicator.h"
#include "optim/buckets.h"

namespace eg::dist {

struct GradSyncStats {
  int64_t bytes = 0;  // sent (all-reduced) by this rank over the run, in the wire dtype
  int64_t last_step_bytes = 0;
  int64_t steps = 0;
  int64_t buckets_launched_in_backward = 0;  // launched before backward ended: overlap
  int64_t buckets = 0;
  double wait_seconds = 0;  // the training thread's wait for communication after backward
  double comm_seconds = 0;  // time inside the all-reduces (on a host communicator)
  // On a GPU (NCCL): the device time the compute stream stood waiting for the all-reduces
  // after backward (CUDA events, Communicator::join_wait_seconds), over this many steps.
  double device_wait_seconds = 0;
  int64_t device_waits_timed = 0;
};

// The ranks' agreement before each backward (Note [Data-parallel training] in
// dist/strategy.h): every rank's loss sum and sample count, summed in rank order (the same
// bits on every rank), and the check that every rank is about to all-reduce the same
// buckets (their layout hashes, optim::GradBuckets::layout_hash): a mismatch throws on
// every rank, naming the rank, instead of mixing unrelated gradients or hanging.
struct StepTotals {
  double loss_sum = 0, count = 0;
};
StepTotals agree_on_step(Communicator& comm, double loss_sum, double count, uint64_t layout, int64_t step);

// How the buckets travel (--grad-sync-overlap, --grad-sync-dtype).
struct GradSyncOptions {
  bool overlap = true;  // false: every bucket is all-reduced after backward, on the calling thread
  // f32, or bf16: each bucket is rounded to bf16 for the all-reduce (half the bytes, as
  // DDP's bf16_compress_hook), summed in f32 where the backend allows, and widened back
  // into the f32 bucket. Every rank gets the same bits either way.
  DType dtype = DType::f32;
};

class GradSync {
 public:
  GradSync(Communicator& comm, GradSyncOptions o);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Before backward: this step's buckets (after the optimizer's zero_grad()) over `params`.
  void begin(const optim::GradBuckets& buckets, const std::vector<Tensor>& params);
  // Runs loss.backward() with the gradient-ready hook installed (nothing when `loss` is
  // undefined: a rank with no samples this step still joins every all-reduce).
  void backward(const Tensor& loss);
  // The hook: `leaf`'s gradient is final in this backward.
  void ready(const TensorImpl* leaf);
  // After backward: launches the rest, in order, waits for every bucket, and widens
  // bf16 ones back into the buckets.
  void finish();

  const GradSyncStats& stats() const { return stats_; }
  // Carried over a resume (the run's total bytes).
  void set_bytes(int64_t bytes) { stats_.bytes = bytes; }

 private:
  void launch(size_t b);
  void worker();

  Communicator& comm_;
  const GradSyncOptions o_;
  const bool use_thread_;  // overlap on a host communicator
  std::unordered_map<const TensorImpl*, size_t> bucket_of_;
  std::vector<int64_t> pending_;  // members whose gradient is not final yet, per bucket
  std::vector<Tensor> flats_;
  std::vector<Tensor> wire_;  // what is all-reduced: the flats, or their bf16 copies
  size_t next_ = 0;  // the next bucket to launch
  GradSyncStats stats_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  size_t done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace eg::dist
