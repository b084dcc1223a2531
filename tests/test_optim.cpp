// optim/: update rules against hand-computed values, schedules, clipping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "freeze/policy.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

using namespace eg;

namespace {
Tensor param(std::vector<float> v) {
  return Tensor::from_vector<float>(v, {int64_t(v.size())}).set_requires_grad(true);
}
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

// The optimizers' multi-tensor steps (ops::sgd_step_multi, ops::adamw_step_multi) give
// the per-parameter ops' bits, step after step, as the learning rate changes and a
// parameter frozen for a step falls behind the others' AdamW step count; the learning
// rate is read from the device, not from the step's arguments.
TEST(Optim, MultiTensorStepsGiveThePerParameterOpsBits) {
  for (bool adamw : {false, true}) {
    Generator g(5);
    std::vector<Tensor> ps, ref_ps;
    // Above the CPU kernels' parallel threshold (32,768 elements), members across the
    // threads' shares: pieces must start where the per-parameter kernels' chunks start.
    for (int64_t n : {7, 1, 300, 33, 40000, 2049, 5000}) {
      ps.push_back(Tensor::randn({n}, g).set_requires_grad(true));
      ref_ps.push_back(ps.back().clone());
    }
    std::unique_ptr<optim::Optimizer> opt;
    if (adamw) opt = std::make_unique<optim::AdamW>(ps, 1e-2, optim::AdamWOptions{0.9, 0.99, 1e-8, 0.05});
    else opt = std::make_unique<optim::SGD>(ps, 0.1, optim::SgdOptions{0.9, 0.0, 5e-4, true});
    std::vector<Tensor> buf(ps.size()), m(ps.size()), v(ps.size());
    std::vector<int64_t> steps(ps.size(), 0);
    for (int step = 0; step < 4; ++step) {
      const double lr = 0.1 / (1 + step);
      opt->set_lr(lr);
      ps[2].set_requires_grad(step != 1);  // frozen for one step
      std::vector<Tensor> grads;
      for (auto& p : ps) grads.push_back(Tensor::randn(p.shape(), g));
      for (size_t i = 0; i < ps.size(); ++i)
        if (ps[i].requires_grad()) ps[i].set_grad(grads[i].clone());
      opt->step();
      for (size_t i = 0; i < ps.size(); ++i) {
        if (i == 2 && step == 1) continue;
        if (adamw) {
          if (!m[i].defined()) m[i] = Tensor::zeros(ps[i].shape()), v[i] = Tensor::zeros(ps[i].shape());
          ops::AdamWParams a{lr, 0.9, 0.99, 1e-8, 0.05, ++steps[i]};
          ops::call(ops::adamw_step, ref_ps[i], grads[i], m[i], v[i], a);
        } else {
          ops::SgdParams s{lr, 0.9, 0.0, 5e-4, true, !buf[i].defined()};
          if (!buf[i].defined()) buf[i] = Tensor::empty(ps[i].shape());
          ops::call(ops::sgd_step, ref_ps[i], grads[i], buf[i], s);
        }
      }
      for (size_t i = 0; i < ps.size(); ++i)
        ASSERT_EQ(ps[i].to_vector<float>(), ref_ps[i].to_vector<float>())
            << (adamw ? "AdamW" : "SGD") << " step " << step << " parameter " << i;
    }
  }
}

TEST(Optim, ClipGradNorm) {
  Tensor a = param({0, 0}), b = param({0});
  a.set_grad(Tensor::from_vector<float>({3, 0}, {2}));
  b.set_grad(Tensor::from_vector<float>({4}, {1}));
  EXPECT_NEAR(optim::clip_grad_norm({a, b}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().to_vector<float>()[0], 0.6, 1e-5);
  EXPECT_NEAR(b.grad().to_vector<float>()[0], 0.8, 1e-5);
}

// The optimizer's clipping works on its gradient buckets (one reduction each) and
// gives the per-parameter result; frozen parameters take no part.
TEST(Optim, ClipGradNormOverBucketsMatchesPerParameter) {
  std::vector<Tensor> ps = {param({0, 0, 0}), param({0, 0}), param({0})};
  optim::SGD opt(ps, 0.1, {0.0, 0.0, 0.0, false});
  ps[2].set_requires_grad(false);
  opt.zero_grad();
  ps[0].grad().copy_(Tensor::from_vector<float>({1, 2, 2}, {3}));
  ps[1].grad().copy_(Tensor::from_vector<float>({4, 0}, {2}));
  const double norm = opt.clip_grad_norm(1.0);
  EXPECT_NEAR(norm, 5.0, 1e-6);  // sqrt(1 + 4 + 4 + 16)
  EXPECT_NEAR(ps[0].grad().to_vector<float>()[1], 0.4, 1e-5);
  EXPECT_NEAR(ps[1].grad().to_vector<float>()[0], 0.8, 1e-5);
  EXPECT_NEAR(opt.clip_grad_norm(10.0), 1.0, 1e-5) << "under the cap: unchanged";
  EXPECT_NEAR(ps[0].grad().to_vector<float>()[1], 0.4, 1e-5);
}

// Clipping without a host read (Note [Deferred reads]) gives the host path's bits: the same
// norm, the same coefficient applied in f32, gradients untouched within the bound; a
// non-finite norm scales nothing and is reported.
TEST(Optim, ClipWithoutAHostReadGivesTheHostPathsBits) {
  auto grads_after = [&](bool later, double max_norm, double* norm, bool poison = false) {
    std::vector<Tensor> ps = {param({0, 0, 0, 0, 0}), param({0, 0, 0}), param({0, 0})};
    optim::SGD opt(ps, 0.1, {0.0, 0.0, 0.0, false});
    opt.set_bucket_caps(16, 16);  // more than one bucket
    opt.zero_grad();
    Generator gg(5);
    for (auto& p : ps) p.grad().copy_(Tensor::randn(p.shape(), gg));
    if (poison) ps[1].grad().copy_(Tensor::from_vector<float>({1, NAN, 2}, {3}));
    *norm = later ? opt.clip_grad_norm_later(max_norm).value() : opt.clip_grad_norm(max_norm);
    std::vector<float> all;
    for (auto& p : ps)
      for (float v : p.grad().to_vector<float>()) all.push_back(v);
    return all;
  };
  for (double max_norm : {0.5, 1e9}) {  // clipped; within the bound
    double n_host = 0, n_later = 0;
    const std::vector<float> host = grads_after(false, max_norm, &n_host),
                             later = grads_after(true, max_norm, &n_later);
    EXPECT_EQ(n_host, n_later) << max_norm;
    ASSERT_EQ(host.size(), later.size());
    for (size_t i = 0; i < host.size(); ++i) EXPECT_EQ(host[i], later[i]) << "max_norm " << max_norm << " at " << i;
  }
  double n = 0;
  const std::vector<float> poisoned = grads_after(true, 0.5, &n, true);
  EXPECT_TRUE(std::isnan(n));
  EXPECT_EQ(poisoned[5], 1.f) << "a non-finite norm scales nothing";
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

// ---- gradient buckets (optim/buckets.h)

namespace {

double amax(const eg::Tensor& t) {
  double m = 0;
  for (float v : t.to(eg::Device::cpu()).to_vector<float>()) m = std::max(m, double(std::abs(v)));
  return m;
}

size_t grad_bytes(const std::vector<eg::Tensor>& ps, bool only_trainable) {
  size_t s = 0;
  for (auto& p : ps)
    if (!only_trainable || p.requires_grad()) s += size_t(p.numel()) * eg::dtype_size(p.dtype());
  return s;
}

TEST(GradBuckets, ActiveGradientsLiveInAFewFlatBuffersRebuiltOnFreeze) {
  using namespace eg;
  models::ModelConfig mc;
  mc.name = "resnet20";
  mc.image_size = 16;
  Generator g(3);
  auto m = models::build_model(mc, g);
  optim::SGD opt(m->parameters(), 0.1, {0.9, 0, 5e-4, false});
  opt.zero_grad();
  const auto& gb = opt.grad_buckets();
  EXPECT_EQ(gb.rebuilds(), 1);
  // Gradient-ready order (the last layer's parameters first), DDP's caps: ResNet-20's
  // 1.09 MB of gradients make a first bucket of at most 1 MiB and one more.
  const auto params = m->parameters();
  ASSERT_EQ(gb.buckets().size(), 2u);
  EXPECT_EQ(gb.buckets()[0].members.front(), params.size() - 1);
  EXPECT_EQ(gb.buckets()[1].members.back(), 0u);
  EXPECT_LE(gb.buckets()[0].flat.nbytes(), size_t(1) << 20);
  EXPECT_EQ(gb.bytes(), grad_bytes(params, false));
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined());
    const size_t b = i >= gb.buckets()[1].members.front() + 1 ? 0 : 1;
    EXPECT_TRUE(params[i].grad().same_storage(gb.buckets()[b].flat)) << i;
  }
  // A training step accumulates into the views; the next zero_grad does not rebuild.
  Tensor x = Tensor::randn({4, 3, 16, 16}, g);
  Tensor loss = fn::cross_entropy(m->forward(x), Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4}));
  loss.backward();
  EXPECT_GT(amax(gb.buckets()[0].flat), 0.0);
  EXPECT_GT(amax(gb.buckets()[1].flat), 0.0);
  opt.step();
  opt.zero_grad();
  EXPECT_EQ(gb.rebuilds(), 1);
  EXPECT_EQ(amax(gb.buckets()[0].flat), 0.0);
  EXPECT_EQ(amax(gb.buckets()[1].flat), 0.0);

