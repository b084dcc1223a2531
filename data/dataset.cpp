#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

namespace eg::data {

namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  EG_CHECK(f.good(), "cannot open '", path, "': no such file or not readable");
  std::streamsize n = f.tellg();
  f.seekg(0);
  std::vector<uint8_t> b(size_t(std::max<std::streamsize>(n, 0)));
  EG_CHECK(f.read(reinterpret_cast<char*>(b.data()), n).good() || n == 0, "cannot read '", path, "'");
  return b;
}

}  // namespace

ImageDataset load_cifar(const std::string& dir, bool train, int classes) {
  EG_CHECK(classes == 10 || classes == 100, "CIFAR has 10 or 100 classes, not ", classes);
  std::vector<std::string> files;
  if (classes == 10) {
    if (train)
      for (int i = 1; i <= 5; ++i) files.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
    else files.push_back(dir + "/test_batch.bin");
  } else {
    files.push_back(dir + (train ? "/train.bin" : "/test.bin"));
  }
  const size_t label_bytes = classes == 10 ? 1 : 2, rec = label_bytes + 3072;
  std::vector<std::vector<uint8_t>> parts;
  int64_t n = 0;
  for (auto& f : files) {
    parts.push_back(read_file(f));
    EG_CHECK(parts.back().size() % rec == 0 && !parts.back().empty(), "'", f, "' is not a CIFAR-", classes,
             " binary batch: ", parts.back().size(), " bytes is not a multiple of the ", rec,
             "-byte record (truncated?)");
    n += int64_t(parts.back().size() / rec);
  }
  ImageDataset d;
  d.images = Tensor::empty({n, 3, 32, 32}, DType::u8);
  d.labels = Tensor::empty({n}, DType::s64);
  int64_t i = 0;
  for (size_t p = 0; p < parts.size(); ++p)
    for (size_t r = 0; r < parts[p].size() / rec; ++r, ++i) {
      const uint8_t* src = parts[p].data() + r * rec;
      int64_t label = src[label_bytes - 1];  // CIFAR-100: coarse, fine -> fine label
      EG_CHECK(label < classes, "'", files[p], "': record ", r, " has label ", label, " (expected < ", classes, ")");
      d.labels.data<int64_t>()[i] = label;
      std::memcpy(d.images.data<uint8_t>() + i * 3072, src + label_bytes, 3072);
    }
  return d;
}

ImageDataset synthetic_images(int64_t n, int64_t c, int64_t s, int64_t classes, uint64_t seed) {
  ImageDataset d;
  d.images = Tensor::empty({n, c, s, s}, DType::u8);
  d.labels = Tensor::empty({n}, DType::s64);
  Generator g(seed);
  for (int64_t i = 0; i < n; ++i) {
    int64_t y = int64_t(g.next_u32() % uint32_t(classes));
    d.labels.data<int64_t>()[i] = y;
    uint64_t off = g.reserve(uint64_t(c * s * s));
    for (int64_t k = 0; k < c * s * s; ++k) {
      double v = 40.0 + 170.0 * double((y * 7 + k / (s * s) * 3) % classes) / double(classes) +
                 25.0 * philox_normal(seed, off, uint64_t(k));
      d.images.data<uint8_t>()[i * c * s * s + k] = uint8_t(std::clamp(v, 0.0, 255.0));
    }
  }
  return d;
}

Normalization default_normalization(const std::string& ds) {
  Normalization n;
  if (ds == "fashion-mnist") {
    n.mean[0] = 0.2860f;
    n.std[0] = 0.3530f;
  } else if (ds == "mnist") {
    n.mean[0] = 0.1307f;
    n.std[0] = 0.3081f;
  } else if (ds == "cifar10" || ds == "cifar100") {
    const float m[3] = {0.4914f, 0.4822f, 0.4465f}, s[3] = {0.2470f, 0.2435f, 0.2616f};
    for (int i = 0; i < 3; ++i) n.mean[i] = m[i], n.std[i] = s[i];
  } else {
    for (int i = 0; i < 3; ++i) n.mean[i] = 0.5f, n.std[i] = 0.25f;
  }
  return n;
}

std::vector<std::string> image_dataset_names() {
  return {"fashion-mnist", "mnist", "cifar10", "cifar100", "synthetic"};
}

ImageDataset load_image_dataset(const DatasetSpec& spec, bool train) {
  ImageDataset d;
  if (spec.name == "fashion-mnist" || spec.name == "mnist") {
    std::string dir =
        spec.dir.empty() ? (spec.name == "fashion-mnist" ? "/usr/share/datasets/fashion-mnist" : "") : spec.dir;
    EG_CHECK(!dir.empty(), "dataset mnist needs --data-dir");
    d = load_mnist_split(dir, train ? "train" : "t10k");
  } else if (spec.name == "cifar10" || spec.name == "cifar100") {
    EG_CHECK(!spec.dir.empty(), "dataset ", spec.name,
             " needs --data-dir pointing at the unpacked binary version (https://www.cs.toronto.edu/~kriz/cifar.html)");
    d = load_cifar(spec.dir, train, spec.name == "cifar10" ? 10 : 100);
  } else if (spec.name == "synthetic") {
    d = synthetic_images(train ? 4096 : 1024, 3, 32, 10, train ? 1 : 2);
  } else {
    std::string known;
    for (auto& n : image_dataset_names()) known += (known.empty() ? "" : ", ") + n;
    EG_THROW("unknown dataset '", spec.name, "' (known: ", known, ")");
  }
  if (spec.limit > 0 && spec.limit < d.size()) {
    d.images = d.images.slice(0, spec.limit);
    d.labels = d.labels.slice(0, spec.limit);
  }
  return d;
}

void augment_into(const ImageDataset& d, int64_t id, const AugmentOptions& o, uint64_t seed, int64_t epoch,
                  float* out) {
  const int64_t c = d.images.size(1), h = d.images.size(2), w = d.images.size(3);
  const uint8_t* src = d.images.data<uint8_t>() + id * c * h * w;
  // One Philox block per (epoch, id): dy, dx and flip.
  Philox4 r = philox4x32(seed ^ 0x9E3779B97F4A7C15ull, (uint64_t(epoch) << 40) ^ uint64_t(id));
  const int64_t p = o.crop_padding;
  const int64_t dy = p ? int64_t(r.x[0] % uint32_t(2 * p + 1)) - p : 0,
                dx = p ? int64_t(r.x[1] % uint32_t(2 * p + 1)) - p : 0;
  const bool flip = o.hflip && (r.x[2] & 1u);
  for (int64_t ch = 0; ch < c; ++ch) {
    const float scale = 1.f / (255.f * o.norm.std[std::min<int64_t>(ch, 2)]);
    const float zero = -o.norm.mean[std::min<int64_t>(ch, 2)] / o.norm.std[std::min<int64_t>(ch, 2)];
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) {
        int64_t sy = y + dy, sx = (flip ? w - 1 - x : x) + dx;
        float v = (sy >= 0 && sy < h && sx >= 0 && sx < w) ? float(src[(ch * h + sy) * w + sx]) * scale + zero : zero;
        out[(ch * h + y) * w + x] = v;
      }
  }
}

}  // namespace eg::data
