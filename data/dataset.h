// Image datasets held in memory (u8 [N, C, H, W] + s64 labels), their readers, and
// the augmentation used for training.
#pragma once
#include <functional>
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

struct Normalization {
  float mean[3] = {0, 0, 0}, std[3] = {1, 1, 1};
};

// Normalisation as an affine map of 8-bit pixels, per channel: a pixel p becomes
// float(p) * scale[c] + zero[c], with scale = 1 / (255 std) and zero = -mean / std.
struct PixelAffine {
  std::vector<float> scale, zero;
};
PixelAffine pixel_affine(const Normalization& n, int64_t channels);

// What a dataset is, for the task that trains on it.
enum class DataKind {
  images,  // in memory, u8 [N, C, H, W] with labels; read whole by DatasetInfo::read
  image_folder,  // an ImageNet-style folder of image files (data/image_folder.h), decoded as loaded
  sentence_pairs,  // tab-separated sentence pairs (data/text.h), read by the translation task
};

// One row of the table of datasets --dataset names.
struct DatasetInfo {
  std::string name;
  DataKind kind = DataKind::images;
  int64_t classes = 0;  // images: how many labels; 0: the data says (an image folder's class folders)
  Normalization norm;  // images: the training split's per-channel mean and standard deviation
  // images: one split read from `dir` (empty: the dataset's default, where it has one);
  // throws naming the dataset and the path. Other kinds: empty (their task reads them).
  std::function<ImageDataset(const std::string& dir, bool train)> read;
};

// The built-in datasets: fashion-mnist, mnist (IDX), cifar10, cifar100 (binary batches),
// synthetic (4,096 + 1,024 images of 3x32x32), imagefolder, en-es.
const std::vector<DatasetInfo>& datasets();
std::vector<std::string> dataset_names();
// The row of `name`, or nullptr: not a built-in dataset (a user's data, given through the
// C++ API, only names itself in the logs).
const DatasetInfo* find_dataset(const std::string& name);
// The row of `name`; throws naming the known datasets when there is none.
const DatasetInfo& dataset_info(const std::string& name);

// Split `train` (or test) of the in-memory dataset `spec.name`, its first `limit` samples.
struct DatasetSpec {
  std::string name;
  std::string dir;
  int64_t limit = 0;  // use the first N samples (0: all), counted after `classes`
  // Keep the samples of these classes only, relabelled 0, 1, ... in this order (a
  // transfer task's classes); empty: all. Each must be one of the dataset's, once.
  std::vector<int64_t> classes;
};
ImageDataset load_image_dataset(const DatasetSpec& spec, bool train);

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
