// ImageNet-style image folders (data/image_folder.h): scanning, named errors, the
// torchvision transforms as pure functions of (seed, epoch, id), and loading through
// the loader's workers.
#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/image_folder.h"
#include "kernels/ops.h"
#include "tests/test_util.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace eg;
namespace fs = std::filesystem;

namespace {

// An 8-bit PNG of w x h pixels, grey (1 channel) or RGB (3).
void write_png(const std::string& path, int w, int h, const uint8_t* px, int channels) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, f);
  png_set_IHDR(png, info, png_uint_32(w), png_uint_32(h), 8, channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < h; ++y) png_write_row(png, const_cast<uint8_t*>(px) + size_t(y) * size_t(w) * size_t(channels));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

// A w x h image of one colour, as a JPEG or a PNG file.
void write_image(const std::string& path, int w, int h, uint8_t r, uint8_t g, uint8_t b, bool jpeg) {
  std::vector<uint8_t> px;
  for (int i = 0; i < w * h; ++i) px.insert(px.end(), {r, g, b});
  if (!jpeg) return write_png(path, w, h, px.data(), 3);
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  ASSERT_EQ(tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_444, 95, 0), 0);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char*>(out), std::streamsize(size));
  tjFree(out);
  tjDestroy(tj);
}

// DIR/{train,val}/{cat,dog}: cats red, dogs blue; sizes vary; JPEGs and PNGs mixed.
std::string small_folder(const std::string& name) {
  const std::string d = eg::testing::fresh_dir(name);
  for (const char* split : {"train", "val"})
    for (const char* cls : {"dog", "cat"}) {
      fs::create_directories(d + "/" + split + "/" + cls);
      const bool cat = cls[0] == 'c';
      for (int i = 0; i < 3; ++i)
        write_image(d + "/" + split + "/" + cls + "/" + std::to_string(i) + (i == 2 ? ".PNG" : ".jpg"), 40 + 8 * i,
                    30 + 4 * i, cat ? 220 : 20, 40, cat ? 20 : 220, i != 2);
    }
  std::ofstream(d + "/train/cat/README.txt") << "not an image\n";
  return d;
}

using eg::testing::error_of;

}  // namespace

