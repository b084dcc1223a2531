// Fine-tuning's inputs: --classes of an IDX dataset, --init-from's rules for a new head
// (--init-exclude, shapes), torchvision's names (the numbers against PyTorch itself are
// tests/test_torchvision_interop.py's), and the errors of the wrong pretrained file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "egeria.h"
#include "tests/test_util.h"

namespace eg {
namespace {

std::string fashion_dir() {
  const char* env = std::getenv("EG_FASHION_MNIST_DIR");
  return env ? env : "/usr/share/datasets/fashion-mnist";
}

// Classes 5..9 of Fashion-MNIST, relabelled 0..4 in the order given, the limit counted after.
TEST(Transfer, ClassesKeepsThoseClassesRelabelledInTheirOrder) {
  const data::ImageDataset all = data::load_image_dataset({"fashion-mnist", fashion_dir(), 0, {}}, true);
  const data::ImageDataset five = data::load_image_dataset({"fashion-mnist", fashion_dir(), 0, {9, 5, 6, 7, 8}}, true);
  ASSERT_EQ(five.size(), 30000);  // 6,000 a class
  const int64_t* la = all.labels.data<int64_t>();
  const int64_t* l5 = five.labels.data<int64_t>();
  const int64_t px = 28 * 28;
  std::vector<int64_t> seen(5, 0);
  int64_t j = 0;
  for (int64_t i = 0; i < all.size(); ++i) {
    if (la[i] < 5) continue;
    ASSERT_EQ(l5[j], la[i] == 9 ? 0 : la[i] - 4) << "image " << i;
    ASSERT_EQ(0, std::memcmp(five.images.data<uint8_t>() + j * px, all.images.data<uint8_t>() + i * px, size_t(px)));
    ++seen[size_t(l5[j])], ++j;
  }
  EXPECT_EQ(seen, std::vector<int64_t>(5, 6000));
  const data::ImageDataset budget =
      data::load_image_dataset({"fashion-mnist", fashion_dir(), 6000, {5, 6, 7, 8, 9}}, true);
  EXPECT_EQ(budget.size(), 6000);  // a budget of labelled images of those classes

  EXPECT_NE(testing::error_of([] {
              data::load_image_dataset({"fashion-mnist", fashion_dir(), 0, {5, 10}}, true);
            }).find("--classes: fashion-mnist has classes 0 to 9, not 10"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              data::load_image_dataset({"fashion-mnist", fashion_dir(), 0, {-1}}, true);
            }).find("not -1"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              data::load_image_dataset({"fashion-mnist", fashion_dir(), 0, {3, 3}}, true);
            }).find("names class 3 twice"),
            std::string::npos);
  train::TrainConfig c;
  EXPECT_NE(testing::error_of([&] {
              train::set_option(c, "--classes", "1,2,1");
              train::validate(c);
            }).find("--classes names class 1 twice"),
            std::string::npos);
}

models::ModelPtr resnet(const std::string& name, int64_t classes, int64_t channels, int64_t size, uint64_t seed) {
  models::ModelConfig mc;
  mc.name = name, mc.num_classes = classes, mc.in_channels = channels, mc.image_size = size;
  mc.small_input = size <= 64;
  Generator g(seed);
  return models::build_model(mc, g);
}

std::vector<float> values(const models::Model& m, const std::string& k) {
  return m.state_dict().at(k).to_vector<float>();
}

// A head initialised afresh although its shape matches (--init-exclude), by egeria's or
// torchvision's name; a name that matches nothing is refused.
TEST(Transfer, InitExcludeLeavesNamedTensorsAtTheirInitialisation) {
  const std::string dir = testing::fresh_dir("transfer_exclude");
  auto source = resnet("resnet20", 5, 1, 28, 1);
  train::save_safetensors(dir + "/w.safetensors", source->state_dict());
  auto target = resnet("resnet20", 5, 1, 28, 2);
  const auto head_before = values(*target, "head.fc.weight");
  const train::InitFromReport r = train::init_from(*target, dir + "/w.safetensors", {{"head"}, {}});
  EXPECT_EQ(r.excluded, (std::vector<std::string>{"head.fc.bias", "head.fc.weight"}));
  EXPECT_EQ(values(*target, "head.fc.weight"), head_before);
  EXPECT_EQ(values(*target, "stem.conv.weight"), values(*source, "stem.conv.weight"));
  EXPECT_NE(r.text("w").find("excluded, left as initialised: head.fc.bias, head.fc.weight"), std::string::npos);
  EXPECT_NE(testing::error_of([&] {
              train::init_from(*target, dir + "/w.safetensors", {{"haed"}, {}});
            }).find("--init-exclude 'haed' names no tensor of this model"),
            std::string::npos);

  // torchvision's names: fc is torchvision's head.
  auto tv_source = resnet("resnet18", 3, 3, 96, 1);
  train::save_safetensors(dir + "/tv.safetensors", models::to_torchvision(*tv_source));
  auto tv_target = resnet("resnet18", 3, 3, 96, 2);
  const auto fc_before = values(*tv_target, "head.fc.weight");
  const train::InitFromReport t = train::init_from(*tv_target, dir + "/tv.safetensors", {{"fc"}, {}});
  EXPECT_EQ(t.names, "torchvision's resnet18");
  EXPECT_EQ(values(*tv_target, "head.fc.weight"), fc_before);
  EXPECT_EQ(values(*tv_target, "layer4.1.conv2.weight"), values(*tv_source, "layer4.1.conv2.weight"));
  EXPECT_EQ(values(*tv_target, "layer2.0.shortcut.0.weight"), values(*tv_source, "layer2.0.shortcut.0.weight"));
  EXPECT_TRUE(t.missing.empty() && t.unexpected.empty()) << t.text("tv");
}

