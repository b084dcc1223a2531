// Dynamic loss scaling (optim/loss_scaler.h): the scaler's rule, and training runs that
// scale, overflow, skip and resume.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/device.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
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

// Loss scaling's found-inf flag as a step's unscale leaves it.
Tensor flag(bool overflow) { return Tensor::full({1}, overflow ? 1.0 : 0.0, DType::f32); }

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
  s.update(flag(false));
  s.update(flag(false));
  EXPECT_EQ(s.scale(), 1024);
  s.update(flag(false));
  EXPECT_EQ(s.scale(), 2048) << "doubled after 3 clean steps";
  s.update(flag(false));
  s.update(flag(true));
  EXPECT_EQ(s.scale(), 1024) << "halved at an overflow";
  s.update(flag(false));
  s.update(flag(false));
  EXPECT_EQ(s.scale(), 1024) << "the overflow restarted the count";
  s.update(flag(false));
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
  EXPECT_EQ(s.unscale_on_device(b).item(), 0);
  EXPECT_EQ(g0.to_vector<float>(), (std::vector<float>{2, 4, -1}));
  EXPECT_EQ(g1.to_vector<float>(), (std::vector<float>{0.25f, 0.5f, 0.75f, 1, 1.25f}));
  g1.copy_(Tensor::from_vector<float>({1, 2, INFINITY, 4, 5}, {5}));
  EXPECT_EQ(s.unscale_on_device(b).item(), 1) << "an inf in the second bucket";
  g0.copy_(Tensor::from_vector<float>({NAN, 0, 0}, {3}));
  g1.zero_();
  EXPECT_EQ(s.unscale_on_device(b).item(), 1) << "a NaN in the first";
}

// The flag, the skip and the update decided where the gradients are, with no host read
// (Note [Host syncs]): an overflowing step writes no weight, no momentum and no AdamW step
// count, and halves the scale; a clean one trains; each optimizer's multi-tensor step.
TEST(LossScale, TheFlagSkipsTheStepWhereTheGradientsAreWithoutAHostRead) {
  for (int adamw = 0; adamw < 2; ++adamw) {
    std::vector<Tensor> params = {Tensor::full({3}, 1.0).set_requires_grad(true),
                                  Tensor::full({5}, 2.0).set_requires_grad(true)};
    std::unique_ptr<optim::Optimizer> opt;
    if (adamw) opt = std::make_unique<optim::AdamW>(params, 0.1);
    else opt = std::make_unique<optim::SGD>(params, 0.1, optim::SgdOptions{0.9, 0, 0, false});
    optim::LossScaler s({true, 1024, 100});
    auto step_with = [&](float g) {
      opt->zero_grad();
      for (auto& p : params) p.grad().copy_(Tensor::full(p.shape(), double(g) * 1024));
      const int64_t syncs = host_syncs();
      const Tensor found = s.unscale_on_device(opt->grad_buckets());
      opt->step_unless(found);
      s.update(found);
      return host_syncs() - syncs;
    };
    // SGD's first step makes its momentum buffers one parameter at a time: the flag read once.
    EXPECT_EQ(step_with(0.5f), adamw ? 0 : 1) << "a clean step";
    EXPECT_NE(params[1].to_vector<float>(), std::vector<float>(5, 2.f)) << "the clean step trained";
    EXPECT_EQ(step_with(0.5f), 0) << "past SGD's first momentum step: the multi-tensor one";
    const std::vector<float> w2 = params[1].to_vector<float>();
    const auto state2 = opt->state_dict();
    EXPECT_EQ(step_with(INFINITY), 0) << "an overflowing step";
    EXPECT_EQ(params[1].to_vector<float>(), w2) << "no weight written";
    for (auto& [k, t] : opt->state_dict())
      EXPECT_EQ(t.to(DType::f64).to_vector<double>(), state2.at(k).to(DType::f64).to_vector<double>())
          << k << ": no state written (adamw " << adamw << ")";
    EXPECT_EQ(s.scale(), 512) << "halved";
    EXPECT_EQ(s.skipped(), 1);
    if (adamw) {
      EXPECT_EQ(opt->state_dict().at("1.step").to(DType::f64).to_vector<double>()[0], 2.0);
    }
  }
}

