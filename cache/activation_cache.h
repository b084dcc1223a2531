// The activation cache of the frozen prefix (the paper's §4.3): the output of the
// frozen front layer modules for each training sample, stored by sample id and
// gathered ahead of use by a background thread (the loader knows which ids come
// next). A step whose whole batch is cached skips the prefix's forward as well as its
// backward.
//
// Where entries live: the paper stores them on disk and prefetches them to GPU memory,
// which is small. Training on the CPU, main memory is that device memory, and a store
// through a file mapping costs page writeback, which slows the epoch that fills the
// cache (docs/DESIGN.md has the figures). So Tier::automatic keeps the entries in memory when they
// take at most half of the memory available at the time (shared equally between the
// data-parallel ranks on the machine), and in the file otherwise;
// Tier::disk always uses the file.
//
// Note [Activation cache validity]
// An entry stands for "the frozen prefix applied to this sample's input". It stays
// true only while (1) the prefix is the same modules with the same weights: the cache
// is keyed by the prefix and the trainer starts a new store whenever the frozen prefix
// changes (a freeze moves the boundary: the old store, still true, is kept below it,
// Note [A growing prefix keeps its entries]; an unfreeze lets the weights move again);
// (2) the sample's input is the same: its augmentation must not change between
// epochs (the loader's per-sample augmentation, `--augment-mode sample`, or none), as
// in the paper, which keeps random augmentation stateless per sample for this; with
// `--augment-variants V` a sample has V fixed augmentations, taken in turn, and an
// entry for each (the image task's keys: id x V + the epoch's augmentation); and
// (3) a sample's output does not depend on the rest of its batch: the prefix's
// BatchNorms must use running statistics (`--freeze-bn running`, the paper's
// inference mode). The trainer refuses `--freeze-cache on` without (2) and (3).
//
// Note [A growing prefix keeps its entries]
// When the frozen prefix grows from layer modules [0, j) to [0, k), the entries of [0, j)
// stay true (those modules stay frozen, their weights and running statistics unchanged)
// and are the input of the layers [j, k) the prefix gained. So the trainer keeps the old
// stores below the new one, as its Lowers: a sample the new store lacks runs, from its
// entry in the longest shorter prefix that has one, only the layers after it, and is
// stored at the new depth. Freezing front first, a run freezes unit after unit a few
// epochs apart; without this every freeze would start the cache from nothing, and with
// V augmentations per sample (--augment-variants) an entry, read again only V epochs
// later, would seldom be read before the next freeze dropped it. Every store since the
// prefix last shrank is kept (each deeper one smaller, in a CNN, than the first); a
// shrinking prefix (an unfreeze) drops them all.
// Entries hold the values exactly as the prefix computed them, in its output's dtype (f32,
// or bf16 under --precision bf16: half the bytes), so a step from the cache sees the same
// numbers as a step that recomputes the prefix.
//
// Note [Entries in the convolutions' layout]
// A CPU prefix ending in a convolution's output gives its batch in the convolutions'
// layout (nChw16c, Note [Blocked activations] in core/tensor.h, or NHWC where the CPU's
// convolutions pick it, Note [Activation layouts follow the convolutions] in
// kernels/cpu/conv2d.cpp), whose bytes keep each sample whole and in one run, as a plain
// tensor's do. So a store sized by such a batch keeps its entries in that layout, and
// gathers them so for the next convolution, which reads them as they come: converting
// each batch to plain when stored and back when served cost several times the copy
// itself (eg_bench_freeze CacheStore).
// A batch of the other layout is converted to the store's. The values are the same either
// way, so is the training.
//
// Note [Entries packed in store order]
// An entry goes into the next free slot of the store, not at its sample id's place, and a
// table maps ids to slots. A shuffled epoch stores ids at random: at their ids' places, with
// 2 MB pages (the system's default for all memory on some distributions) the first entry
// written into each page zeroes the whole page, so the first steps after a freeze fault in
// the whole store, GBs, mostly for entries written epochs later or never, and run many
// times slower than the rest. Packed, the store's touched memory is what it
// holds, whatever the page size, and a new key refills the pages the last one touched.
#pragma once
#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace eg::cache {

enum class Tier { automatic, memory, disk };

struct CacheStats {
  int64_t served = 0, stored = 0;  // samples gathered / stored
  int64_t prefetched = 0;  // gathers done in the background ahead of use
  int64_t resets = 0;  // times every entry was dropped
  int64_t entries = 0;  // valid entries now
  int64_t bytes_reserved = 0;  // size of the store now
  int64_t peak_bytes_reserved = 0;  // the largest it has been
  bool on_disk = false;  // where the store is now
  bool ever_on_disk = false;  // whether it has been in the file
};