// Of another configuration: other shapes outside the head, images of other channels, a
// recorded sample shape that is not the data's. Each refused, naming the problem.
TEST(Transfer, AFileOfAnotherModelOrOtherImagesIsRefused) {
  const std::string dir = testing::fresh_dir("transfer_refused");
  auto r56 = resnet("resnet56", 10, 1, 28, 1);
  train::save_safetensors(dir + "/r56.safetensors", r56->state_dict(), {{"sample_shape", "[1,28,28]"}});
  auto r20_3ch = resnet("resnet20", 10, 3, 28, 1);
  const std::string ch = testing::error_of([&] { train::init_from(*r20_3ch, dir + "/r56.safetensors"); });
  EXPECT_NE(ch.find("takes images of other channels than this data's (stem.conv.weight [16, 1, 3, 3] vs [16, 3, 3, 3]"),
            std::string::npos)
      << ch;
  auto r20 = resnet("resnet20", 5, 1, 28, 1);  // resnet56's first 20 layers' names, and the head of 10 classes
  const train::InitFromReport ok = train::init_from(*r20, dir + "/r56.safetensors", {{}, {1, 28, 28}});
  EXPECT_EQ(ok.mismatched,
            (std::vector<std::string>{"head.fc.bias [10] vs [5]", "head.fc.weight [10, 64] vs [5, 64]"}));
  EXPECT_FALSE(ok.unexpected.empty());  // layer1.3 ... of resnet56
  const std::string shape = testing::error_of([&] {
    train::init_from(*r20, dir + "/r56.safetensors", {{}, {1, 32, 32}});
  });
  EXPECT_NE(shape.find("was trained on 1-channel 28x28 images; this data has 1-channel 32x32 images"),
            std::string::npos)
      << shape;
  auto r18 = resnet("resnet18", 10, 3, 96, 1), r50 = resnet("resnet50", 10, 3, 96, 1);
  train::save_safetensors(dir + "/r50.safetensors", r50->state_dict());
  const std::string arch = testing::error_of([&] { train::init_from(*r18, dir + "/r50.safetensors"); });
  EXPECT_NE(arch.find("tensors of this model have other shapes in the file, outside its head (head)"),
            std::string::npos)
      << arch;
  EXPECT_NE(arch.find("layer1.0.conv1.weight [64, 64, 1, 1] vs [64, 64, 3, 3]"), std::string::npos) << arch;
}

// Note [torchvision names]: every tensor has a torchvision name, the 32x32 variants are
// not exported, and a model torchvision has not says so.
TEST(Transfer, TorchvisionNamesCoverEveryTensor) {
  auto r50 = resnet("resnet50", 10, 3, 224, 1);
  const auto names = models::torchvision_names(*r50);
  EXPECT_EQ(names.size(), r50->state_dict().size());
  EXPECT_EQ(names.at("stem.conv.weight"), "conv1.weight");
  EXPECT_EQ(names.at("layer1.0.downsample.1.running_var"), "layer1.0.downsample.1.running_var");
  EXPECT_EQ(models::torchvision_names(*resnet("resnet18", 10, 3, 224, 1)).at("layer2.0.shortcut.0.weight"),
            "layer2.0.downsample.0.weight");
  EXPECT_EQ(names.at("head.fc.bias"), "fc.bias");
  const auto tv = models::to_torchvision(*r50);
  EXPECT_EQ(tv.at("bn1.num_batches_tracked").dtype(), DType::s64);
  EXPECT_EQ(tv.at("bn1.num_batches_tracked").shape(), Shape{});
  EXPECT_EQ(tv.size(), names.size() + 53);  // one counter for each of ResNet-50's 53 batch norms

  models::ModelConfig mc;
  mc.name = "mobilenetv2", mc.num_classes = 10, mc.image_size = 224, mc.small_input = false;
  Generator g(0);
  auto mnv2 = models::build_model(mc, g);
  const auto mn = models::torchvision_names(*mnv2);
  EXPECT_EQ(mn.at("block0.body.depthwise.conv.weight"), "features.1.conv.0.0.weight");
  EXPECT_EQ(mn.at("block0.body.project.bn.bias"), "features.1.conv.2.bias");
  EXPECT_EQ(mn.at("block1.body.expand.conv.weight"), "features.2.conv.0.0.weight");
  EXPECT_EQ(mn.at("block16.body.project.bn.running_mean"), "features.17.conv.3.running_mean");
  EXPECT_EQ(mn.at("head.conv.conv.weight"), "features.18.0.weight");
  EXPECT_EQ(mn.at("head.fc.weight"), "classifier.1.weight");

  auto small = resnet("resnet18", 10, 3, 32, 1);
  EXPECT_NE(testing::error_of([&] { models::to_torchvision(*small); }).find("is not torchvision's resnet18"),
            std::string::npos);
  auto r20 = resnet("resnet20", 10, 3, 32, 1);
  EXPECT_NE(testing::error_of([&] { models::torchvision_names(*r20); }).find("has no torchvision counterpart"),
            std::string::npos);
}

}  // namespace
}  // namespace eg