  // Freezing the front: the frozen parameters leave the buckets and own no gradient.
  freeze::apply_frozen_prefix(*m, 4);
  opt.zero_grad();
  EXPECT_EQ(gb.rebuilds(), 2);
  EXPECT_EQ(gb.bytes(), grad_bytes(m->parameters(), true));
  EXPECT_LT(gb.bytes(), grad_bytes(m->parameters(), false));
  for (auto& [n, mod] : m->layer_modules())
    for (auto& p : mod->parameters()) EXPECT_EQ(p.grad().defined(), !mod->is_frozen()) << n;
  // Unfreezing brings them back.
  freeze::apply_frozen_prefix(*m, 0);
  opt.zero_grad();
  EXPECT_EQ(gb.rebuilds(), 3);
  EXPECT_EQ(gb.bytes(), grad_bytes(m->parameters(), false));
}

TEST(GradBuckets, SplitAtTheCapAndByDtype) {
  using namespace eg;
  std::vector<Tensor> ps;
  for (int i = 0; i < 5; ++i) {
    Tensor p = Tensor::zeros({256});  // 1 KiB each
    p.set_requires_grad(true);
    ps.push_back(p);
  }
  Tensor d = Tensor::zeros({8}, DType::f64);
  d.set_requires_grad(true);
  ps.insert(ps.begin() + 2, d);
  ps[4].set_grad(Tensor::full({256}, 3.0));  // carried over into its view
  optim::GradBuckets gb(2048, 2048);
  EXPECT_TRUE(gb.sync(ps));
  EXPECT_FALSE(gb.sync(ps));
  // Gradient-ready order, the reverse of the list: [p4 p3] [p2] [d] [p1 p0]: the cap
  // holds two, the f64 one breaks the run.
  ASSERT_EQ(gb.buckets().size(), 4u);
  EXPECT_EQ(gb.buckets()[0].members, (std::vector<size_t>{5, 4}));
  EXPECT_EQ(gb.buckets()[1].members, (std::vector<size_t>{3}));
  EXPECT_EQ(gb.buckets()[2].members, (std::vector<size_t>{2}));
  EXPECT_EQ(gb.buckets()[3].members, (std::vector<size_t>{1, 0}));
  // A smaller first bucket, so that the first all-reduce starts early: [p4] [p3 p2] [d] [p1 p0].
  optim::GradBuckets small_first(4096, 1024);
  small_first.sync(ps);
  ASSERT_EQ(small_first.buckets().size(), 4u);
  EXPECT_EQ(small_first.buckets()[0].members, (std::vector<size_t>{5}));
  EXPECT_EQ(small_first.buckets()[1].members, (std::vector<size_t>{4, 3}));
  EXPECT_NE(small_first.layout_hash(), gb.layout_hash());
  gb.sync(ps);
  EXPECT_EQ(ps[4].grad().to_vector<float>(), std::vector<float>(256, 3.f));
  EXPECT_EQ(ps[2].grad().dtype(), DType::f64);
  gb.zero();
  EXPECT_EQ(amax(ps[4].grad()), 0.0);
}

}  // namespace
