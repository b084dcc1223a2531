// Dynamic loss scaling (optim/loss_scaler.h): the scaler's rule, and training runs that
// scale, overflow, skip and resume.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "optim/loss_scaler.h"
#include "tests/test_util.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace eg;
using nlohmann::json;

namespace {

std::vector<json> lines(const std::string& path, const std::string& type) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) {
    json j = json::parse(l);
    if (j.value("type", "") == type) out.push_back(j);
  }
  return out;
}

bool all_finite(const std::map<std::string, Tensor>& weights) {
  for (auto& [k, t] : weights)
    for (float v : t.to_vector<float>())
      if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace

// Halved at an overflow, doubled after growth_interval clean steps in a row (an
// overflow restarts the count), as GradScaler.
TEST(LossScale, HalvesAtAnOverflowAndDoublesAfterTheGrowthInterval) {
  optim::LossScaler s({true, 1024, 3});
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048) << "doubled after 3 clean steps";
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024) << "halved at an overflow";
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024) << "the overflow restarted the count";
  s.update(false);
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.skipped(), 1);
  json state;
  s.save(state);
  optim::LossScaler t({true, 1, 3});
  t.load(state);
  EXPECT_EQ(t.scale(), 2048);
  EXPECT_EQ(t.skipped(), 1);
  EXPECT_THROW(optim::LossScaler({true, 0, 3}), Error);
  EXPECT_THROW(optim::LossScaler({true, 1, 0}), Error);
}

// unscale divides every bucket by the scale and reports an inf or NaN in any of them.
TEST(LossScale, UnscaleDividesEveryBucketAndFlagsANonFiniteGradient) {
  std::vector<Tensor> params = {Tensor::zeros({3}).set_requires_grad(true), Tensor::zeros({5}).set_requires_grad(true)};
  optim::GradBuckets b(8, 8);  // 8 bytes a bucket: one parameter each
  b.sync(params);
  ASSERT_EQ(b.buckets().size(), 2u);
  Tensor g0 = params[0].grad(), g1 = params[1].grad();  // views into the two buckets
  ASSERT_EQ(g0.numel(), 3);
  g0.copy_(Tensor::from_vector<float>({8, 16, -4}, {3}));
  g1.copy_(Tensor::from_vector<float>({1, 2, 3, 4, 5}, {5}));
  optim::LossScaler s({true, 4, 10});
  EXPECT_FALSE(s.unscale(b));
  EXPECT_EQ(g0.to_vector<float>(), (std::vector<float>{2, 4, -1}));
  EXPECT_EQ(g1.to_vector<float>(), (std::vector<float>{0.25f, 0.5f, 0.75f, 1, 1.25f}));
  g1.copy_(Tensor::from_vector<float>({1, 2, INFINITY, 4, 5}, {5}));
  EXPECT_TRUE(s.unscale(b)) << "an inf in the second bucket";
  g0.copy_(Tensor::from_vector<float>({NAN, 0, 0}, {3}));
  g1.zero_();
  EXPECT_TRUE(s.unscale(b)) << "a NaN in the first";
}

// A power-of-two scale that never overflows changes no bit: every gradient is exactly S
// times the unscaled one, and dividing by S is exact.
TEST(LossScale, APowerOfTwoScaleWithoutOverflowTrainsTheSameWeights) {
  const std::string a = eg::testing::fresh_dir("eg_ls_off"), b = eg::testing::fresh_dir("eg_ls_on");
  train::TrainConfig c = eg::testing::small_image_run(a);
  c.epochs = 2;
  ASSERT_TRUE(train::run_training(c).completed);
  c.out = b;
  c.loss_scale = {true, 1024, 1000000};
  ASSERT_TRUE(train::run_training(c).completed);
  eg::testing::expect_same_weights(a, b);
  const json sj = json::parse(std::ifstream(b + "/summary.json"));
  EXPECT_EQ(sj["loss_scale_final"], 1024);
  EXPECT_EQ(sj["steps_skipped_overflow"], 0);
}

// A scale far too large: the scaled loss overflows f32, the steps are skipped (logged,
// the weights untouched) and the scale halves until the gradients are finite, then grows
// every 3 clean steps and overflows again now and then. No weight is ever NaN, and a run
// killed and resumed scales, skips and ends exactly as the uninterrupted one.
TEST(LossScale, OverflowsAreSkippedNeverWrittenAndTheScaleResumes) {
  const std::string full = eg::testing::fresh_dir("eg_ls_full"), killed = eg::testing::fresh_dir("eg_ls_killed");
  auto config = [](const std::string& out) {
    train::TrainConfig c = eg::testing::small_image_run(out);
    c.epochs = 2;
    c.log_every = 1;
    c.loss_scale = {true, std::ldexp(1.0, 135), 3};
    return c;
  };
  ASSERT_TRUE(train::run_training(config(full)).completed);
  const auto steps = lines(full + "/metrics.jsonl", "step");
  ASSERT_EQ(steps.size(), 32u);
  int64_t skipped = 0, first_clean = -1;
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool skip = steps[i].value("skipped", "") == "overflow";
    skipped += skip;
    if (!skip && first_clean < 0) first_clean = int64_t(i);
    if (i > 0) {  // halved after a skip, else the same or doubled
      const double before = steps[i - 1]["loss_scale"], now = steps[i]["loss_scale"];
      EXPECT_EQ(now, steps[i - 1].value("skipped", "") == "overflow" ? before / 2
                     : now == before                                 ? before
                                                                     : before * 2)
          << "step " << i + 1;
    }
  }
  // 2^135 x a loss of ~2.3 exceeds f32's 3.4e38 = 2^128; so does every scale down to
  // 2^127, and some below it (the backward's intermediate values are larger still).
  EXPECT_GE(first_clean, 8) << "the first steps overflow";
  EXPECT_LT(first_clean, 32) << "the scale came down until a step was clean";
  const json sj = json::parse(std::ifstream(full + "/summary.json"));
  EXPECT_EQ(sj["steps_skipped_overflow"], skipped);
  EXPECT_TRUE(all_finite(train::load_safetensors(full + "/model.safetensors")));

  eg::testing::run_stopped_and_resumed(config(killed), 12);
  eg::testing::expect_same_weights(full, killed);
  const json sk = json::parse(std::ifstream(killed + "/summary.json"));
  EXPECT_EQ(sk["loss_scale_final"], sj["loss_scale_final"]);
  EXPECT_EQ(sk["steps_skipped_overflow"], sj["steps_skipped_overflow"]);
}