// A CUDA graph captures a step only once the optimizer would launch nothing from the
// host (Note [Graphed steps]): SGD's momentum buffers take their first step on the host,
// reading the overflow flag there, so an overflowing first step keeps the warm-up going;
// AdamW's counts move to the device at its first step; parameters of two dtypes can never
// take one launch, and say so.
TEST(LossScale, AnOverflowingFirstStepPutsOffTheCapture) {
  for (int adamw = 0; adamw < 2; ++adamw) {
    std::vector<Tensor> params = {Tensor::full({3}, 1.0).set_requires_grad(true),
                                  Tensor::full({5}, 2.0).set_requires_grad(true)};
    std::unique_ptr<optim::Optimizer> opt;
    if (adamw) opt = std::make_unique<optim::AdamW>(params, 0.1);
    else opt = std::make_unique<optim::SGD>(params, 0.1, optim::SgdOptions{0.9, 0, 0, false});
    optim::LossScaler s({true, 1024, 100});
    auto step_with = [&](float g) {
      opt->zero_grad();
      for (auto& p : params) p.grad().copy_(Tensor::full(p.shape(), double(g) * 1024));
      const Tensor found = s.unscale_on_device(opt->grad_buckets());
      opt->step_unless(found);
      s.update(found);
    };
    opt->zero_grad();
    EXPECT_FALSE(opt->ready_to_capture()) << "before any step (adamw " << adamw << ")";
    step_with(INFINITY);
    EXPECT_EQ(opt->ready_to_capture(), bool(adamw)) << "after an overflowing first step (adamw " << adamw << ")";
    step_with(0.5f);
    EXPECT_TRUE(opt->ready_to_capture()) << "after a clean step (adamw " << adamw << ")";
  }
  std::vector<Tensor> mixed = {Tensor::full({3}, 1.0).set_requires_grad(true),
                               Tensor::full({3}, 1.0, DType::bf16).set_requires_grad(true)};
  optim::SGD sgd(mixed, 0.1);
  sgd.zero_grad();
  EXPECT_NE(eg::testing::error_of([&] { (void)sgd.ready_to_capture(); }).find("several dtypes"), std::string::npos);
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

  // Logged every 4 steps, each skipped step still has its line, a step late where it is
  // no log step (its overflow is read behind the next step: no host read in the step).
  const std::string sparse = eg::testing::fresh_dir("eg_ls_sparse");
  train::TrainConfig c4 = config(sparse);
  c4.log_every = 4;
  ASSERT_TRUE(train::run_training(c4).completed);
  const auto lines4 = lines(sparse + "/metrics.jsonl", "step");
  int64_t skipped4 = 0, last = 0;
  for (const auto& l : lines4) {
    skipped4 += l.value("skipped", "") == "overflow";
    EXPECT_EQ(l["images"], 16) << "step " << l["step"] << ": its own batch";
    EXPECT_GT(l["step"].get<int64_t>(), last) << "in step order";
    last = l["step"];
  }
  EXPECT_EQ(skipped4, skipped);
  for (const auto& l : steps)  // the same steps skipped, with the same scales
    if (l.value("skipped", "") == "overflow") {
      bool found = false;
      for (const auto& m : lines4)
        found |= m["step"] == l["step"] && m.value("skipped", "") == "overflow" && m["loss_scale"] == l["loss_scale"];
      EXPECT_TRUE(found) << "step " << l["step"];
    }
  eg::testing::expect_same_weights(full, sparse);

  eg::testing::run_stopped_and_resumed(config(killed), 12);
  eg::testing::expect_same_weights(full, killed);
  const json sk = json::parse(std::ifstream(killed + "/summary.json"));
  EXPECT_EQ(sk["loss_scale_final"], sj["loss_scale_final"]);
  EXPECT_EQ(sk["steps_skipped_overflow"], sj["steps_skipped_overflow"]);
}