TEST(ImageFolder, ClassesAreSortedFolderNamesAndFilesTheirImages) {
  const std::string d = small_folder("folder_scan");
  const auto train = data::scan_image_folder(d + "/train");
  EXPECT_EQ(train.classes, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(train.size(), 6);
  EXPECT_EQ(train.labels, (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(fs::path(train.files[0]).filename(), "0.jpg");
  EXPECT_EQ(fs::path(train.files[2]).filename(), "2.PNG");
  EXPECT_EQ(train.left_out, 1) << "README.txt";
  // val takes the training split's classes: a class it lacks keeps its label.
  fs::remove_all(d + "/val/cat");
  const auto val = data::scan_image_folder(d + "/val", &train.classes);
  EXPECT_EQ(val.classes, train.classes);
  EXPECT_EQ(val.labels, (std::vector<int64_t>{1, 1, 1}));

  fs::create_directories(d + "/val/wolf");
  write_image(d + "/val/wolf/0.jpg", 8, 8, 0, 0, 0, true);
  std::string e = error_of([&] { data::scan_image_folder(d + "/val", &train.classes); });
  EXPECT_NE(e.find("has a class 'wolf' that the training split does not have"), std::string::npos) << e;
  fs::create_directories(d + "/train/empty");
  e = error_of([&] { data::scan_image_folder(d + "/train"); });
  EXPECT_NE(e.find("class folder '" + d + "/train/empty' holds no images"), std::string::npos) << e;
  e = error_of([&] { data::scan_image_folder(d + "/nowhere"); });
  EXPECT_NE(e.find("image folder '" + d + "/nowhere' is not a directory"), std::string::npos) << e;
  const std::string flat = eg::testing::fresh_dir("folder_flat");
  write_image(flat + "/0.jpg", 8, 8, 0, 0, 0, true);
  e = error_of([&] { data::scan_image_folder(flat); });
  EXPECT_NE(e.find("has no class folders"), std::string::npos) << e;
  fs::create_directories(flat + "/cat");
  write_image(flat + "/cat/0.jpg", 8, 8, 0, 0, 0, true);
  e = error_of([&] { data::scan_image_folder(flat); });  // trained, it would report 100% accuracy
  EXPECT_NE(e.find("has one class folder ('cat'): a classifier learns from at least two"), std::string::npos) << e;
}

TEST(ImageFolder, RandomResizedCropIsAPureFunctionOfSeedEpochAndId) {
  data::FolderTransform t;
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> boxes;
  int flips = 0;
  for (int64_t id = 0; id < 200; ++id) {
    const auto d = data::crop_decision(t, 500, 375, 7, 3, id);
    const auto again = data::crop_decision(t, 500, 375, 7, 3, id);
    EXPECT_EQ(d.box.x, again.box.x);
    EXPECT_EQ(d.box.width, again.box.width);
    EXPECT_EQ(d.flip, again.flip);
    ASSERT_GE(d.box.x, 0);
    ASSERT_GE(d.box.y, 0);
    ASSERT_LE(d.box.x + d.box.width, 500);
    ASSERT_LE(d.box.y + d.box.height, 375);
    const double share = double(d.box.width * d.box.height) / (500.0 * 375.0),
                 ratio = double(d.box.width) / double(d.box.height);
    EXPECT_GE(share, 0.07);
    EXPECT_LE(share, 1.0);
    EXPECT_GE(ratio, 0.74);
    EXPECT_LE(ratio, 1.34);
    boxes.insert({d.box.x, d.box.y, d.box.width, d.box.height});
    flips += d.flip;
  }
  EXPECT_GT(boxes.size(), 190u);
  EXPECT_GT(flips, 70);
  EXPECT_LT(flips, 130);
  const auto e4 = data::crop_decision(t, 500, 375, 7, 4, 0), e3 = data::crop_decision(t, 500, 375, 7, 3, 0);
  EXPECT_FALSE(e4.box.x == e3.box.x && e4.box.y == e3.box.y && e4.box.width == e3.box.width)
      << "a new epoch, a new crop";
  // Evaluation takes the whole image, unflipped; a thin image falls back to the centre crop.
  t.train = false;
  const auto ev = data::crop_decision(t, 500, 375, 7, 3, 0);
  EXPECT_EQ(ev.box.width, 500);
  EXPECT_FALSE(ev.flip);
  t.train = true;
  const auto thin = data::crop_decision(t, 1000, 10, 1, 0, 0);
  EXPECT_LE(thin.box.width, 1000);
  EXPECT_LE(double(thin.box.width) / double(thin.box.height), 4.0 / 3.0 + 0.2);
}

TEST(ImageFolder, LoadsThroughTheLoaderNormalisedAndSized) {
  const std::string d = small_folder("folder_load");
  for (bool train : {true, false}) {
    data::FolderTransform t;
    t.size = 16;
    t.train = train;
    auto src = std::make_shared<data::FolderSamples>(data::scan_image_folder(d + "/train"), t);
    data::LoaderOptions o;
    o.batch_size = 3;
    o.workers = 2;
    o.seed = 5;
    data::Loader l(src, o);
    l.start_epoch(0);
    data::Batch b;
    int batches = 0;
    while (l.next(b)) {
      ++batches;
      ASSERT_EQ(b.x.shape(), (Shape{3, 3, 16, 16}));
      const float* x = b.x.data<float>();
      for (int64_t i = 0; i < 3; ++i) {
        // One colour per class: red (220, 40, 20) for cats, blue for dogs, normalised
        // with ImageNet's statistics; JPEG keeps it within a few levels.
        const bool cat = b.y.data<int64_t>()[i] == 0;
        const float red = ((cat ? 220.f : 20.f) / 255.f - 0.485f) / 0.229f;
        for (int64_t k = 0; k < 16 * 16; ++k) ASSERT_NEAR(x[i * 3 * 256 + k], red, 0.1f) << "train " << train;
      }
    }
    EXPECT_EQ(batches, 2);
  }
  // A file that is not an image stops the loader naming it.
  std::ofstream(d + "/train/dog/9.jpg") << "<html>";
  data::FolderTransform t;
  t.size = 8;
  data::LoaderOptions o;
  o.batch_size = 7;
  o.shuffle = false;
  data::Loader l(std::make_shared<data::FolderSamples>(data::scan_image_folder(d + "/train"), t), o);
  l.start_epoch(0);
  data::Batch b;
  const std::string e = error_of([&] { l.next(b); });
  EXPECT_NE(e.find("/train/dog/9.jpg' is neither a JPEG nor a PNG file"), std::string::npos) << e;
}

// LoaderOptions::pixels: batches of the same samples as 8-bit pixels (a quarter of the
// bytes a GPU upload moves), which ops::image_normalize makes exactly the f32 batches, in
// training and evaluation, colour and grey, with a left-out file among them.
TEST(ImageFolder, PixelBatchesNormaliseToTheF32Batches) {
  const std::string d = small_folder("folder_pixels");
  std::ofstream(d + "/train/dog/9.jpg") << "<html>";
  for (int64_t channels : {3, 1})
    for (bool train : {true, false}) {
      data::FolderTransform t;
      t.size = 24;
      t.train = train;
      t.channels = channels;
      auto src = std::make_shared<data::FolderSamples>(data::scan_image_folder(d + "/train"), t);
      data::LoaderOptions o;
      o.batch_size = 4;
      o.drop_last = false;  // 7 files: batches of 4 and 3, one left out
      o.workers = 2;
      o.seed = 9;
      o.skip_bad = true;
      data::Loader f32(src, o);
      o.pixels = true;
      data::Loader px(src, o);
      ASSERT_TRUE(px.pixels());
      ASSERT_FALSE(f32.pixels());
      const data::PixelAffine a = px.pixel_affine();
      ASSERT_EQ(a.scale.size(), size_t(channels));
      const Tensor scale = Tensor::from_vector(a.scale, {channels}), zero = Tensor::from_vector(a.zero, {channels});
      for (int64_t epoch : {0, 1}) {
        f32.start_epoch(epoch);
        px.start_epoch(epoch);
        data::Batch bf, bp;
        int batches = 0, left_out = 0;
        while (f32.next(bf)) {
          ASSERT_TRUE(px.next(bp));
          ++batches;
          left_out += int(bp.left_out.size());
          ASSERT_EQ(bp.x.dtype(), DType::u8);
          ASSERT_EQ(bp.x.shape(), bf.x.shape());
          EXPECT_EQ(bp.ids, bf.ids);
          EXPECT_EQ(bp.y.to_vector<int64_t>(), bf.y.to_vector<int64_t>());
          Tensor y = Tensor::empty(bf.x.shape());
          ops::call(ops::image_normalize, bp.x, scale, zero, y);
          EXPECT_EQ(y.to_vector<float>(), bf.x.to_vector<float>()) << channels << " channels, train " << train;
        }
        EXPECT_FALSE(px.next(bp));
        EXPECT_EQ(batches, 2);
        EXPECT_EQ(left_out, 1);
      }
    }
  // A source without pixels (an in-memory dataset, a user's) keeps f32 batches.
  data::ImageDataset ds = data::synthetic_images(8, 3, 8, 2, 1);
  data::LoaderOptions o;
  o.batch_size = 4;
  o.pixels = true;
  data::Loader l(std::make_shared<const data::ImageDataset>(std::move(ds)), o);
  EXPECT_FALSE(l.pixels());
  l.start_epoch(0);
  data::Batch b;
  ASSERT_TRUE(l.next(b));
  EXPECT_EQ(b.x.dtype(), DType::f32);
}

// `egeria train --model resnet50 --dataset imagefolder --batch-size 4` on a folder of
// 224 x 224 JPEGs: the ImageNet stem, the class count from the folders, the class names
// in config.json, and the run's accuracy on val/.
TEST(ImageFolder, TrainsResNet50OnAFolderOf224PixelJpegs) {
  const std::string d = eg::testing::fresh_dir("folder_r50");
  const char* classes[] = {"n01440764", "n01443537", "n01484850"};
  for (const char* split : {"train", "val"})
    for (int k = 0; k < 3; ++k) {
      fs::create_directories(d + "/" + split + "/" + classes[k]);
      for (int i = 0; i < (split[0] == 't' ? 3 : 1); ++i)
        write_image(d + "/" + split + "/" + classes[k] + "/" + std::to_string(i) + ".JPEG", 224, 224, uint8_t(80 * k),
                    uint8_t(40 * i), 128, true);
    }
  train::TrainConfig c;
  c.model = "resnet50";
  c.dataset = "imagefolder";
  c.data_dir = d;
  c.batch_size = 4;  // 9 images: 2 steps
  c.epochs = 1;
  c.lr = 0.01;
  c.threads = 2;
  c.out = eg::testing::fresh_dir("folder_r50_run");
  const auto s = train::run_training(c);
  ASSERT_TRUE(s.completed);
  EXPECT_EQ(s.steps, 2);
  const auto cfg = nlohmann::json::parse(std::ifstream(c.out + "/config.json"));
  EXPECT_EQ(cfg["classes"], nlohmann::json(std::vector<std::string>(classes, classes + 3)));
  const auto sj = nlohmann::json::parse(std::ifstream(c.out + "/summary.json"));
  EXPECT_EQ(sj["classes"], 3);
  EXPECT_EQ(sj["parameters"], 23514179) << "ResNet-50 with a 3-class head";
  // egeria eval: the checkpoint on val/, as the run's last evaluation saw it.
  const auto e = train::evaluate_checkpoint(c.out, "", 0);
  EXPECT_EQ(e.samples, 3);
  EXPECT_DOUBLE_EQ(e.accuracy, sj["final_test_accuracy"].get<double>());
  EXPECT_NEAR(e.loss, sj["final_test_loss"].get<double>(), 1e-5);
  // egeria eval --per-class: each class by name; the weights name their classes too.
  const auto pc = train::evaluate_checkpoint(c.out, "", 0, "fp32", 3, true);
  ASSERT_EQ(pc.classes, std::vector<std::string>(classes, classes + 3));
  int64_t correct = 0;
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(pc.per_class.total[k], 1);
    correct += pc.per_class.correct[k];
  }
  EXPECT_DOUBLE_EQ(double(correct) / 3, e.accuracy);
  train::Metadata meta;
  train::load_safetensors(c.out + "/model.safetensors", &meta);
  EXPECT_EQ(nlohmann::json::parse(meta.at("classes")), cfg["classes"]);
  EXPECT_EQ(meta.at("model"), "resnet50");
}

namespace {

// An IDX file of unsigned bytes with the given dimensions (big-endian sizes).
void write_idx(const std::string& path, const std::vector<int32_t>& dims, const std::vector<uint8_t>& data) {
  std::ofstream f(path, std::ios::binary);
  const uint8_t head[4] = {0, 0, 0x08, uint8_t(dims.size())};
  f.write(reinterpret_cast<const char*>(head), 4);
  for (int32_t d : dims) {
    const uint8_t be[4] = {uint8_t(d >> 24), uint8_t(d >> 16), uint8_t(d >> 8), uint8_t(d)};
    f.write(reinterpret_cast<const char*>(be), 4);
  }
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

std::vector<nlohmann::json> step_lines(const std::string& dir) {
  std::vector<nlohmann::json> v;
  std::ifstream f(dir + "/metrics.jsonl");
  for (std::string l; std::getline(f, l);)
    if (nlohmann::json j = nlohmann::json::parse(l); j["type"] == "step") v.push_back(j);
  return v;
}

}  // namespace

// Splits of different image sizes (a test set of another dataset) are named, not trained on.
TEST(ImageFolder, IdxSplitsOfDifferentImageSizesAreRefused) {
  const std::string idx = eg::testing::fresh_dir("idx_sizes");
  write_idx(idx + "/train-images-idx3-ubyte", {32, 28, 28}, std::vector<uint8_t>(32 * 28 * 28, 7));
  write_idx(idx + "/train-labels-idx1-ubyte", {32}, std::vector<uint8_t>(32, 1));
  write_idx(idx + "/t10k-images-idx3-ubyte", {8, 32, 32}, std::vector<uint8_t>(8 * 32 * 32, 7));
  write_idx(idx + "/t10k-labels-idx1-ubyte", {8}, std::vector<uint8_t>(8, 1));
  train::TrainConfig c = eg::testing::small_image_run(eg::testing::fresh_dir("idx_sizes_run"));
  c.dataset = "fashion-mnist";
  c.data_dir = idx;
  c.train_limit = c.test_limit = 0;
  const std::string e = eg::testing::error_of([&] { train::run_training(c); });
  EXPECT_NE(e.find("dataset fashion-mnist: the test images are [1, 32, 32] and the training images [1, 28, 28]"),
            std::string::npos)
      << e;
}

// Fashion-MNIST written as a folder of grey PNGs, and the same images in IDX form in the
// folder's order: with augmentation off, ResNet-20 trained from the folder (1 channel,
// crop-pct 1 so that evaluation's resize is the identity, Fashion-MNIST's normalisation)
// and from the IDX twin gives the same loss at every step, bit for bit.
TEST(ImageFolder, FashionMnistAsPngsTrainsAsItsIdxTwin) {
  const char* env = std::getenv("EG_FASHION_MNIST_DIR");
  const std::string src = env ? env : "/usr/share/datasets/fashion-mnist";
  const std::string folder = eg::testing::fresh_dir("fmnist_folder"), idx = eg::testing::fresh_dir("fmnist_idx");
  for (auto [split, idx_split, n] :
       {std::tuple<const char*, const char*, int64_t>{"train", "train", 192}, {"val", "t10k", 64}}) {
    const data::ImageDataset d = data::load_mnist_split(src, idx_split);
    std::vector<std::pair<int64_t, int64_t>> by_class;  // (label, id): the folder's order
    for (int64_t i = 0; i < n; ++i) by_class.emplace_back(d.labels.data<int64_t>()[i], i);
    std::sort(by_class.begin(), by_class.end());
    std::vector<uint8_t> images, labels;
    for (auto [label, i] : by_class) {
      const uint8_t* px = d.images.data<uint8_t>() + i * 28 * 28;
      const std::string dir = folder + "/" + split + "/class" + std::to_string(label);
      fs::create_directories(dir);
      char name[32];
      std::snprintf(name, sizeof name, "/%05lld.png", (long long)i);
      write_png(dir + name, 28, 28, px, 1);
      images.insert(images.end(), px, px + 28 * 28);
      labels.push_back(uint8_t(label));
    }
    write_idx(idx + "/" + idx_split + "-images-idx3-ubyte", {int32_t(n), 28, 28}, images);
    write_idx(idx + "/" + idx_split + "-labels-idx1-ubyte", {int32_t(n)}, labels);
  }
  train::TrainConfig c = eg::testing::small_image_run(eg::testing::fresh_dir("fmnist_idx_run"));
  c.dataset = "fashion-mnist";
  c.data_dir = idx;
  c.train_limit = c.test_limit = 0;
  c.epochs = 2;
  c.milestones = {1};
  c.augment = false;
  c.log_every = 1;
  const train::Summary a = train::run_training(c);
  const std::string from_idx = c.out;
  c.dataset = "imagefolder";
  c.data_dir = folder;
  c.image_size = 28;
  c.image_channels = 1;
  c.crop_pct = 1;
  c.image_mean = {0.2860};
  c.image_std = {0.3530};
  c.out = eg::testing::fresh_dir("fmnist_folder_run");
  const train::Summary b = train::run_training(c);
  const auto la = step_lines(from_idx), lb = step_lines(c.out);
  ASSERT_EQ(la.size(), 24u);  // 192 / 16 x 2
  ASSERT_EQ(lb.size(), la.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i]["loss"], lb[i]["loss"]) << "step " << i + 1;
  EXPECT_EQ(a.final_test_accuracy, b.final_test_accuracy);
  EXPECT_NEAR(a.final_test_loss, b.final_test_loss, 1e-6);
  EXPECT_LT(la.back()["loss"].get<double>(), la.front()["loss"].get<double>());
}

// One channel: every image is made grey as PIL's convert("L") (ITU-R 601-2 luma).
TEST(ImageFolder, GreyFoldersTakeTheLumaOfColourImages) {
  const std::string d = small_folder("folder_grey");
  data::FolderTransform t;
  t.size = 8;
  t.channels = 1;
  t.train = false;
  t.norm.mean[0] = 0, t.norm.std[0] = 1;
  data::FolderSamples src(data::scan_image_folder(d + "/train"), t);
  ASSERT_EQ(src.sample_shape(), (Shape{1, 8, 8}));
  std::vector<float> px(64);
  for (int64_t id = 0; id < src.size(); ++id) {
    src.load(id, 0, 0, px.data());
    const bool cat = src.label(id) == 0;  // (220, 40, 20) or (20, 40, 220)
    const int r = cat ? 220 : 20, b = cat ? 20 : 220;
    const float luma = float((19595 * r + 38470 * 40 + 7471 * b + 0x8000) >> 16) / 255.f;
    for (float v : px) ASSERT_NEAR(v, luma, 3.f / 255) << id;  // JPEG keeps it within a few levels
  }
}

// A file that cannot be decoded stops the run naming it; with --skip-bad-images it is
// left out of training and evaluation, named once, and counted over the run: the count
// survives a resume.
TEST(ImageFolder, SkipBadImagesLeavesOutAndCountsThem) {
  const std::string d = small_folder("folder_bad");
  std::ofstream(d + "/train/dog/7.jpg") << "<html>";  // a web page saved as an image
  {
    std::string jpeg = eg::testing::slurp(d + "/val/cat/0.jpg");
    std::ofstream(d + "/val/cat/5.jpg", std::ios::binary) << jpeg.substr(0, jpeg.size() / 2);  // truncated
  }
  train::TrainConfig c;
  c.model = "resnet20";
  c.dataset = "imagefolder";
  c.data_dir = d;
  c.image_size = 16;
  c.batch_size = 1;  // 7 training images, each a step: the bad one's batch is empty
  c.epochs = 3;
  c.lr = 0.01;
  c.threads = 2;
  c.checkpoint_every = 4;
  c.out = eg::testing::fresh_dir("folder_bad_run");
  const std::string e = error_of([&] { train::run_training(c); });
  EXPECT_NE(e.find("/train/dog/7.jpg' is neither a JPEG nor a PNG file"), std::string::npos) << e;

  c.skip_bad_images = true;
  const train::Summary s = train::run_training(c);
  ASSERT_TRUE(s.completed);
  auto summary = nlohmann::json::parse(std::ifstream(c.out + "/summary.json"));
  EXPECT_EQ(summary["images_left_out"], 3) << "the bad training image, once an epoch";
  std::ifstream f(c.out + "/metrics.jsonl");
  int epochs = 0;
  for (std::string l; std::getline(f, l);)
    if (auto j = nlohmann::json::parse(l); j["type"] == "epoch") {
      ++epochs;
      EXPECT_EQ(j["test_images_left_out"], 1) << "the truncated val/ image";
    }
  EXPECT_EQ(epochs, 3);

  // Stopped at step 10 (after the checkpoint at step 8, in epoch 2) and resumed: the same count.
  const std::string full = c.out;
  c.out = eg::testing::fresh_dir("folder_bad_resumed");
  c.stop_after_steps = 10;
  EXPECT_FALSE(train::run_training(c).completed);
  c.stop_after_steps = 0;
  c.resume = true;
  ASSERT_TRUE(train::run_training(c).completed);
  summary = nlohmann::json::parse(std::ifstream(c.out + "/summary.json"));
  EXPECT_EQ(summary["images_left_out"], 3);
  EXPECT_EQ(eg::testing::slurp(full + "/model.safetensors"), eg::testing::slurp(c.out + "/model.safetensors"));
}
