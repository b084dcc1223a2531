// The trainer (train/trainer.h): its outputs, resumption, bad input and the options'
// effects on a run.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/test_util.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace eg;

namespace {
std::string tmpdir(const std::string& name) { return eg::testing::fresh_dir("eg_train_" + name); }
using eg::testing::slurp;
train::TrainConfig small_run(const std::string& out) {
  train::TrainConfig c;
  c.model = "resnet20";
  c.dataset = "synthetic";
  c.train_limit = 192;
  c.test_limit = 64;
  c.batch_size = 32;
  c.epochs = 2;
  c.lr = 0.05;
  c.out = out;
  c.threads = 2;
  c.log_every = 1;
  c.seed = 3;
  return c;
}
}  // namespace

TEST(Trainer, WritesItsFilesAndResumesBitIdentically) {
  std::string a = tmpdir("full"), b = tmpdir("killed");
  auto s = train::run_training(small_run(a));
  ASSERT_TRUE(s.completed);
  for (const char* f : {"config.json", "metrics.jsonl", "summary.json", "model.safetensors", "checkpoint.safetensors"})
    EXPECT_TRUE(std::ifstream(a + "/" + f).good()) << f;
  auto sum = nlohmann::json::parse(slurp(a + "/summary.json"));
  for (const char* k : {"model", "dataset", "epochs", "final_test_accuracy", "best_test_accuracy", "train_seconds",
                        "time_to_target_seconds", "images_per_second"})
    EXPECT_TRUE(sum.contains(k)) << k;
  EXPECT_GT(sum["final_test_accuracy"].get<double>(), 0.2);  // 10 classes: better than chance
  // The machine it ran on: the bench scripts compare wall times only within one (core/machine.h).
  ASSERT_TRUE(sum.contains("machine"));
  for (const char* k : {"cpu", "cpu_isa", "host", "boot_id"}) {
    ASSERT_TRUE(sum["machine"].contains(k)) << k;
    EXPECT_FALSE(sum["machine"][k].get<std::string>().empty()) << k;
  }
  EXPECT_EQ(sum["machine"]["hardware_threads"].get<int>(), int(std::thread::hardware_concurrency()));
  EXPECT_NE(sum["machine"]["cpu_isa"], "other") << "an ISA oneDNN names that core/machine.cpp does not";
  EXPECT_EQ(sum["cpu_layout"], cpu_layout_name(cpu_layout()));

  // Interrupted at step 4 (mid-epoch 1), then at step 9 (epoch 2), resumed each time.
  auto c = small_run(b);
  c.checkpoint_every = 1;
  c.stop_after_steps = 4;
  EXPECT_FALSE(train::run_training(c).completed);
  c.resume = true;
  c.stop_after_steps = 5;
  EXPECT_FALSE(train::run_training(c).completed);
  c.stop_after_steps = 0;
  ASSERT_TRUE(train::run_training(c).completed);
  auto wa = train::load_safetensors(a + "/model.safetensors"), wb = train::load_safetensors(b + "/model.safetensors");
  ASSERT_EQ(wa.size(), wb.size());
  for (auto& [k, t] : wa) EXPECT_EQ(t.to_vector<float>(), wb.at(k).to_vector<float>()) << k;
}

