// Batches from an in-memory image dataset, built by background worker threads into
// a bounded prefetch window. The order of an epoch is a pure function of
// (seed, epoch) and the augmentation of a sample a pure function of
// (seed, epoch, sample id) (or of (seed, sample id) with augment_per_sample), so a run resumed at (epoch, batch) sees exactly the
// batches the uninterrupted run would have, and the activation cache can ask which
// sample ids come next (upcoming_ids).
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace eg::data {

struct Batch {
  Tensor x;  // f32 [B, C, H, W]
  Tensor y;  // s64 [B]
  std::vector<int64_t> ids;  // sample ids, in batch order
  int64_t index = 0;  // batch index within the epoch
};

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  bool drop_last = true;
  bool augment = false;
  // The crop and flip of a sample: drawn anew every epoch (false), or once per sample
  // for the whole run (true: a function of (seed, sample id), stateless as the
  // activation cache needs; see Note [Activation cache validity]).
  bool augment_per_sample = false;
  AugmentOptions aug;
  int workers = 1;
  int prefetch = 4;  // batches built ahead of the consumer
  uint64_t seed = 0;
  // Data-parallel training: this rank's share of every global batch of
  // batch_size x shards samples, the positions shard_rank, shard_rank + shards, ... of it
  // (as PyTorch's DistributedSampler interleaves). The epoch's order and each sample's
  // augmentation do not depend on the sharding.
  int shard_rank = 0, shards = 1;
};

class Loader {
 public:
  Loader(std::shared_ptr<const ImageDataset> data, LoaderOptions o);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts (or resumes) an epoch at batch `start_batch`.
  void start_epoch(int64_t epoch, int64_t start_batch = 0);
  // The next batch of the epoch, or false at its end. Rethrows a worker's error.
  bool next(Batch& b);
  int64_t batches_per_epoch() const;  // global batches
  // The epoch-order positions of this rank's share of batch `index`.
  std::vector<int64_t> positions(int64_t index) const;
  int64_t epoch() const { return epoch_; }
  int64_t next_batch_index() const { return consumed_; }
  // Sample ids of the next `batches` batches, in order (fewer at the epoch's end).
  std::vector<int64_t> upcoming_ids(int64_t batches) const;
  // The permutation used for `epoch` (identity when not shuffling).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  void stop_workers();
  void worker_loop();
  Batch build(int64_t index) const;

  std::shared_ptr<const ImageDataset> data_;
  LoaderOptions opt_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0, consumed_ = 0, issued_ = 0, end_ = 0;
  std::map<int64_t, Batch> ready_;
  std::exception_ptr error_;
  bool stopping_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
};

}  // namespace eg::data
