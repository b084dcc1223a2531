// Small helpers shared by the tests.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "core/device.h"
#include "core/error.h"
#include "train/config.h"
#include "train/safetensors.h"
#include "train/trainer.h"

namespace eg::testing {

// An empty directory TempDir()/name (whatever was there is removed first).
inline std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// The CPU's activation layout (core/device.h) set for a scope, the one before restored.
class CpuLayoutSetting {
 public:
  explicit CpuLayoutSetting(CpuLayout l) { set_cpu_layout(l); }
  ~CpuLayoutSetting() { set_cpu_layout(was_); }
  CpuLayoutSetting(const CpuLayoutSetting&) = delete;
  CpuLayoutSetting& operator=(const CpuLayoutSetting&) = delete;

 private:
  CpuLayout was_ = cpu_layout();
};

// The message of the eg::Error `f` throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A whole file as bytes ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The small image run the trainer tests share: ResNet-20 on 256 synthetic images in
// batches of 16 (16 steps an epoch), 4 epochs, the LR falling 10x at epoch 3, 2 threads.
inline train::TrainConfig small_image_run(const std::string& out) {
  train::TrainConfig c;
  c.model = "resnet20";
  c.dataset = "synthetic";
  c.train_limit = 256;
  c.test_limit = 64;
  c.batch_size = 16;
  c.epochs = 4;
  c.lr = 0.05;
  c.milestones = {3};
  c.out = out;
  c.threads = 2;
  c.seed = 5;
  return c;
}

// Egeria set to decide within such a run: bootstrapping checked every n = 2 steps (by
// default the check spans an epoch or a tenth of the run), W = 2, T at half the largest
// early slope (the paper: 20%: in a 64-step run at batch 16 the readings are noisy, and
// whether two in a row fall under 20% depends on the last bits of the kernels'
// arithmetic; at 50% the stem freezes under every kernel variant tried: plain and
// blocked activations, -O2 and -O3), readings inline, one unit per layer module (in 64
// steps the stem alone reaches W stale readings; the paper's coarser units are tested
// in test_partition.cpp).
inline void use_fast_egeria(train::TrainConfig& c) {
  c.freezing.policy = "egeria";
  c.freezing.tracker.interval = 2;
  c.freezing.tracker.bootstrap_interval = -1;
  c.freezing.tracker.window = 2;
  c.freezing.tracker.tolerance_coef = 0.5;
  c.freezing.reference.synchronous = true;
  c.freezing.units = train::FreezeUnits::layers;
}

// `c` run as if killed after `stop` steps (a checkpoint every step), then resumed to its end.
inline void run_stopped_and_resumed(train::TrainConfig c, int64_t stop) {
  c.checkpoint_every = 1;
  c.stop_after_steps = stop;
  EXPECT_FALSE(train::run_training(c).completed) << "stopped after " << stop << " steps";
  c.resume = true;
  c.stop_after_steps = 0;
  ASSERT_TRUE(train::run_training(c).completed);
}

// Runs c killed after `first` steps, resumed and killed again after `second` more, and
// resumed to the end; true when the last run completed.
inline bool run_killed_twice(train::TrainConfig c, int64_t first, int64_t second) {
  c.checkpoint_every = 1;
  c.stop_after_steps = first;
  EXPECT_FALSE(train::run_training(c).completed);
  c.resume = true;
  c.stop_after_steps = second;
  EXPECT_FALSE(train::run_training(c).completed);
  c.stop_after_steps = 0;
  return train::run_training(c).completed;
}

// Every tensor of run a's model.safetensors is run b's, bit for bit.
inline void expect_same_weights(const std::string& a, const std::string& b) {
  const auto wa = train::load_safetensors(a + "/model.safetensors"),
             wb = train::load_safetensors(b + "/model.safetensors");
  ASSERT_EQ(wa.size(), wb.size());
  for (auto& [k, t] : wa) EXPECT_EQ(t.to_vector<float>(), wb.at(k).to_vector<float>()) << k << ": " << a << " vs " << b;
}

}  // namespace eg::testing