TEST(Trainer, BadInputIsNamed) {
  std::string d = tmpdir("bad");
  auto expect_error = [&](train::TrainConfig c, const std::string& needle) {
    try {
      train::run_training(c);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c = small_run(d);
  c.model = "resnet21";
  expect_error(c, "unknown model 'resnet21'");
  c = small_run(d);
  c.dataset = "imagenet22k";
  expect_error(c, "unknown dataset 'imagenet22k'");
  c = small_run(d);
  c.dataset = "cifar10";
  c.data_dir = d + "/nowhere";
  expect_error(c, "data_batch_1.bin");
  c = small_run(d);
  c.batch_size = 100000;
  expect_error(c, "--batch-size");
  c = small_run(d);
  c.device = "tpu";
  expect_error(c, "unknown device 'tpu'");
  c = small_run(d);
  c.lr = 1e30;  // the first update overflows the weights: the loss becomes inf/NaN
  c.epochs = 1;
  expect_error(c, "the training loss became");
  // A precision the device cannot train in is refused, naming both.
  c = small_run(d);
  c.precision = DType::f16;
  expect_error(c, "--precision fp16 is for GPUs");
}

// Note [Deferred reads]: one process reads a step's loss behind the next step (or before a
// log line, an evaluation or a checkpoint), after that step's backward and update ran.
// A loss that is not finite still stops the run before anything of its step is written:
// the error names the step, every checkpoint on disk is from a step before it and holds
// finite weights, and no model.safetensors is written.
TEST(Trainer, ALossReadLateStillStopsTheRunBeforeAnythingIsSaved) {
  const std::string d = tmpdir("nan_late");
  auto c = small_run(d);
  c.epochs = 1;
  c.lr = 1e30;  // the first update overflows the weights
  c.log_every = 1000;  // no log step reads the loss: the next step's settling finds it
  c.checkpoint_every = 2;
  c.keep_checkpoints = 10;
  std::string what;
  try {
    train::run_training(c);
  } catch (const Error& e) {
    what = e.what();
  }
  ASSERT_NE(what.find("the training loss became"), std::string::npos) << what;
  int64_t bad_step = -1;
  std::ifstream m(d + "/metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "error") bad_step = j.at("step").get<int64_t>();
  }
  ASSERT_GE(bad_step, 1) << "the first step's loss comes from the initial weights";
  EXPECT_NE(what.find("at step " + std::to_string(bad_step) + " "), std::string::npos) << what;
  EXPECT_FALSE(std::ifstream(d + "/model.safetensors").good());
  for (const auto& f : std::filesystem::directory_iterator(d)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("checkpoint", 0) != 0) continue;
    const train::TensorMap t = train::load_safetensors(f.path().string());
    for (const auto& [k, v] : t) {
      if (!is_floating(v.dtype())) continue;
      for (double x : v.to(DType::f64).to_vector<double>()) ASSERT_TRUE(std::isfinite(x)) << name << " " << k;
    }
  }
}

TEST(Trainer, ResumeRefusesAnotherModelsCheckpoint) {
  std::string d = tmpdir("other");
  auto c = small_run(d);
  c.epochs = 1;
  c.train_limit = 64;
  train::run_training(c);
  c.model = "resnet32";
  c.resume = true;
  try {
    train::run_training(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was trained with --model resnet20, not resnet32"), std::string::npos)
        << e.what();
  }
}

// The ImageNet recipes are an image folder's defaults (Note [Model-dependent defaults]):
// the LR scales with the global batch, the step schedule falls at 30/60/80 of 90 epochs
// (scaled with --epochs), MobileNetV2 takes its cosine recipe; what the user gave stays.
TEST(Trainer, ImageFoldersDefaultToTheImageNetRecipes) {
  train::TrainConfig r50;
  r50.model = "resnet50", r50.dataset = "imagefolder", r50.batch_size = 64;
  train::apply_model_defaults(r50, {"--dataset", "--batch-size"}, 8);  // a global batch of 512
  EXPECT_DOUBLE_EQ(r50.lr, 0.2);
  EXPECT_DOUBLE_EQ(r50.weight_decay, 1e-4);
  EXPECT_DOUBLE_EQ(r50.momentum, 0.9);
  EXPECT_EQ(r50.epochs, 90);
  EXPECT_EQ(r50.lr_schedule, train::Schedule::step);
  EXPECT_EQ(r50.milestones, (std::vector<int64_t>{30, 60, 80}));
  train::TrainConfig short_run = r50;
  short_run.epochs = 9, short_run.lr = 0.5;
  train::apply_model_defaults(short_run, {"--dataset", "--epochs", "--lr"}, 1);
  EXPECT_EQ(short_run.milestones, (std::vector<int64_t>{3, 6, 8}));
  EXPECT_DOUBLE_EQ(short_run.lr, 0.5);
  train::TrainConfig mb = train::default_config("mobilenetv2", "imagefolder");
  EXPECT_EQ(mb.lr_schedule, train::Schedule::cosine);
  EXPECT_DOUBLE_EQ(mb.weight_decay, 4e-5);
  EXPECT_DOUBLE_EQ(mb.lr, 0.05 * 128 / 256);
  EXPECT_EQ(mb.epochs, 150);
  // Not an image folder: the built-in datasets keep TrainConfig's own defaults.
  const train::TrainConfig cifar = train::default_config("resnet56", "cifar10"), plain;
  EXPECT_DOUBLE_EQ(cifar.lr, plain.lr);
  EXPECT_DOUBLE_EQ(cifar.weight_decay, plain.weight_decay);
  EXPECT_EQ(cifar.epochs, plain.epochs);
  EXPECT_DOUBLE_EQ(train::default_config("transformer-tiny").label_smoothing, 0.1);
  EXPECT_DOUBLE_EQ(plain.label_smoothing, 0.0);
}

// --label-smoothing reaches the training loss (not the evaluation's); --workers 0 resolves
// to a count config.json records; both are checked in the flag's terms.
// Label smoothing mixes the one-hot target with the uniform one, as PyTorch's
// CrossEntropyLoss(label_smoothing=e): on the same first batch and weights the loss is
// (1 - e) * CE + e * U, with U the mean over the classes of -log p, which is at least
// log(classes). So the loss is linear in e, and the U it implies is at least log 10.
TEST(Trainer, LabelSmoothingMixesInTheUniformTarget) {
  auto first_loss = [](double smoothing) {
    auto c = small_run(tmpdir("smoothing_" + std::to_string(int(100 * smoothing))));
    c.label_smoothing = smoothing;
    c.stop_after_steps = 1;
    train::run_training(c);
    std::ifstream f(c.out + "/metrics.jsonl");
    for (std::string l; std::getline(f, l);)
      if (auto j = nlohmann::json::parse(l); j["type"] == "step") return j["loss"].get<double>();
    return -1.0;
  };
  const double plain = first_loss(0), quarter = first_loss(0.25), half = first_loss(0.5);
  ASSERT_GT(plain, 0);
  EXPECT_NEAR(quarter, (plain + half) / 2, 1e-5 * plain);
  const double uniform = (half - 0.5 * plain) / 0.5;
  EXPECT_GT(std::abs(uniform - plain), 1e-4) << "no smoothing: the loss would not depend on it";
  EXPECT_GE(uniform, std::log(10.0) - 1e-5);
}

TEST(Trainer, BadLabelSmoothingAndImageFolderOnlyOptionsAreRefused) {
  auto c = small_run(tmpdir("bad_smoothing"));
  c.label_smoothing = 1;
  EXPECT_NE(eg::testing::error_of([&] { train::run_training(c); }).find("--label-smoothing must be in [0, 1)"),
            std::string::npos);
  c.label_smoothing = 0;
  c.crop_pct = 0.5;
  EXPECT_NE(eg::testing::error_of([&] { train::run_training(c); }).find("apply to --dataset imagefolder"),
            std::string::npos);
}

// --workers 0: the loader decodes on the cores the training threads leave (at least one).
TEST(Trainer, LoaderWorkersDefaultToTheCoresTrainingLeaves) {
  auto c = small_run(tmpdir("default_workers"));
  c.epochs = 1;
  c.workers = 0;
  c.stop_after_steps = 1;
  train::run_training(c);
  const int cores = int(std::thread::hardware_concurrency());
  EXPECT_EQ(nlohmann::json::parse(slurp(c.out + "/config.json"))["workers"].get<int>(), std::max(1, cores - c.threads));
}