class ActivationCache {
 public:
  // `dir`: where the backing file is made (for the disk tier). It is unlinked as soon
  // as it is open, so it never outlives the process, whatever way the process ends.
  // Ids are in [0, num_samples).
  // `sharers`: processes on this machine keeping a cache each (data-parallel ranks), among
  // which Tier::automatic divides the memory it may take.
  ActivationCache(std::string dir, int64_t num_samples, Tier tier = Tier::automatic, int sharers = 1);
  ~ActivationCache();
  ActivationCache(const ActivationCache&) = delete;
  ActivationCache& operator=(const ActivationCache&) = delete;

  // The prefix the entries belong to (-1: none). Setting another drops every entry;
  // the store is sized by the first store() after it.
  int64_t key() const { return key_; }
  void set_key(int64_t key);
  // Drops every entry and gives the store back (memory, or the file's disk blocks), as
  // when nothing is frozen any more: an unfrozen run should not hold gigabytes it may
  // never read again. The key becomes -1; the next set_key() and store() map it anew.
  void release();

  // Whether every id has an entry; the positions in `ids` of those without one.
  bool contains(const std::vector<int64_t>& ids) const;
  std::vector<int64_t> missing(const std::vector<int64_t>& ids) const;
  // The entries of `ids` as one tensor [B, sample shape...] on the CPU in the entries'
  // dtype and layout (Note [Entries in the convolutions' layout]); every id
  // must have an entry. Served from the background gather when prefetch() was called
  // with the same ids.
  Tensor gather(const std::vector<int64_t>& ids);
  // Stores row i of `h` (f32, bf16 or f16 [B, ...], any device or layout) as the entry of ids[i]
  // (ids that already have one keep it: by Note [Activation cache validity] it is the same).
  // The first store under a key sizes the store (num_samples entries of this shape and
  // dtype);
  // on disk it reserves the file's blocks: a disk that cannot hold it is an error
  // naming the directory and the size, raised before anything is written.
  void store(const std::vector<int64_t>& ids, const Tensor& h);
  // Starts gathering `ids` in the background when every one has an entry (else does nothing).
  void prefetch(const std::vector<int64_t>& ids);

  // The entries of a shorter prefix that this cache's prefix grew from (Note [A growing
  // prefix keeps its entries]): `rest` maps a batch of them, moved to the device, through
  // the layers the prefix gained since.
  struct Lower {
    ActivationCache* cache;
    std::function<Tensor(const Tensor&)> rest;
  };
  // A batch's prefix output through the cache: the samples of `ids` (rows of the CPU
  // input x) without an entry are computed and stored: from their entry in the first of
  // `lowers` (longest prefix first) that holds one, by its `rest`; the others by `prefix`,
  // as one sub-batch. Then the batch is gathered whole and moved to `dev`; a batch computed
  // wholly one way takes that output as it is. (Requiring whole batches would waste the
  // epoch after each freeze: a batch of 128 is complete with probability f^128 when a
  // share f is cached.) `prefix` maps a CPU batch to its output on `dev`.
  struct Pass {
    Tensor h;  // the prefix's output for the batch
    int64_t hits = 0;  // samples served from entries
    std::vector<int64_t> from_lower;  // samples computed from each of `lowers`' entries
  };
  Pass through(const std::vector<int64_t>& ids, const Tensor& x, Device dev,
               const std::function<Tensor(const Tensor&)>& prefix, const std::vector<Lower>& lowers = {});

  const CacheStats& stats() const { return stats_; }
  const std::string& dir() const { return dir_; }

 private:
  void wait_prefetch();
  void map(int64_t entry_bytes);
  void unmap();
  void check_ids(const std::vector<int64_t>& ids, const char* what) const;
  Tensor gather_now(const std::vector<int64_t>& ids) const;

  std::string dir_;
  Tier tier_;
  int64_t num_samples_ = 0, key_ = -1;
  int sharers_ = 1;
  int fd_ = -1;
  char* base_ = nullptr;
  int64_t entry_bytes_ = 0;
  Shape sample_shape_;
  DType dtype_ = DType::f32;  // the entries'; set with sample_shape_
  Format format_ = Format::plain;  // the entries' layout; set with sample_shape_
  std::vector<int64_t> slot_;  // where each id's entry is in the store, in store order (-1: none)
  std::vector<int64_t> pending_ids_;
  std::future<Tensor> pending_;
  CacheStats stats_;
};

}  // namespace eg::cache
