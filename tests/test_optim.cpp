// optim/: update rules against hand-computed values, schedules, clipping.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/optimizer.h"
#include "optim/schedule.h"

using namespace eg;

namespace {
Tensor param(std::vector<float> v) { return Tensor::from_vector<float>(v, {int64_t(v.size())}).set_requires_grad(true); }
}  // namespace

TEST(Optim, SgdMomentumNesterovWeightDecayMatchesPyTorchFormulas) {
  Tensor p = param({1.0f, -2.0f});
  optim::SGD opt({p}, 0.1, {0.9, 0.0, 0.01, true});
  p.set_grad(Tensor::from_vector<float>({0.5f, 0.25f}, {2}));
  opt.step();
  // g = 0.5 + 0.01*1 = 0.51; buf = g; nesterov: g + 0.9 buf = 0.969; p = 1 - 0.0969
  EXPECT_NEAR(p.to_vector<float>()[0], 1.0 - 0.1 * 0.969, 1e-6);
  double p1 = 1.0 - 0.1 * 0.969, g2 = 0.5 + 0.01 * p1, buf2 = 0.9 * 0.51 + g2;
  opt.step();
  EXPECT_NEAR(p.to_vector<float>()[0], p1 - 0.1 * (g2 + 0.9 * buf2), 1e-6);
}

TEST(Optim, AdamWFirstStepMovesByLr) {
  Tensor p = param({1.0f, 1.0f});
  optim::AdamW opt({p}, 0.01, {0.9, 0.999, 1e-8, 0.1});
  p.set_grad(Tensor::from_vector<float>({3.0f, -0.001f}, {2}));
  opt.step();
  // bias-corrected first step is lr * sign(g) (up to eps), after decay p *= 1 - lr wd
  auto v = p.to_vector<float>();
  EXPECT_NEAR(v[0], 1.0 * (1 - 0.001) - 0.01, 1e-5);
  EXPECT_NEAR(v[1], 1.0 * (1 - 0.001) + 0.01, 1e-5);
  auto sd = opt.state_dict();
  EXPECT_EQ(sd.at("0.step").item(), 1.0);
}

TEST(Optim, FrozenParameterSkippedAndStateKept) {
  Tensor p = param({1.0f});
  optim::SGD opt({p}, 0.1, {0.9, 0, 0, false});
  p.set_grad(Tensor::from_vector<float>({1.0f}, {1}));
  opt.step();
  float after1 = p.to_vector<float>()[0];
  p.set_requires_grad(false);
  opt.step();
  EXPECT_EQ(p.to_vector<float>()[0], after1);
  p.set_requires_grad(true);
  opt.step();  // buf = 0.9*1 + 1 = 1.9
  EXPECT_NEAR(p.to_vector<float>()[0], after1 - 0.19f, 1e-6);
}

TEST(Optim, ClipGradNorm) {
  Tensor a = param({0, 0}), b = param({0});
  a.set_grad(Tensor::from_vector<float>({3, 0}, {2}));
  b.set_grad(Tensor::from_vector<float>({4}, {1}));
  EXPECT_NEAR(optim::clip_grad_norm({a, b}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().to_vector<float>()[0], 0.6, 1e-5);
  EXPECT_NEAR(b.grad().to_vector<float>()[0], 0.8, 1e-5);
}

TEST(Optim, Schedules) {
  EXPECT_DOUBLE_EQ(optim::step_lr(0.1, 30)->lr_at(29), 0.1);
  EXPECT_NEAR(optim::step_lr(0.1, 30)->lr_at(30), 0.01, 1e-15);
  auto ms = optim::multistep_lr(0.1, {100, 150});
  EXPECT_NEAR(ms->lr_at(99), 0.1, 1e-15);
  EXPECT_NEAR(ms->lr_at(100), 0.01, 1e-15);
  EXPECT_NEAR(ms->lr_at(150), 0.001, 1e-15);
  auto cos = optim::cosine_lr(1.0, 100, 0.1);
  EXPECT_DOUBLE_EQ(cos->lr_at(0), 1.0);
  EXPECT_NEAR(cos->lr_at(50), 0.55, 1e-12);
  EXPECT_DOUBLE_EQ(cos->lr_at(100), 0.1);
  auto wu = optim::linear_warmup(optim::constant_lr(1.0), 10);
  EXPECT_DOUBLE_EQ(wu->lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(wu->lr_at(9), 1.0);
  auto isq = optim::inverse_sqrt_lr(1e-3, 4000);
  EXPECT_NEAR(isq->lr_at(3999), 1e-3, 1e-12);
  EXPECT_LT(isq->lr_at(100), isq->lr_at(3999));
  EXPECT_NEAR(isq->lr_at(15999), 0.5e-3, 1e-12);
  auto ld = optim::linear_decay_lr(1.0, 10, 0.0);
  EXPECT_DOUBLE_EQ(ld->lr_at(5), 0.5);
  EXPECT_DOUBLE_EQ(ld->lr_at(20), 0.0);
  EXPECT_THROW(optim::step_lr(0.1, 0), Error);
  EXPECT_THROW(optim::multistep_lr(0.1, {5, 2}), Error);
}
