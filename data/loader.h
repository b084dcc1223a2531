// Batches from an in-memory image dataset, built by background worker threads into
// a bounded prefetch window: the workers load samples, a few at a time, into the oldest
// batch still being built (so one batch is built by every worker at once, not one worker
// a batch). The order of an epoch is a pure function of
// (seed, epoch) and the augmentation of a sample a pure function of
// (seed, epoch, sample id) (with augment_variants, of (seed, epoch mod V, sample id)), so a
// run resumed at (epoch, batch) sees exactly the batches the uninterrupted run would have,
// and the activation cache can ask which sample ids come next (upcoming_ids).
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"

namespace eg::data {

struct Batch {
  Tensor x;  // f32 [B, C, H, W], or u8 pixels (Loader::pixels)
  Tensor y;  // s64 [B]
  std::vector<int64_t> ids;  // sample ids, in batch order
  int64_t index = 0;  // batch index within the epoch
  // With LoaderOptions::skip_bad: the samples that could not be loaded and were left out
  // of this batch (x, y and ids hold the others), with the reason.
  std::vector<std::pair<int64_t, std::string>> left_out;
};

// A sample that cannot be loaded (an unreadable or undecodable image file). It stops the
// loader, as any error does, unless LoaderOptions::skip_bad leaves the sample out of its
// batch. A user's SampleSource throws it for the same choice.
class BadSample : public Error {
 public:
  using Error::Error;
};

// What the loader draws samples from: an in-memory image dataset with its augmentation
// (the Loader's ImageDataset constructor), image files (data/image_folder.h), or a
// user's own data.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual Shape sample_shape() const = 0;  // one sample's: [C, H, W]
  virtual int64_t label(int64_t id) const = 0;
  // Sample `id` as the network sees it, f32 [C, H, W] into `out`: a pure function of
  // (seed, epoch, id), so that resumed, cached and data-parallel runs see the same
  // samples. Called from the loader's worker threads at once.
  virtual void load(int64_t id, uint64_t seed, int64_t epoch, float* out) const = 0;
  // Optional: sample `id` as 8-bit pixels, u8 [C, H, W] into `out`, before the
  // normalisation that load() applies: load() writes exactly float(p) * scale[c] + zero[c]
  // of these pixels p with pixel_affine()'s values. A source with pixels lets the loader
  // build batches of them (LoaderOptions::pixels), a quarter of the bytes on their way to
  // a GPU, normalised there (ops::image_normalize).
  virtual bool has_pixels() const { return false; }
  virtual void load_pixels(int64_t id, uint64_t seed, int64_t epoch, uint8_t* out) const;
  virtual PixelAffine pixel_affine() const;
};

// An in-memory image dataset as a sample source: sample `id` cropped, flipped and
// normalised as `aug` says (augment_into), drawn from (seed, epoch, id).
std::shared_ptr<const SampleSource> image_samples(std::shared_ptr<const ImageDataset> d, const AugmentOptions& aug);

// The `epoch` a loader passes to SampleSource::load in epoch `epoch`: the epoch itself
// (variants 0: a new augmentation every epoch), or epoch mod V (V >= 1: each sample in
// at most V augmentations for the whole run, taken in turn, each the same whenever it
// comes back).
inline int64_t augmentation_epoch(int64_t epoch, int64_t variants) { return variants > 0 ? epoch % variants : epoch; }

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  bool drop_last = true;
  bool augment = false;
  // Which augmentation each epoch loads (augmentation_epoch): 0, a new one every epoch;
  // V >= 1, the sample's V fixed ones in turn (1: one per sample for the whole run). A
  // fixed one is stateless, as the activation cache needs: an entry per sample and
  // augmentation (Note [Activation cache validity]).
  int64_t augment_variants = 0;
  AugmentOptions aug;
  int workers = 1;
  int prefetch = 4;  // batches built ahead of the consumer (being built or ready)
  uint64_t seed = 0;
  // Data-parallel training: this rank's share of every global batch of
  // batch_size x shards samples, the positions shard_rank, shard_rank + shards, ... of it
  // (as PyTorch's DistributedSampler interleaves). The epoch's order and each sample's
  // augmentation do not depend on the sharding.
  int shard_rank = 0, shards = 1;
  // A sample whose load throws BadSample is left out of its batch (Batch::left_out) instead
  // of stopping the loader: the batch is that much shorter, possibly empty.
  bool skip_bad = false;
  // Batches of 8-bit pixels (Batch::x u8, normalised by the consumer with the source's
  // pixel_affine()) where the source has them (SampleSource::has_pixels), else f32.
  bool pixels = false;
};

class Loader {
 public:
  Loader(std::shared_ptr<const ImageDataset> data, LoaderOptions o);  // augmented as `o` says
  Loader(std::shared_ptr<const SampleSource> source, LoaderOptions o);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Starts (or resumes) an epoch at batch `start_batch`.
  void start_epoch(int64_t epoch, int64_t start_batch = 0);
  // The next batch of the epoch, or false at its end. Rethrows the error that building
  // this batch met (a later batch's waits for its turn).
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
  // Batch::x holds 8-bit pixels (LoaderOptions::pixels and a source that has them); they
  // become the network's input as float(p) * scale[c] + zero[c] with the source's map.
  bool pixels() const { return pixels_; }
  PixelAffine pixel_affine() const { return data_->pixel_affine(); }

 private:
  // A batch being built: every slot a sample, loaded by whichever worker claims it.
  struct Building {
    Batch b;  // x and y with a row per position
    std::vector<int64_t> ids;  // the sample at each position
    std::vector<std::string> bad;  // a left-out sample's reason ("" when it loaded)
    int64_t n = 0, next = 0, done = 0;  // positions; the first unclaimed; the finished
    std::exception_ptr error;  // the first error that stops the loader
  };
  void stop_workers();
  void worker_loop();
  Building& open_batch(int64_t index);  // with mu_ held
  void finish(int64_t index, Building& f);  // with mu_ held: into ready_ or failed_

  std::shared_ptr<const SampleSource> data_;
  LoaderOptions opt_;
  bool pixels_ = false;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0, consumed_ = 0, issued_ = 0, end_ = 0;
  std::map<int64_t, Building> building_;  // node addresses stay put while others come and go
  std::map<int64_t, Batch> ready_;
  std::map<int64_t, std::exception_ptr> failed_;  // batches whose build threw, by index
  bool stopping_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> threads_;
};

}  // namespace eg::data
