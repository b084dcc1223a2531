// Image datasets held in memory (u8 [N, C, H, W] + s64 labels), their readers, and
// the augmentation used for training.
#pragma once
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "data/idx.h"

namespace eg::data {

// CIFAR-10/100 binary batches (data_batch_1..5.bin / test_batch.bin for CIFAR-10,
// train.bin / test.bin for CIFAR-100) in `dir`. Get them from
// https://www.cs.toronto.edu/~kriz/cifar.html ("binary version") and unpack.
ImageDataset load_cifar(const std::string& dir, bool train, int num_classes /* 10 or 100 */);

// Deterministic synthetic images for benchmarks: class-dependent means plus noise.
ImageDataset synthetic_images(int64_t n, int64_t channels, int64_t size, int64_t classes, uint64_t seed);

// Loads a dataset by name: "fashion-mnist" / "mnist" (IDX), "cifar10", "cifar100",
// "synthetic" (28x28x1 unless configured). Throws naming the dataset and path.
struct DatasetSpec {
  std::string name;
  std::string dir;
  int64_t limit = 0;  // use the first N samples (0: all)
};
ImageDataset load_image_dataset(const DatasetSpec& spec, bool train);
std::vector<std::string> image_dataset_names();  // what load_image_dataset reads

struct Normalization {
  float mean[3] = {0, 0, 0}, std[3] = {1, 1, 1};
};
Normalization default_normalization(const std::string& dataset);

struct AugmentOptions {
  int64_t crop_padding = 0;  // random crop of the original size from a zero-padded image
  bool hflip = false;
  Normalization norm;
};

// Writes sample `id` of `d` (u8) into `out` (f32 [C, H, W]) with the augmentation a
// pure function of (seed, epoch, id): the same sample gets the same crop and flip
// wherever and whenever it is loaded, which makes resumption and activation caching exact.
void augment_into(const ImageDataset& d, int64_t id, const AugmentOptions& o, uint64_t seed, int64_t epoch, float* out);

}  // namespace eg::data
