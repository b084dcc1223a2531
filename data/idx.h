// IDX files (MNIST, Fashion-MNIST), plain or gzip-compressed. Every problem is
// reported with the file's path: missing, unreadable, bad magic number, a type other
// than u8, sizes that disagree with the header, or a truncated file.
#pragma once
#include <string>

#include "core/tensor.h"

namespace eg::data {

// Reads an IDX file of unsigned bytes into a u8 tensor shaped by its header
// (images: [N, rows, cols]; labels: [N]).
Tensor read_idx(const std::string& path);

struct ImageDataset {
  Tensor images;  // u8 [N, 1, H, W]
  Tensor labels;  // s64 [N]
  int64_t size() const { return labels.numel(); }
};

// Loads the "train" or "t10k" split of an MNIST-format directory (files
// <split>-images-idx3-ubyte[.gz] and <split>-labels-idx1-ubyte[.gz]); checks that the
// counts agree and every label is below `num_classes`.
ImageDataset load_mnist_split(const std::string& dir, const std::string& split, int64_t num_classes = 10);

// u8 [N, 1, H, W] -> f32, scaled to [0, 1] then normalised with (x - mean) / std.
Tensor normalize_images(const Tensor& u8_images, double mean, double std);

}  // namespace eg::data
