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

PixelAffine pixel_affine(const Normalization& n, int64_t channels) {
  PixelAffine a;
  for (int64_t c = 0; c < channels; ++c) {
    a.scale.push_back(1.f / (255.f * n.std[c]));
    a.zero.push_back(-n.mean[c] / n.std[c]);
  }
  return a;
}

namespace {

// The channels given; the others (unused by a dataset with fewer) keep mean 0, std 1.
Normalization norm_of(std::vector<float> mean, std::vector<float> std) {
  Normalization n;
  for (size_t i = 0; i < mean.size() && i < 3; ++i) n.mean[i] = mean[i], n.std[i] = std[i];
  return n;
}

DatasetInfo mnist_format(const char* name, const char* default_dir, float mean, float std) {
  const std::string dataset = name, fallback = default_dir;
  return {name, DataKind::images, 10, norm_of({mean}, {std}), [dataset, fallback](const std::string& dir, bool train) {
            EG_CHECK(!dir.empty() || !fallback.empty(), "dataset ", dataset, " needs --data-dir");
            return load_mnist_split(dir.empty() ? fallback : dir, train ? "train" : "t10k");
          }};
}

DatasetInfo cifar(int classes) {
  const std::string dataset = "cifar" + std::to_string(classes);
  return {dataset, DataKind::images, classes, norm_of({0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}),
          [dataset, classes](const std::string& dir, bool train) {
    EG_CHECK(!dir.empty(), "dataset ", dataset,
             " needs --data-dir pointing at the unpacked binary version "
             "(https://www.cs.toronto.edu/~kriz/cifar.html)");
    return load_cifar(dir, train, classes);
          }};
}

}  // namespace

const std::vector<DatasetInfo>& datasets() {
  static const std::vector<DatasetInfo> table = {
      mnist_format("fashion-mnist", "/usr/share/datasets/fashion-mnist", 0.2860f, 0.3530f),
      mnist_format("mnist", "", 0.1307f, 0.3081f),
      cifar(10),
      cifar(100),
      {"synthetic", DataKind::images, 10, norm_of({0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}),
       [](const std::string&, bool train) { return synthetic_images(train ? 4096 : 1024, 3, 32, 10, train ? 1 : 2); }},
      {"imagefolder", DataKind::image_folder, 0, {}, {}},
      {"en-es", DataKind::sentence_pairs, 0, {}, {}},
  };
  return table;
}

std::vector<std::string> dataset_names() {
  std::vector<std::string> n;
  for (auto& d : datasets()) n.push_back(d.name);
  return n;
}

const DatasetInfo* find_dataset(const std::string& name) {
  for (auto& d : datasets())
    if (d.name == name) return &d;
  return nullptr;
}

const DatasetInfo& dataset_info(const std::string& name) {
  if (const DatasetInfo* d = find_dataset(name)) return *d;
  std::string known;
  for (auto& n : dataset_names()) known += (known.empty() ? "" : ", ") + n;
  EG_THROW("unknown dataset '", name, "' (known: ", known, ")");
}

namespace {

ImageDataset select_classes(const ImageDataset& d, const std::vector<int64_t>& classes, const DatasetInfo& info) {
  std::vector<int64_t> relabel(size_t(info.classes), -1);
  for (size_t i = 0; i < classes.size(); ++i) {
    const int64_t k = classes[i];
    EG_CHECK(k >= 0 && k < info.classes, "--classes: ", info.name, " has classes 0 to ", info.classes - 1, ", not ", k);
    EG_CHECK(relabel[size_t(k)] < 0, "--classes names class ", k, " twice");
    relabel[size_t(k)] = int64_t(i);
  }
  const int64_t n = d.size(), per = d.images.numel() / std::max<int64_t>(n, 1);
  const uint8_t* src = d.images.data<uint8_t>();
  const int64_t* lab = d.labels.data<int64_t>();
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < n; ++i)
    if (lab[i] >= 0 && lab[i] < info.classes && relabel[size_t(lab[i])] >= 0) keep.push_back(i);
  Shape shape = d.images.shape();
  shape[0] = int64_t(keep.size());
  ImageDataset out;
  out.images = Tensor::empty(shape, DType::u8);
  out.labels = Tensor::empty({int64_t(keep.size())}, DType::s64);
  uint8_t* dst = out.images.data<uint8_t>();
  int64_t* dl = out.labels.data<int64_t>();
  for (size_t j = 0; j < keep.size(); ++j) {
    std::memcpy(dst + int64_t(j) * per, src + keep[j] * per, size_t(per));
    dl[j] = relabel[size_t(lab[keep[j]])];
  }
  return out;
}

}  // namespace

ImageDataset load_image_dataset(const DatasetSpec& spec, bool train) {
  const DatasetInfo& info = dataset_info(spec.name);
  EG_CHECK(info.read, "dataset ", spec.name, " is not an in-memory image dataset");
  ImageDataset d = info.read(spec.dir, train);
  if (!spec.classes.empty()) d = select_classes(d, spec.classes, info);
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
