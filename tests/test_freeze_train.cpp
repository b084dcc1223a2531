// Freezing mechanics with proof (issue: frozen prefix, optimizer, BatchNorm, resume),
// and every --freeze policy through the trainer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "autograd/node.h"
#include "core/rng.h"
#include "freeze/controller.h"
#include "freeze/plasticity.h"
#include "freeze/policy.h"
#include "layers/layers.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "quant/reference.h"
#include "tests/test_util.h"
#include "train/freezing.h"
#include "train/image_task.h"
#include "train/report.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace eg;

namespace {

// ResNet-20 on 16x16 single-channel images: small enough for many steps in a test.
models::ModelConfig small_config() {
  models::ModelConfig mc;
  mc.name = "resnet20";
  mc.in_channels = 1;
  mc.image_size = 16;
  return mc;
}
models::ModelPtr small_resnet(uint64_t seed) {
  Generator g(seed);
  return models::build_model(small_config(), g);
}
// Layer module `module`'s output for x, as the training model hands it to the controller.
Tensor output_of(models::Model& m, const Tensor& x, int64_t module) {
  autograd::NoGradGuard ng;
  return m.layer_output(x, Tensor(), module);
}

struct Batch {
  Tensor x, y;
};
Batch batch(uint64_t seed) {
  Generator g(seed);
  Tensor x = Tensor::randn({8, 1, 16, 16}, g);
  std::vector<int64_t> y(8);
  for (size_t i = 0; i < 8; ++i) y[i] = int64_t((i * 7 + seed) % 10);
  return {x, Tensor::from_vector(y, {8})};
}

double step(models::Model& m, optim::Optimizer& opt, int64_t k, uint64_t seed) {
  Batch b = batch(seed);
  Tensor loss = fn::cross_entropy(m.forward_frozen(b.x, Tensor(), k), b.y);
  opt.zero_grad();
  loss.backward();
  opt.step();
  return loss.item();
}

std::map<std::string, std::vector<float>> values(const nn::Module& m) {
  std::map<std::string, std::vector<float>> v;
  for (auto& [k, t] : m.state_dict())
    if (t.dtype() == DType::f32) v[k] = t.to_vector<float>();
  return v;
}

TEST(FreezeMechanics, AFrozenPrefixIsBitwiseUnchangedUnderWeightDecayAndMomentum) {
  auto m = small_resnet(1);
  optim::SGD opt(m->parameters(), 0.1, {0.9, 0, 5e-4, true});
  for (uint64_t s = 0; s < 3; ++s) step(*m, opt, 0, s);  // momentum buffers exist
  const int64_t k = 4;
  ASSERT_TRUE(freeze::apply_frozen_prefix(*m, k));
  auto units = m->layer_modules();
  std::vector<std::map<std::string, std::vector<float>>> before;
  for (int64_t i = 0; i < int64_t(units.size()); ++i) before.push_back(values(*units[size_t(i)].second));
  for (uint64_t s = 3; s < 23; ++s) step(*m, opt, k, s);
  for (int64_t i = 0; i < int64_t(units.size()); ++i) {
    auto now = values(*units[size_t(i)].second);
    if (i < k) {
      EXPECT_EQ(now, before[size_t(i)]) << units[size_t(i)].first << " changed while frozen (weights or BN statistics)";
      for (auto& p : units[size_t(i)].second->parameters()) EXPECT_FALSE(p.grad().defined());
    } else {
      EXPECT_NE(now, before[size_t(i)]) << units[size_t(i)].first << " did not train";
    }
  }
}

// The same with the trainer's default, --freeze-bn batch (Note [Frozen BatchNorm
// semantics]): the frozen prefix's parameters, BatchNorm's gamma and beta included,
// are bitwise unchanged; only its BatchNorms' running statistics move, as they do in
// a PyTorch layer frozen with requires_grad_(False).
TEST(FreezeMechanics, WithBatchStatisticsAFrozenPrefixsParametersAreBitwiseUnchanged) {
  auto m = small_resnet(1);
  for (auto& [n, mod] : m->named_modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(mod)) bn->frozen_batch_stats = true;
  optim::SGD opt(m->parameters(), 0.1, {0.9, 0, 5e-4, true});
  for (uint64_t s = 0; s < 3; ++s) step(*m, opt, 0, s);
  const int64_t k = 4;
  ASSERT_TRUE(freeze::apply_frozen_prefix(*m, k));
  auto units = m->layer_modules();
  auto params = [&](int64_t i) {
    std::vector<std::vector<float>> v;
    for (auto& p : units[size_t(i)].second->parameters()) v.push_back(p.to_vector<float>());
    return v;
  };
  std::vector<std::vector<std::vector<float>>> before;
  std::vector<std::map<std::string, std::vector<float>>> state_before;
  for (int64_t i = 0; i < int64_t(units.size()); ++i) {
    before.push_back(params(i));
    state_before.push_back(values(*units[size_t(i)].second));
  }
  for (uint64_t s = 3; s < 13; ++s) step(*m, opt, k, s);
  for (int64_t i = 0; i < k; ++i) {
    EXPECT_EQ(params(i), before[size_t(i)]) << units[size_t(i)].first << "'s parameters changed while frozen";
    EXPECT_NE(values(*units[size_t(i)].second), state_before[size_t(i)])
        << units[size_t(i)].first << ": batch statistics, so the running statistics move";
  }
  EXPECT_NE(params(k), before[size_t(k)]) << "the unit after the prefix did not train";
}

// A frozen set that is not a prefix (Note [Frozen sets]): layer modules 2 and 3 frozen
// behind the trainable 0 and 1. Their parameters and statistics stay bitwise as they
// were and own no gradient, while the backward still reaches the modules before them.
TEST(FreezeMechanics, AFrozenUnitBehindTrainableOnesIsBitwiseUnchangedAndTheFrontStillTrains) {
  auto m = small_resnet(1);
  optim::SGD opt(m->parameters(), 0.1, {0.9, 0, 5e-4, true});
  for (uint64_t s = 0; s < 3; ++s) step(*m, opt, 0, s);  // momentum buffers exist
  const std::vector<int64_t> frozen = {2, 3};
  ASSERT_TRUE(freeze::apply_frozen_layers(*m, frozen));
  EXPECT_FALSE(freeze::apply_frozen_layers(*m, frozen)) << "the same set again changes nothing";
  auto units = m->layer_modules();
  std::vector<std::map<std::string, std::vector<float>>> before;
  for (auto& u : units) before.push_back(values(*u.second));
  for (uint64_t s = 3; s < 13; ++s) step(*m, opt, 0, s);
  for (size_t i = 0; i < units.size(); ++i) {
    if (i == 2 || i == 3) {
      EXPECT_EQ(values(*units[i].second), before[i]) << units[i].first << " changed while frozen";
      for (auto& p : units[i].second->parameters()) EXPECT_FALSE(p.grad().defined()) << units[i].first;
    } else {
      EXPECT_NE(values(*units[i].second), before[i]) << units[i].first << " did not train";
    }
  }
  // Unfrozen again, they train.
  ASSERT_TRUE(freeze::apply_frozen_layers(*m, {}));
  const auto held = values(*units[2].second);
  step(*m, opt, 0, 13);
  EXPECT_NE(values(*units[2].second), held);
}

TEST(FreezeMechanics, UnfreezingKeepsTheFrozenParametersOptimizerState) {
  // Optimizer state of frozen parameters is kept: after unfreezing, the front modules
  // continue from the same momentum (SGD) and step count and moments (AdamW).
  for (const char* which : {"sgd", "adamw"}) {
    auto m = small_resnet(2);
    std::unique_ptr<optim::Optimizer> opt;
    if (std::string(which) == "sgd")
      opt = std::make_unique<optim::SGD>(m->parameters(), 0.05, optim::SgdOptions{0.9, 0, 5e-4, false});
    else opt = std::make_unique<optim::AdamW>(m->parameters(), 1e-3, optim::AdamWOptions{});
    for (uint64_t s = 0; s < 3; ++s) step(*m, *opt, 0, s);
    auto state_before = opt->state_dict();
    std::map<std::string, std::vector<float>> kept;
    for (auto& [n, t] : state_before)
      if (t.dtype() == DType::f32) kept[n] = t.clone().to_vector<float>();
    freeze::apply_frozen_prefix(*m, 3);
    for (uint64_t s = 3; s < 8; ++s) step(*m, *opt, 3, s);
    freeze::apply_frozen_prefix(*m, 0);
    // The state of the first parameter (the stem conv, frozen) is bitwise what it was.
    auto state_after = opt->state_dict();
    int compared = 0;
    for (auto& [n, v] : kept)
      if (n.rfind("0.", 0) == 0) {  // "0.<slot>": parameter 0
        EXPECT_EQ(state_after.at(n).to_vector<float>(), v) << which << " " << n;
        ++compared;
      }
    EXPECT_GT(compared, 0) << which << ": no optimizer state for parameter 0 found";
    // And it trains again.
    auto w0 = m->layer_modules()[0].second->parameters()[0].to_vector<float>();
    step(*m, *opt, 0, 99);
    EXPECT_NE(m->layer_modules()[0].second->parameters()[0].to_vector<float>(), w0) << which;
  }
}

// Unfreezing resumes exactly: a parameter frozen for some steps (while the others
// train) and then unfrozen follows, bit for bit, the trajectory of a twin optimizer
// that only ever held it and skipped those steps: the same gradients give the same
// updates, with weight decay and momentum (SGD, Nesterov) and with AdamW's moments and
// its bias correction (the parameter's own step count, not the optimizer's).
TEST(FreezeMechanics, UnfreezingResumesAsIfTheParameterHadNeverLeft) {
  for (const char* which : {"sgd", "adamw"}) {
    Generator g(4);
    Tensor p = Tensor::randn({300}, g).set_requires_grad(true), other = Tensor::randn({40}, g).set_requires_grad(true);
    Tensor twin = p.clone().set_requires_grad(true);
    auto make = [&](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
      if (std::string(which) == "sgd")
        return std::make_unique<optim::SGD>(ps, 0.05, optim::SgdOptions{0.9, 0, 5e-4, true});
      return std::make_unique<optim::AdamW>(ps, 1e-2, optim::AdamWOptions{0.9, 0.999, 1e-8, 0.05});
    };
    auto a = make({p, other}), b = make({twin});
    auto grad = [](uint64_t seed, int64_t n) {
      Generator gg(seed);
      return Tensor::randn({n}, gg);
    };
    auto both = [&](uint64_t s) {  // one step of each, the same gradient for p and its twin
      p.set_grad(grad(s, 300));
      twin.set_grad(grad(s, 300));
      other.set_grad(grad(1000 + s, 40));
      a->step();
      b->step();
    };
    for (uint64_t s = 0; s < 3; ++s) both(s);
    p.set_requires_grad(false);  // frozen: `other` trains on, the twin waits
    const std::vector<float> frozen_at = p.to_vector<float>(), other_at = other.to_vector<float>();
    for (uint64_t s = 0; s < 5; ++s) {
      other.set_grad(grad(2000 + s, 40));
      a->step();
    }
    EXPECT_EQ(p.to_vector<float>(), frozen_at) << which << ": changed while frozen";
    EXPECT_NE(other.to_vector<float>(), other_at) << which << ": the rest did not train";
    p.set_requires_grad(true);
    for (uint64_t s = 3; s < 7; ++s) {
      both(s);
      ASSERT_EQ(p.to_vector<float>(), twin.to_vector<float>()) << which << ": step " << s << " after unfreezing";
    }
  }
}

TEST(FreezeMechanics, AModelFrozenToItsHeadRecordsNoNodeForThePrefix) {
  auto m = small_resnet(3);
  Batch b = batch(5);
  const int64_t heads = int64_t(m->layer_modules().size()) - 1;
  Tensor full = fn::cross_entropy(m->forward_frozen(b.x, Tensor(), 0), b.y);
  const size_t n_full = autograd::graph_size(full);
  freeze::apply_frozen_prefix(*m, heads);
  Tensor frozen = fn::cross_entropy(m->forward_frozen(b.x, Tensor(), heads), b.y);
  const size_t n_frozen = autograd::graph_size(frozen);
  // Only the head (global pool, linear, cross-entropy) and its two leaf sinks remain.
  EXPECT_LE(n_frozen, 6u);
  EXPECT_GT(n_full, 50u);
  frozen.backward();
  for (auto& p : m->layer_modules()[0].second->parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_TRUE(m->layer_modules().back().second->parameters()[0].grad().defined());
}

TEST(FreezeMechanics, CapturedActivationIsTheModuleOutput) {
  auto m = small_resnet(4);
  m->eval();
  Batch b = batch(6);
  models::Capture c;
  c.layer = 2;
  m->forward_frozen(b.x, Tensor(), 0, &c);
  const Tensor cap = c.output;
  autograd::NoGradGuard ng;
  auto u = m->layer_modules();
  Tensor h = b.x;
  for (int i = 0; i <= 2; ++i) h = u[size_t(i)].second->forward(h);
  EXPECT_EQ(cap.to_vector<float>(), h.to_vector<float>());
}

// --freeze-reference-scope unit: given a unit's input, the controller's reference runs
// that unit alone on it: the reading is the SP loss against the reference's unit output
// for that input, not for its own front's output.
TEST(FreezeMechanics, AControllerGivenTheUnitInputRunsOnlyTheUnit) {
  auto m = small_resnet(4), moved = small_resnet(9);
  m->eval();
  moved->eval();
  Batch b = batch(6);
  const models::ModelConfig mc = small_config();
  auto snap = std::make_shared<freeze::Snapshot>(m->state_dict());
  freeze::ControllerOptions o;
  o.precision = "fp32";
  o.synchronous = true;
  freeze::PlasticityController ctl(mc, o);
  ctl.set_snapshot(snap);
  auto ref = quant::make_reference("fp32", mc, *snap);
  const int64_t begin = 2, last = 4;
  Tensor h = moved->layer_output(b.x, Tensor(), begin - 1), out = moved->layer_output(b.x, Tensor(), last);
  ASSERT_TRUE(ctl.submit(1, last, b.x, out, Tensor(), h, begin));
  ASSERT_TRUE(ctl.submit(2, last, b.x, out));
  auto r = ctl.poll();
  ASSERT_EQ(r.size(), 2u);
  const double unit = freeze::sp_loss(out, ref->activation_from(h, begin, last));
  const double network = freeze::sp_loss(out, ref->activation(b.x, last));
  EXPECT_NEAR(r[0].plasticity, unit, 1e-6 * unit);
  EXPECT_NEAR(r[1].plasticity, network, 1e-6 * network);
  EXPECT_GT(std::abs(unit - network), 1e-3 * network) << "the two readings should differ: the fronts differ";
  EXPECT_THROW(ctl.submit(3, last, b.x, out, Tensor(), h, last + 1), Error);
  EXPECT_THROW(ctl.submit(3, last, b.x, out, Tensor(), b.x, 0), Error);
}

// The background controller: an evaluation that finds the pipeline full is refused
// at once, dropped and counted; every accepted one completes, in order. The reference
// thread is held up here by a model factory that takes half a second (the build of the
// first reference), so the pipeline is full after two submissions.
TEST(FreezeMechanics, TheBackgroundControllerDropsWhatFindsThePipelineFullAndCountsIt) {
  auto m = small_resnet(4);
  m->eval();
  Batch b = batch(6);
  const models::ModelConfig mc = small_config();
  freeze::ControllerOptions o;
  o.precision = "int8";
  o.capacity = 1;
  auto slow_factory = [mc] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    Generator g(0);
    return models::build_model(mc, g);
  };
  freeze::PlasticityController ctl(slow_factory, o);
  ctl.set_snapshot(std::make_shared<freeze::Snapshot>(m->state_dict()));
  const Tensor out = output_of(*m, b.x, 2);
  const int n = 20;
  int accepted = 0;
  std::vector<int64_t> accepted_steps;
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < n; ++s)
    if (ctl.submit(s, 2, b.x, out)) {
      ++accepted;
      accepted_steps.push_back(s);
    }
  const double submit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(submit_seconds, 0.4) << "submit() waited for the reference thread";
  EXPECT_GE(accepted, 1);
  EXPECT_LT(accepted, n) << "nothing was dropped although the reference was still being built";
  EXPECT_EQ(ctl.dropped(), n - accepted);
  ctl.drain();
  EXPECT_EQ(ctl.completed(), accepted);
  auto r = ctl.poll();
  ASSERT_EQ(int(r.size()), accepted);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].step, accepted_steps[i]) << "results in submission order";
    EXPECT_EQ(r[i].module, 2);
    EXPECT_TRUE(std::isfinite(r[i].plasticity) && r[i].plasticity > 0 && r[i].plasticity <= 4) << r[i].plasticity;
  }
  EXPECT_EQ(ctl.first_error(), "");
  EXPECT_GT(ctl.wait_seconds(), 0.0) << "drain() waited for the slow build, and said so";
}

// A diverged snapshot (a NaN weight) gives a NaN reading: the evaluation is dropped and
// its cause kept, never a reading for Algorithm 1 (nor an exception in training).
TEST(FreezeMechanics, ANonFiniteReadingIsADroppedEvaluationWithItsCause) {
  auto m = small_resnet(4);
  m->eval();
  Batch b = batch(6);
  auto snap = std::make_shared<freeze::Snapshot>(m->state_dict());
  for (auto& [k, t] : *snap)  // every convolution's first weight
    if (k.find("conv") != std::string::npos && t.dtype() == DType::f32) {
      t = t.clone();
      t.data<float>()[0] = std::nanf("");
    }
  freeze::ControllerOptions o;
  o.precision = "fp32";
  freeze::PlasticityController ctl(small_config(), o);
  ctl.set_snapshot(snap);
  ASSERT_TRUE(ctl.submit(1, 2, b.x, output_of(*m, b.x, 2)));
  ctl.drain();
  EXPECT_EQ(ctl.completed(), 0);
  EXPECT_EQ(ctl.dropped(), 1);
  EXPECT_TRUE(ctl.poll().empty());
  EXPECT_NE(ctl.first_error().find("NaN or Inf"), std::string::npos) << ctl.first_error();
}

// The reference runs only at low CPU load (the paper's "<50%"): while the probe reads
// the machine busier than max_cpu_load the evaluation waits (training does not: submit
// returns at once); when the load falls it runs; and drain(), where training waits for
// the result anyway, opens the gate.
TEST(FreezeMechanics, TheReferenceWaitsForSpareCpuUnlessTrainingWaitsForIt) {
  auto m = small_resnet(4);
  m->eval();
  Batch b = batch(6);
  const models::ModelConfig mc = small_config();
  auto load = std::make_shared<std::atomic<double>>(0.9);
  auto probed = std::make_shared<std::atomic<int>>(0);
  freeze::ControllerOptions o;
  o.precision = "fp32";
  o.max_cpu_load = 0.5;
  o.cpu_load = [load, probed] {
    ++*probed;
    return load->load();
  };
  freeze::PlasticityController ctl(mc, o);
  ctl.set_snapshot(std::make_shared<freeze::Snapshot>(m->state_dict()));
  const Tensor out = output_of(*m, b.x, 2);
  auto wait_until = [](auto done) {
    for (int i = 0; i < 400 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return done();
  };
  ASSERT_TRUE(ctl.submit(1, 2, b.x, out));
  ASSERT_TRUE(wait_until([&] { return probed->load() > 0; })) << "the reference thread never asked for the load";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(ctl.completed(), 0) << "the reference ran at 90% load";
  EXPECT_GT(probed->load(), 1) << "the gate did not look again";
  load->store(0.2);
  EXPECT_TRUE(wait_until([&] { return ctl.completed() == 1; })) << "the load fell, the reference did not run";
  EXPECT_EQ(ctl.deferred(), 1);
  EXPECT_GT(ctl.deferred_seconds(), 0.25);
  load->store(0.95);
  ASSERT_TRUE(ctl.submit(2, 2, b.x, out));
  ctl.drain();  // returns: the gate is open while training waits
  EXPECT_EQ(ctl.completed(), 2);
  EXPECT_EQ(ctl.poll().size(), 2u);
  // The /proc/stat probe reads a share of the machine.
  freeze::CpuLoadProbe probe(std::chrono::milliseconds(20));
  const double l = probe();
  EXPECT_GE(l, 0.0);
  EXPECT_LE(l, 1.0);
  o.max_cpu_load = 0;
  EXPECT_THROW(freeze::PlasticityController(mc, o), Error);
}

// ---- through the trainer

std::string tmpdir(const std::string& name) { return eg::testing::fresh_dir("eg_freeze_" + name); }
std::vector<nlohmann::json> jsonl(const std::string& p) {
  std::vector<nlohmann::json> v;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) v.push_back(nlohmann::json::parse(line));
  return v;
}
// The trainer tests' run (tests/test_util.h) with `policy`; Egeria's settings decide
// within it, and also set the interval n of autofreeze and the units of every policy.
train::TrainConfig run_cfg(const std::string& out, const std::string& policy) {
  train::TrainConfig c = eg::testing::small_image_run(out);
  eg::testing::use_fast_egeria(c);
  c.freezing.policy = policy;
  return c;
}

// The decisions in DIR/freeze.jsonl as "type@step", in order (bootstraps left out, and
// evaluations unless asked for).
std::vector<std::string> decisions(const std::string& dir, bool with_evaluations) {
  std::vector<std::string> d;
  for (auto& j : jsonl(dir + "/freeze.jsonl"))
    if (j["type"] != "bootstrap" && (with_evaluations || j["type"] != "evaluation"))
      d.push_back(j["type"].get<std::string>() + "@" + std::to_string(j["step"].get<int64_t>()));
  return d;
}

// The plasticity readings of a run's freeze.jsonl, as "step:module:plasticity".
std::vector<std::string> readings(const std::string& dir) {
  std::vector<std::string> r;
  for (auto& j : jsonl(dir + "/freeze.jsonl"))
    if (j["type"] == "evaluation")
      r.push_back(std::to_string(j["step"].get<int64_t>()) + ":" + std::to_string(j["module"].get<int64_t>()) + ":" +
                  j["plasticity"].dump());
  return r;
}

using eg::testing::run_killed_twice;

void expect_same_weights(const std::string& a, const std::string& b) {
  auto wa = train::load_safetensors(a + "/model.safetensors"), wb = train::load_safetensors(b + "/model.safetensors");
  for (auto& [k, t] : wa) EXPECT_EQ(t.to_vector<float>(), wb.at(k).to_vector<float>()) << k;
}

TEST(FreezeTrainer, EgeriaEvaluatesFreezesLogsAndResumesBitIdentically) {
  std::string a = tmpdir("egeria_full"), b = tmpdir("egeria_killed");
  auto s = train::run_training(run_cfg(a, "egeria"));
  ASSERT_TRUE(s.completed);
  auto log = jsonl(a + "/freeze.jsonl");
  int boot = 0, evals = 0, freezes = 0, unfreezes = 0, freezes_before_drop = 0;
  for (auto& j : log) {
    const std::string t = j["type"];
    boot += t == "bootstrap";
    evals += t == "evaluation";
    freezes += t == "freeze";
    unfreezes += t == "unfreeze";
    if (t == "freeze" && j["lr"].get<double>() > 0.04 && unfreezes == 0) ++freezes_before_drop;
    if (t == "evaluation") {
      // SP loss of row-normalised Grams: in [0, 4]; an int8 reference never reads as the model.
      EXPECT_GT(j["plasticity"].get<double>(), 0.0);
      EXPECT_LE(j["plasticity"].get<double>(), 4.0);
      for (const char* k : {"step", "module", "smoothed", "slope", "tolerance", "counter", "window", "lr"})
        EXPECT_TRUE(j.contains(k)) << k;
    }
  }
  EXPECT_GE(boot, 2);
  EXPECT_GT(evals, 5);
  EXPECT_GT(freezes, 0) << "nothing froze in a 64-step run with n=2, W=2";
  // The stem freezes in the first epochs (run_cfg), before the 10x LR drop at epoch 3,
  // which unfreezes everything, once.
  EXPECT_GT(freezes_before_drop, 0) << "nothing froze before the LR drop";
  EXPECT_EQ(unfreezes, 1) << "the LR drops 10x at epoch 3";
  auto sum = nlohmann::json::parse(std::ifstream(a + "/summary.json"));
  for (const char* k :
       {"frozen_fraction_final", "backward_flops_saved_fraction", "reference_overhead_fraction", "evaluations_dropped"})
    EXPECT_TRUE(sum.contains(k)) << k;
  EXPECT_GT(sum["backward_flops_saved_fraction"].get<double>(), 0.0);
  EXPECT_EQ(sum["freeze_stats"]["bootstrap_interval"], 2);  // -1: every n
  // The line the CLI prints at the end: what is frozen, in the summary's figures.
  EXPECT_EQ(s.freeze_report, train::freeze_report(sum));
  EXPECT_NE(s.freeze_report.find("freezing (egeria): "), std::string::npos) << s.freeze_report;
  EXPECT_NE(s.freeze_report.find("n = 2"), std::string::npos) << s.freeze_report;
  // egeria report tells the run's story from its files: as many freezes as the log holds,
  // each with its slopes against T, and the unfreeze at the LR drop.
  const std::string story = train::run_report(a);
  size_t told = 0;
  for (size_t at = story.find("): froze "); at != std::string::npos; at = story.find("): froze ", at + 1)) ++told;
  EXPECT_EQ(told, size_t(freezes)) << story;
  for (const char* k : {"bootstrapping over", "under its tolerance T = ", "unfroze everything: the LR fell to 0.005",
                        "of the backward FLOPs", "Accuracy: final test accuracy"})
    EXPECT_NE(story.find(k), std::string::npos) << k << "\n" << story;

  // Killed twice (once during bootstrapping, once while modules are frozen), resumed.
  ASSERT_TRUE(run_killed_twice(run_cfg(b, "egeria"), 5, 30));
  expect_same_weights(a, b);
  EXPECT_EQ(decisions(b, false), decisions(a, false)) << "the same decisions, in the same order";
  // And the same readings, to the last bit: the int8 reference's calibration (Note
  // [Static activation scales]) travels in the checkpoint with its snapshot, also
  // through a checkpoint written right after a resume, before any evaluation.
  EXPECT_EQ(readings(b), readings(a));
  // (Killed at step 34, between two readings of a calibrating reference, and again one
  // step after the resume, before its next reading.)
  const std::string c = tmpdir("egeria_killed_close");
  ASSERT_TRUE(run_killed_twice(run_cfg(c, "egeria"), 34, 1));
  expect_same_weights(a, c);
  EXPECT_EQ(readings(c), readings(a));
}

// The cyclic-schedule hook of the C++ API (FreezeOptions::unfreeze_hook): asked at
// every step while a unit is frozen, and when it says so every unit unfreezes there, as
// on an LR fall, with the reason "custom" in freeze.jsonl.
TEST(FreezeTrainer, TheUnfreezeHookUnfreezesWhereItSays) {
  std::string a = tmpdir("egeria_nohook"), b = tmpdir("egeria_hook");
  auto c = run_cfg(a, "egeria");
  c.freezing.tracker.unfreeze_on_lr_fall = false;  // only the hook unfreezes
  ASSERT_TRUE(train::run_training(c).completed);
  bool froze = false;
  for (auto& j : jsonl(a + "/freeze.jsonl")) froze |= j["type"] == "freeze";
  ASSERT_TRUE(froze) << "nothing froze";
  // The tracker asks while a unit is frozen; the hook says yes the third time.
  int64_t asked = 0, said_yes_at = -1;
  c.out = b;
  c.freezing.unfreeze_hook = [&](int64_t step, double lr) {
    EXPECT_GT(lr, 0.0);
    if (++asked != 3) return false;
    said_yes_at = step;
    return true;
  };
  ASSERT_TRUE(train::run_training(c).completed);
  ASSERT_GE(said_yes_at, 0) << "the hook was asked " << asked << " times";
  std::vector<int64_t> custom;
  for (auto& j : jsonl(b + "/freeze.jsonl"))
    if (j["type"] == "unfreeze") {
      EXPECT_EQ(j["reason"], "custom");
      custom.push_back(j["step"]);
    }
  EXPECT_EQ(custom, std::vector<int64_t>{said_yes_at});
  // Up to the hook's step both runs decided alike; after it they part.
  auto before = [&](const std::string& dir) {
    std::vector<std::string> d;
    for (const std::string& e : decisions(dir, true))
      if (std::stoll(e.substr(e.find('@') + 1)) < said_yes_at) d.push_back(e);
    return d;
  };
  EXPECT_EQ(before(b), before(a));
  EXPECT_NE(decisions(b, false), decisions(a, false));
}

// --freeze-last-phase off: the schedule's last phase (here epoch 3 on, LR 0.005, the
// final LR) freezes nothing and ends with every module active; before it, freezing
// works as usual.
TEST(FreezeTrainer, LastPhaseOffTrainsTheLastPhaseWhole) {
  std::string d = tmpdir("egeria_lastoff");
  auto c = run_cfg(d, "egeria");
  c.freezing.tracker.freeze_last_phase = false;
  ASSERT_TRUE(train::run_training(c).completed);
  const int64_t last_phase_start = 3 * (256 / 16);
  int freezes_before = 0, marks = 0;
  for (auto& j : jsonl(d + "/freeze.jsonl")) {
    const std::string t = j["type"];
    const int64_t step = j["step"];
    if (t == "freeze") {
      EXPECT_LT(step, last_phase_start) << "a freeze in the last phase";
      ++freezes_before;
    }
    if (t == "evaluation") {
      EXPECT_LE(step, last_phase_start + 2) << "an evaluation in the last phase";
    }
    if (t == "last_phase" || (t == "unfreeze" && j["reason"] == "last_phase")) {
      EXPECT_GE(step, last_phase_start);
      ++marks;
    }
  }
  EXPECT_GT(freezes_before, 0);
  EXPECT_EQ(marks, 1);
  auto sum = nlohmann::json::parse(std::ifstream(d + "/summary.json"));
  EXPECT_EQ(sum["frozen_fraction_final"].get<double>(), 0.0);
  auto cfg = nlohmann::json::parse(std::ifstream(d + "/config.json"));
  EXPECT_EQ(cfg["freeze_last_phase"], "off");
  EXPECT_EQ(cfg["freeze_bn"], "batch") << "the default";
  EXPECT_THROW(train::set_option(c, "--freeze-last-phase", "maybe"), Error);
}

// --freeze-first-phase off: the freezes Algorithm 1 decides before the LR's 10x decay
// (epoch 3, step 48) are held, and all apply at the decay.
TEST(FreezeTrainer, FirstPhaseOffAppliesTheHeldFreezesAtTheDecay) {
  std::string d = tmpdir("egeria_firstoff");
  auto c = run_cfg(d, "egeria");
  c.freezing.tracker.freeze_first_phase = false;
  ASSERT_TRUE(train::run_training(c).completed);
  const int64_t decay = 3 * (256 / 16);
  int holds = 0, applied = 0;
  for (auto& j : jsonl(d + "/freeze.jsonl")) {
    const std::string t = j["type"];
    const int64_t step = j["step"];
    if (t == "hold") {
      EXPECT_LT(step, decay);
      ++holds;
    }
    if (t == "freeze" && j.value("reason", "") == "held") {
      EXPECT_GE(step, decay);
      EXPECT_LE(step, decay + 1);
      ++applied;
    } else if (t == "freeze") {
      EXPECT_GT(step, decay) << "a freeze before the decay";
    }
  }
  EXPECT_GT(holds, 0);
  EXPECT_EQ(applied, 1);
  int frozen_records = 0;
  for (auto& j : jsonl(d + "/metrics.jsonl"))
    if (j["type"] == "freeze") {
      EXPECT_GE(j["step"].get<int64_t>(), decay) << j.dump();
      ++frozen_records;
    }
  EXPECT_GT(frozen_records, 0);
  auto sum = nlohmann::json::parse(std::ifstream(d + "/summary.json"));
  EXPECT_GT(sum["frozen_fraction_final"].get<double>(), 0.0) << "no second decay unfreezes them";
  // The default unit scope while freezes are held: the unit's input comes from the
  // held units, which still train.
  EXPECT_GT(sum["freeze_stats"]["unit_scope_submissions"].get<int64_t>(), 0) << sum["freeze_stats"].dump();
  EXPECT_EQ(sum["freeze_stats"]["reference_scope"], "unit");
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(d + "/config.json"))["freeze_first_phase"], "off");
  EXPECT_THROW(train::set_option(c, "--freeze-first-phase", "later"), Error);
  EXPECT_THROW(train::set_option(c, "--freeze-unfreeze", "sometimes"), Error);
}

// --freeze-reference-scope unit (the default): while the first unit is the front (its
// input is the images) the readings are those of the network scope, value for value;
// once it froze, the reference runs the next unit alone, on the training model's input
// to it.
TEST(FreezeTrainer, UnitScopeReadsTheFirstUnitAsTheNetworkScopeAndThenOnlyTheFront) {
  std::string a = tmpdir("egeria_scope_network"), u = tmpdir("egeria_scope_unit");
  auto c = run_cfg(a, "egeria");
  c.freezing.reference_scope = train::ReferenceScope::network;
  ASSERT_TRUE(train::run_training(c).completed);
  c = run_cfg(u, "egeria");
  EXPECT_EQ(c.freezing.reference_scope, train::ReferenceScope::unit) << "the default";
  ASSERT_TRUE(train::run_training(c).completed);
  auto na = jsonl(a + "/freeze.jsonl"), nu = jsonl(u + "/freeze.jsonl");
  size_t i = 0;
  for (; i < na.size() && i < nu.size(); ++i) {
    ASSERT_EQ(na[i]["type"], nu[i]["type"]) << i;
    ASSERT_EQ(na[i]["step"], nu[i]["step"]) << i;
    if (na[i]["type"] == "evaluation") {
      EXPECT_EQ(na[i]["plasticity"], nu[i]["plasticity"]) << i;
    }
    if (na[i]["type"] == "freeze") break;
  }
  ASSERT_LT(i, nu.size()) << "nothing froze";
  int later = 0;
  for (++i; i < nu.size(); ++i) later += nu[i]["type"] == "evaluation" && nu[i]["module"].get<int64_t>() > 0;
  EXPECT_GT(later, 0) << "no evaluation of a later unit";
  auto sa = nlohmann::json::parse(std::ifstream(a + "/summary.json"));
  auto su = nlohmann::json::parse(std::ifstream(u + "/summary.json"));
  EXPECT_EQ(sa["freeze_stats"]["unit_scope_submissions"], 0);
  EXPECT_EQ(sa["freeze_stats"]["reference_scope"], "network");
  EXPECT_GE(su["freeze_stats"]["unit_scope_submissions"].get<int64_t>(), later);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(u + "/config.json"))["freeze_reference_scope"], "unit");
  EXPECT_THROW(train::set_option(c, "--freeze-reference-scope", "front"), Error);
}

// Note [Reading ahead of the front]: with --freeze-lookahead 1 every evaluation reads the
// front and the unit after it, each on its own input in the training forward. The
// front's readings and decisions are the ones of the run without it until the front
// first freezes; the unit after it was read from the first evaluation on, and once it
// is the front its readings are the ones the run without lookahead takes of it (the
// same weights, snapshot and input) until the two runs' decisions part. Killed and
// resumed, the run is the uninterrupted one.
TEST(FreezeTrainer, ReadingAheadReadsTheNextUnitOnItsOwnInputAndResumesBitIdentically) {
  const std::string f = tmpdir("egeria_front_only"), a = tmpdir("egeria_ahead"), k = tmpdir("egeria_ahead_killed");
  auto cfg = [](const std::string& out, int64_t lookahead) {
    train::TrainConfig c = run_cfg(out, "egeria");
    c.freezing.tracker.lookahead = lookahead;
    c.freezing.tracker.window = 3;  // so that the unit after the front is not stale at once
    return c;
  };
  ASSERT_TRUE(train::run_training(cfg(f, 0)).completed);
  ASSERT_TRUE(train::run_training(cfg(a, 1)).completed);
  const auto lf = jsonl(f + "/freeze.jsonl"), la = jsonl(a + "/freeze.jsonl");
  // Readings by (step, module), and the first freeze.
  auto by_step = [](const std::vector<nlohmann::json>& log, int64_t& first_freeze) {
    std::map<std::pair<int64_t, int64_t>, double> r;
    first_freeze = -1;
    for (auto& j : log) {
      if (j["type"] == "evaluation") r[{j["step"].get<int64_t>(), j["module"].get<int64_t>()}] = j["plasticity"];
      if (j["type"] == "freeze" && first_freeze < 0) first_freeze = j["step"];
    }
    return r;
  };
  int64_t ff = -1, fa = -1;
  const auto rf = by_step(lf, ff), ra = by_step(la, fa);
  ASSERT_GT(ff, 0) << "nothing froze";
  EXPECT_EQ(fa, ff) << "the front's first freeze moved";
  int ahead = 0, front = 0;
  for (auto& [key, p] : rf)
    if (key.second == 0 && key.first <= ff) {
      ++front;
      ASSERT_TRUE(ra.count(key)) << "step " << key.first;
      EXPECT_EQ(ra.at(key), p) << "step " << key.first;  // bit for bit
      // Read ahead at the same evaluation, under the unit scope.
      ahead += ra.count({key.first, 1});
    }
  EXPECT_GT(front, 2);
  EXPECT_EQ(ahead, front) << "the unit after the front was not read at every evaluation";
  // Each unit read ahead starts from the training model's output of the unit before it:
  // with weights that do not move (an LR far below their rounding) and an fp32 reference
  // whose batch norms use the batch's statistics as training does, the reference
  // computes each read unit's training output again, and every reading is ~0 (against
  // ~1e-3 above: a reading run on another input would not be).
  const std::string z = tmpdir("egeria_ahead_still");
  train::TrainConfig still = cfg(z, 2);
  still.lr = 1e-30;
  still.epochs = 1;  // readings from step 6 on: enough of them
  still.milestones = {};
  still.weight_decay = 0;
  still.freezing.reference.precision = "fp32";
  still.freezing.reference.bn = quant::ReferenceBn::batch;
  ASSERT_TRUE(train::run_training(still).completed);
  int64_t fz = -1;
  const auto rz = by_step(jsonl(z + "/freeze.jsonl"), fz);
  std::set<int64_t> read;
  for (auto& [key, p] : rz) {
    EXPECT_LT(p, 1e-5) << "step " << key.first << " unit " << key.second;
    read.insert(key.second);
  }
  EXPECT_EQ(read, (std::set<int64_t>{0, 1, 2})) << "the front and the two units after it";
  // The front (the stem) is read from the images; the two units after it on their inputs.
  const auto sz = nlohmann::json::parse(std::ifstream(z + "/summary.json"));
  const auto completed = sz["freeze_stats"]["evaluations_completed"].get<size_t>();  // the last still unread
  EXPECT_EQ(completed % 3, 0u);
  EXPECT_GE(completed, rz.size());
  EXPECT_EQ(sz["freeze_stats"]["unit_scope_submissions"].get<size_t>(), completed / 3 * 2);
  auto su = nlohmann::json::parse(std::ifstream(a + "/summary.json"));
  EXPECT_EQ(su["freeze_stats"]["evaluations_dropped"], 0);
  EXPECT_GE(su["freeze_stats"]["unit_scope_submissions"].get<int64_t>(), ahead);
  // egeria report tells the readings of each unit, the units read ahead included.
  EXPECT_NE(train::run_report(a).find("froze "), std::string::npos);

  ASSERT_TRUE(run_killed_twice(cfg(k, 1), 7, 20));
  expect_same_weights(a, k);
  EXPECT_EQ(readings(k), readings(a));
  EXPECT_EQ(decisions(k, false), decisions(a, false));
  // Read ahead or not is the run's: --resume with another lookahead is refused.
  train::TrainConfig other = cfg(k, 2);
  other.resume = true;
  EXPECT_THROW(train::run_training(other), Error);
}

// --freeze-reading per-lr2 (Note [Readings per squared learning rate]): each reading
// carries the sum of the squared LRs of the updates between the reference's snapshot and
// the capture, computed here again from the run's schedule (the snapshot of a refresh
// at step r holds r's update; the capture of step s precedes s's update), and Algorithm 1
// reads the SP loss divided by it. A run killed and resumed reads the same to the bit.
TEST(FreezeTrainer, ReadingsPerSquaredLrCarryTheLrsSinceTheReferenceAndResumeBitIdentically) {
  const std::string a = tmpdir("egeria_per_lr2"), k = tmpdir("egeria_per_lr2_killed");
  auto cfg = [](const std::string& out) {
    train::TrainConfig c = run_cfg(out, "egeria");
    c.lr_schedule = train::Schedule::linear;  // an LR that changes at every step
    c.warmup_steps = 5;
    c.milestones = {};
    c.freezing.tracker.readings_per_lr_sq = true;
    return c;
  };
  ASSERT_TRUE(train::run_training(cfg(a)).completed);
  const train::TrainConfig c = cfg(a);
  const auto sched = train::make_schedule(c, 256 / 16);
  auto lr_sq = [&](int64_t step) { return sched->lr_at(step - 1) * sched->lr_at(step - 1); };  // the update of `step`
  int64_t refreshed = -1;
  int evaluations = 0;
  for (auto& j : jsonl(a + "/freeze.jsonl")) {
    if (j["type"] == "refresh") refreshed = j["step"];
    if (j["type"] != "evaluation") continue;
    ++evaluations;
    const int64_t s = j["step"];
    ASSERT_GE(refreshed, 0);
    ASSERT_LE(refreshed, s);
    double expect = 0;
    for (int64_t t = refreshed + 1; t < s; ++t) expect += lr_sq(t);  // updates r+1 .. s-1 between them
    if (s == refreshed) expect = lr_sq(s);  // the snapshot holds s's update, the capture not
    expect = std::max(expect, lr_sq(s));
    ASSERT_TRUE(j.contains("lr_sq")) << j.dump();
    EXPECT_NEAR(j["lr_sq"].get<double>(), expect, 1e-9 * expect) << j.dump();
    EXPECT_DOUBLE_EQ(j["reading"].get<double>(), j["plasticity"].get<double>() / j["lr_sq"].get<double>());
  }
  EXPECT_GT(evaluations, 10);
  const auto conf = nlohmann::json::parse(std::ifstream(a + "/config.json"));
  EXPECT_EQ(conf["freeze_reading"], "per-lr2");
  const std::string story = train::run_report(a);  // egeria report says what its slopes are of
  EXPECT_NE(story.find("--freeze-reading per-lr2"), std::string::npos) << story;

  ASSERT_TRUE(run_killed_twice(cfg(k), 7, 20));
  expect_same_weights(a, k);
  auto with_lr_sq = [](const std::string& dir) {
    std::vector<std::string> r;
    for (auto& j : jsonl(dir + "/freeze.jsonl"))
      if (j["type"] == "evaluation")
        r.push_back(j["step"].dump() + ":" + j["plasticity"].dump() + ":" + j["lr_sq"].dump());
    return r;
  };
  EXPECT_EQ(with_lr_sq(k), with_lr_sq(a));
  EXPECT_EQ(decisions(k, false), decisions(a, false));
  train::TrainConfig other = cfg(k);  // the readings are the run's: resuming with the SP loss is refused
  other.freezing.tracker.readings_per_lr_sq = false;
  other.resume = true;
  EXPECT_THROW(train::run_training(other), Error);
}

TEST(FreezeTrainer, TheReferenceOverheadCountsBackgroundCpuTimeOnlyOnTheTrainingsCores) {
  // The R56 run on an H100: 0.39 s in the policy, 14.9 CPU-s of int8 reference, 4 threads,
  // 74 s of training. On the training's 4 cores the reference takes 3.7 s of their time
  // (5.6% with the policy's); on other cores only the policy's 0.39 s counts (0.5%).
  EXPECT_NEAR(train::reference_overhead_fraction(0.39, 14.9, 4, true, 74.0), 0.055608, 1e-6);
  EXPECT_NEAR(train::reference_overhead_fraction(0.39, 14.9, 4, false, 74.0), 0.005270, 1e-6);
  EXPECT_NEAR(train::reference_overhead_fraction(0.0, 2.0, 0, true, 10.0), 0.2, 1e-12);  // 0 threads: as 1
  EXPECT_EQ(train::reference_overhead_fraction(1.0, 2.0, 2, true, 0.0), 0.0);
  // A GPU reference in the background: its 1.8 s of side-stream time count, its thread's
  // CPU time (on a core of its own) does not.
  EXPECT_NEAR(train::reference_overhead_fraction(0.39, 14.9, 4, false, 74.0, 1.8), 0.029595, 1e-6);
}

TEST(FreezeTrainer, TheEndOfRunReportSaysWhatIsFrozenInTheSummarysFigures) {
  nlohmann::json sum = {
      {"freeze", "egeria"},
      {"freeze_units",
       nlohmann::json::array(
           {{{"name", "stem+layer1"}}, {{"name", "layer2"}}, {{"name", "layer3"}}, {{"name", "head"}}})},
      {"frozen_modules_final", 2},
      {"frozen_fraction_final", 0.4567},
      {"backward_flops_saved_fraction", 0.123},
      {"reference_overhead_fraction", 0.0112},
      {"evaluations_dropped", 0},
      {"freeze_stats",
       {{"reference", "int8"}, {"reference_scope", "unit"}, {"interval", 16}, {"evaluations_completed", 250}}}};
  EXPECT_EQ(
      train::freeze_report(sum),
      "freezing (egeria): frozen at the end: stem+layer1, layer2 (2 of 3 units, 45.7% of the parameters); "
      "backward FLOPs saved over the run 12.3%; 250 plasticity evaluations, n = 16, 0 dropped; reference (int8, unit) "
      "overhead 1.1%");
  sum["frozen_modules_final"] = 0;
  sum["freeze"] = "autofreeze";
  sum.erase("freeze_stats");
  EXPECT_EQ(train::freeze_report(sum),
            "freezing (autofreeze): frozen at the end: nothing (0 of 3 units); "
            "backward FLOPs saved over the run 12.3%");
  sum["freeze"] = "none";
  EXPECT_EQ(train::freeze_report(sum), "");
}

TEST(FreezeTrainer, EveryBaselinePolicyRunsAndFreezes) {
  for (const char* p : {"static", "freezeout", "autofreeze"}) {
    std::string d = tmpdir(p);
    auto c = run_cfg(d, p);
    c.freezing.static_epoch = 1;
    c.freezing.static_modules = 3;
    c.milestones = {};
    c.lr_schedule = train::Schedule::constant;
    c.log_every = 1;
    ASSERT_TRUE(train::run_training(c).completed) << p;
    auto sum = nlohmann::json::parse(std::ifstream(d + "/summary.json"));
    EXPECT_GT(sum["backward_flops_saved_fraction"].get<double>(), 0.0) << p;
    bool froze = false;
    for (auto& j : jsonl(d + "/freeze.jsonl")) froze |= j["type"] == "freeze";
    EXPECT_TRUE(froze) << p;
    if (std::string(p) != "static") continue;
    // static: the first 3 units, frozen once, after the first step of epoch 1 (16 steps an
    // epoch: step 17), and frozen to the end.
    EXPECT_EQ(decisions(d, false), std::vector<std::string>{"freeze@17"});
    for (auto& j : jsonl(d + "/freeze.jsonl"))
      if (j["type"] == "freeze") {
        EXPECT_EQ(j["modules"], 3);
      }
    EXPECT_EQ(sum["frozen_modules_final"], 3);
    int64_t first_frozen_step = -1;
    for (auto& j : jsonl(d + "/metrics.jsonl"))
      if (j["type"] == "step" && j["frozen_modules"] == 3 && first_frozen_step < 0) first_frozen_step = j["step"];
    EXPECT_EQ(first_frozen_step, 17) << "the step lines' frozen units";
  }
}

// Evaluated in the background (the default), each result is acted on at the next
// evaluation step, so the decisions cannot depend on how fast the background threads
// were: a run slowed by a competing busy thread, and killed and resumed twice, makes
// the same decisions at the same steps and ends with the same weights; and the same
// decisions as the run evaluated inline (--freeze-sync).
TEST(FreezeTrainer, BackgroundEgeriaDecidesTheSameWhateverTheTiming) {
  std::string a = tmpdir("egeria_bg_a"), b = tmpdir("egeria_bg_b");
  auto ca = run_cfg(a, "egeria");
  ca.freezing.reference.synchronous = false;
  ASSERT_TRUE(train::run_training(ca).completed);
  auto sum = nlohmann::json::parse(std::ifstream(a + "/summary.json"));
  EXPECT_EQ(sum["freeze_stats"]["apply"], "next");
  EXPECT_EQ(sum["freeze_stats"]["evaluations_dropped"].get<int64_t>(), 0);
  EXPECT_GT(sum["freeze_stats"]["evaluations_completed"].get<int64_t>(), 5);
  EXPECT_TRUE(sum["freeze_stats"].contains("evaluation_wait_seconds"));
  const auto da = decisions(a, true);
  ASSERT_FALSE(da.empty());

  std::atomic<bool> stop{false};
  std::thread busy([&] {
    volatile double x = 0;
    while (!stop) x = x + 1;
  });
  auto cb = ca;
  cb.out = b;
  const bool done = run_killed_twice(cb, 9, 31);
  stop = true;
  busy.join();
  ASSERT_TRUE(done);
  EXPECT_EQ(decisions(b, true), da);
  expect_same_weights(a, b);

  // Evaluated inline (--freeze-sync), a result is acted on at the same step: the same run.
  std::string c = tmpdir("egeria_bg_sync");
  auto cc = run_cfg(c, "egeria");
  ASSERT_TRUE(cc.freezing.reference.synchronous);
  ASSERT_TRUE(train::run_training(cc).completed);
  EXPECT_EQ(decisions(c, true), da);
}

// The image task with a reference that takes 300 ms to build (each refresh, every W
// evaluations): the evaluations a step submits find the pipeline full.
struct SlowReferenceTask : train::ImageTask {
  void configure_freezing(freeze::PolicyConfig& pc) const override {
    ImageTask::configure_freezing(pc);
    pc.make_model = [mc = pc.model] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      Generator g(0);
      return models::build_model(mc, g);
    };
  }
};

// In the background with results acted on as they arrive (the paper), training never
// waits for a slow reference: the evaluations it cannot take are dropped and counted,
// and the training thread's time in the policy stays a small share of the step time.
TEST(FreezeTrainer, AsynchronousEgeriaNeverBlocksAndCountsDrops) {
  std::string d = tmpdir("egeria_async");
  auto c = run_cfg(d, "egeria");
  c.freezing.reference.synchronous = false;
  c.freezing.apply_on_arrival = true;
  c.freezing.tracker.interval = 1;  // an evaluation every step
  SlowReferenceTask task;
  const auto s = train::fit(task, c);
  ASSERT_TRUE(s.completed);
  auto sum = nlohmann::json::parse(std::ifstream(d + "/summary.json"));
  const auto& st = sum["freeze_stats"];
  EXPECT_GT(st["evaluations_dropped"].get<int64_t>(), 0) << st.dump();
  EXPECT_GT(st["evaluations_completed"].get<int64_t>(), 0) << st.dump();
  // Each build would cost 300 ms of a ~40 ms step if the training thread waited for it.
  EXPECT_LT(sum["reference_overhead_fraction"].get<double>(), 0.25) << sum.dump();
}

}  // namespace

namespace {

TEST(FreezeTrainer, GpuReferenceIsAClearErrorWithoutAGpu) {
  for (const char* precision : {"fp32-gpu", "fp16-gpu"}) {
    auto c = run_cfg(tmpdir("gpu_ref"), "egeria");
    c.freezing.reference.precision = precision;
    try {
      train::validate(c);
      ADD_FAILURE() << precision << " accepted for a CPU run";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(precision), std::string::npos) << e.what();
    }
    if (!cuda_available()) {
      models::ModelConfig mc;
      mc.name = "resnet20";
      Generator g(1);
      auto m = models::build_model(mc, g);
      try {
        (void)quant::make_reference(precision, quant::model_factory(mc), m->state_dict());
        ADD_FAILURE() << precision << " reference built without a GPU";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("needs a CUDA GPU"), std::string::npos) << e.what();
      }
    }
  }
}

// Trains c for 2 steps with checkpoints, then resumes it changed by `change`: the
// resume must be refused with an error containing `needle`. Returns c as resumed.
train::TrainConfig expect_resume_refused(train::TrainConfig c, const std::function<void(train::TrainConfig&)>& change,
                                         const std::string& needle) {
  c.checkpoint_every = 1;
  c.stop_after_steps = 2;
  EXPECT_FALSE(train::run_training(c).completed);
  c.resume = true;
  change(c);
  try {
    train::run_training(c);
    ADD_FAILURE() << "resumed; expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  return c;
}

TEST(FreezeTrainer, ResumeRefusesOtherFreezingUnits) {
  std::string d = tmpdir("units_resume");
  auto c = expect_resume_refused(
      run_cfg(d, "static"), [](train::TrainConfig& r) { r.freezing.units = train::FreezeUnits::automatic; },
      "--freeze-modules layers, not auto");
  auto sum_units = [&] {
    c.freezing.units = train::FreezeUnits::layers;
    c.stop_after_steps = 0;
    return train::run_training(c).completed;
  };
  EXPECT_TRUE(sum_units());
  auto sum = nlohmann::json::parse(std::ifstream(d + "/summary.json"));
  EXPECT_EQ(sum["freeze_units"].size(), 11u);  // resnet20: stem, 9 blocks, head
}

// --freeze static --static-units 1,3: two units behind trainable ones freeze at epoch 1
// and stay bitwise as they were there; the stem before them and the units between and
// after train on; the set is in freeze.jsonl, the step lines, the summary and the report;
// a run killed while they are frozen resumes to the uninterrupted run's weights.
TEST(FreezeTrainer, AStaticSetBehindTrainableUnitsFreezesLogsAndResumesBitIdentically) {
  auto cfg = [](const std::string& d) {
    train::TrainConfig c = run_cfg(d, "static");
    c.freezing.static_units = {3, 1};  // any order
    c.freezing.static_epoch = 1;
    return c;
  };
  const std::string a = tmpdir("static_set_full"), b = tmpdir("static_set_killed"), at = tmpdir("static_set_at17");
  auto s = train::run_training(cfg(a));
  ASSERT_TRUE(s.completed);
  // Where they froze: after step 17, the first of epoch 1 (16 steps an epoch).
  train::TrainConfig c17 = cfg(at);
  c17.stop_after_steps = 17;
  c17.checkpoint_every = 1;
  ASSERT_FALSE(train::run_training(c17).completed);
  std::map<std::string, Tensor> then;
  for (auto& [k, t] : train::load_safetensors(at + "/checkpoint.safetensors"))
    if (k.rfind("model/", 0) == 0) then[k.substr(6)] = t;
  auto end = train::load_safetensors(a + "/model.safetensors");
  models::ModelConfig mc;
  mc.name = "resnet20";
  Generator g(1);
  auto m = models::build_model(mc, g);
  const auto layers = m->layer_modules();
  ASSERT_EQ(layers.size(), 11u);  // one unit per layer module (run_cfg)
  for (size_t i = 0; i + 1 < layers.size(); ++i)
    for (auto& [name, p] : layers[i].second->named_parameters()) {
      const std::string key = layers[i].first + "." + name;
      ASSERT_TRUE(end.count(key) && then.count(key)) << key;
      if (i == 1 || i == 3)
        EXPECT_EQ(end.at(key).to_vector<float>(), then.at(key).to_vector<float>()) << key << " changed while frozen";
      else EXPECT_NE(end.at(key).to_vector<float>(), then.at(key).to_vector<float>()) << key << " did not train";
    }
  auto log = jsonl(a + "/freeze.jsonl");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0]["step"], 17);
  EXPECT_EQ(log[0]["units"], nlohmann::json::array({1, 3}));
  int64_t set_lines = 0;  // the step lines (one every log_every steps) after step 17 name the set
  for (auto& j : jsonl(a + "/metrics.jsonl")) {
    if (j["type"] != "step") continue;
    ASSERT_EQ(j.contains("frozen_units"), j["step"].get<int64_t>() > 17) << j.dump();
    if (!j.contains("frozen_units")) continue;
    ++set_lines;
    EXPECT_EQ(j["frozen_units"], nlohmann::json::array({1, 3}));
    EXPECT_EQ(j["frozen_modules"], 2);
  }
  EXPECT_GE(set_lines, 1);
  auto sum = nlohmann::json::parse(std::ifstream(a + "/summary.json"));
  EXPECT_EQ(sum["frozen_units_final"], nlohmann::json::array({1, 3}));
  EXPECT_EQ(sum["frozen_modules_final"], 2);
  // Half of the two units' backward (their weight gradients), for 47 of the 64 steps.
  const double saved = sum["backward_flops_saved_fraction"];
  EXPECT_GT(saved, 0.0);
  EXPECT_LT(saved, 0.5 * 2.0 / 9.0);
  EXPECT_NE(s.freeze_report.find("frozen at the end: layer1.0, layer1.2 (2 of 10 units"), std::string::npos)
      << s.freeze_report;
  const std::string story = train::run_report(a);
  EXPECT_NE(story.find("frozen: layer1.0, layer1.2"), std::string::npos) << story;

  ASSERT_TRUE(run_killed_twice(cfg(b), 10, 15));  // killed before the freeze and while frozen
  expect_same_weights(a, b);
}

// Bad sets are named before training starts.
TEST(FreezeTrainer, AStaticSetOutOfRangeOrTwiceOrWithStaticModulesIsRefused) {
  auto refused = [](std::function<void(train::TrainConfig&)> set, const std::string& want) {
    train::TrainConfig c = run_cfg(tmpdir("static_set_bad"), "static");
    set(c);
    try {
      train::run_training(c);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
      EXPECT_FALSE(std::filesystem::exists(c.out + "/metrics.jsonl")) << "it trained first";
      return;
    }
    ADD_FAILURE() << "not refused: " << want;
  };
  refused(
      [](train::TrainConfig& c) {
    c.freezing.static_units = {2, 10};
      },
      "--static-units: unit 10 is out of range: the model has 11 freezing units, 0 to 9 can freeze");
  refused([](train::TrainConfig& c) { c.freezing.static_units = {4, 4}; }, "--static-units names unit 4 twice");
  refused([](train::TrainConfig& c) { c.freezing.static_units = {-1}; }, "--static-units: unit -1 is negative");
  refused(
      [](train::TrainConfig& c) {
    c.freezing.static_units = {1};
    c.freezing.static_modules = 2;
      },
      "--static-units and --static-modules both say what static freezes");
}

// A run whose readings were taken with one reference scope does not resume with the
// other (a checkpoint from before the flag was read with the network).
TEST(FreezeTrainer, ResumeRefusesAnotherReferenceScope) {
  auto c = run_cfg(tmpdir("scope_resume"), "egeria");
  c.freezing.reference_scope = train::ReferenceScope::network;
  c = expect_resume_refused(
      c, [](train::TrainConfig& r) { r.freezing.reference_scope = train::ReferenceScope::unit; },
      "--freeze-reference-scope network");
  c.freezing.reference_scope = train::ReferenceScope::network;
  c.stop_after_steps = 4;
  EXPECT_FALSE(train::run_training(c).completed) << "resumed, and stopped again";
}

// --freeze-tolerance-from auto compares as what it means for the run (Note [T for a
// pretrained network]): a checkpoint that named first3 resumes a run from scratch under auto,
// not a run from --init-from, where auto is peak.
TEST(FreezeTrainer, ResumeComparesTheToleranceSourceAsAutoMeansIt) {
  train::TrainConfig c;
  train::set_option(c, "--freeze", "egeria");
  nlohmann::json saved = train::to_json(c);
  EXPECT_EQ(saved["freeze_tolerance_from"], "auto");
  saved["freeze_tolerance_from"] = "first3";
  EXPECT_NO_THROW(train::check_resume(c, saved, 10, 5, "ckpt"));
  c.init_from = "pretrained.safetensors";
  saved["init_from"] = c.init_from;
  try {
    train::check_resume(c, saved, 10, 5, "ckpt");
    ADD_FAILURE() << "a pretrained run's first3 checkpoint resumed under auto (peak)";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--freeze-tolerance-from first3"), std::string::npos) << e.what();
  }
  saved["freeze_tolerance_from"] = "peak";
  EXPECT_NO_THROW(train::check_resume(c, saved, 10, 5, "ckpt"));
  train::set_option(c, "--freeze-tolerance-from", "first3");
  EXPECT_THROW(train::check_resume(c, saved, 10, 5, "ckpt"), Error);
}

// Likewise the int8 reference's calibration (a checkpoint from before the flag
// quantised every batch with its own scales, as --freeze-reference-calibration 0).
TEST(FreezeTrainer, ResumeRefusesAnotherReferenceCalibration) {
  auto c = run_cfg(tmpdir("calibration_resume"), "egeria");
  c.freezing.reference.calibration_batches = 0;
  c = expect_resume_refused(
      c, [](train::TrainConfig& r) { r.freezing.reference.calibration_batches = 3; },
      "--freeze-reference-calibration 0");
  c.freezing.reference.calibration_batches = 0;
  c.stop_after_steps = 4;
  EXPECT_FALSE(train::run_training(c).completed) << "resumed, and stopped again";
  auto cfg = nlohmann::json::parse(std::ifstream(c.out + "/config.json"));
  EXPECT_EQ(cfg["freeze_reference_calibration"], 0);
  EXPECT_EQ(cfg["freeze_reference_max_load"], "auto");
}

// Every Egeria flag of `train` reaches the tracker as given (train/freezing.cpp), and a
// bad value is an error naming the flag before anything is trained.
// By default bootstrapping checks the loss once an epoch, or every tenth of a run
// shorter than 10 epochs, not every n steps (Note [The bootstrapping check's span]).
TEST(FreezeTrainer, TheBootstrappingCheckSpansATenthOfAShortRun) {
  const std::string d = tmpdir("bootstrap_span");
  auto c = run_cfg(d, "egeria");
  c.freezing.tracker.bootstrap_interval = 0;
  ASSERT_TRUE(train::run_training(c).completed);  // 4 epochs of 16 steps, n = 2
  int64_t checks = 0;
  for (auto& j : jsonl(d + "/freeze.jsonl"))
    if (j["type"] == "bootstrap") {
      EXPECT_EQ(j["step"].get<int64_t>() % 6, 0) << j.dump();
      ++checks;
    }
  EXPECT_GE(checks, 2);
  auto sum = nlohmann::json::parse(std::ifstream(d + "/summary.json"));
  EXPECT_EQ(sum["freeze_stats"]["bootstrap_interval"], 6);
  EXPECT_EQ(sum["freeze_stats"]["interval"], 2);
}

// A run that starts from pretrained weights (--init-from) skips bootstrapping by default:
// the first step's network is the reference and readings start at once (Note
// [Bootstrapping a pretrained network]); "off" asks the same of any run.
TEST(FreezeTrainer, APretrainedRunIsNotBootstrapped) {
  const std::string pre = tmpdir("boot_pre"), d = tmpdir("boot_fine");
  auto p = run_cfg(pre, "none");
  p.epochs = 1;
  ASSERT_TRUE(train::run_training(p).completed);
  auto c = run_cfg(d, "egeria");
  c.freezing.tracker.bootstrap_interval = 0;  // auto
  c.init_from = pre + "/model.safetensors";
  ASSERT_TRUE(train::run_training(c).completed);
  const auto log = jsonl(d + "/freeze.jsonl");
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front()["type"], "refresh") << log.front().dump();
  EXPECT_EQ(log.front()["step"], 1);
  int64_t evaluations = 0;
  for (auto& j : log) {
    EXPECT_NE(j["type"], "bootstrap") << j.dump();
    evaluations += j["type"] == "evaluation";
  }
  EXPECT_GT(evaluations, 0);
  auto sum = nlohmann::json::parse(std::ifstream(d + "/summary.json"));
  EXPECT_EQ(sum["freeze_stats"]["bootstrap_interval"], freeze::kNoBootstrapping);
  EXPECT_NE(train::run_report(d, "").find("from the first step, without bootstrapping"), std::string::npos);
  EXPECT_EQ(sum["freeze_stats"]["reference_bn"], "running") << "the default, pretrained or not";
  EXPECT_EQ(sum["freeze_stats"]["tolerance_from"], "peak") << "auto, pretrained (Note [T for a pretrained network])";
  // n from the guideline: a pretrained run's floor is lower than one from scratch
  // (Note [n for a pretrained network]); this run's guideline gives less than either.
  auto a = c;
  a.out = tmpdir("boot_fine_auto_n");
  a.freezing.tracker.interval = 0;
  ASSERT_TRUE(train::run_training(a).completed);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(a.out + "/summary.json"))["freeze_stats"]["interval"],
            freeze::kMinPretrainedInterval);
  auto scratch_n = a;
  scratch_n.out = tmpdir("boot_scratch_auto_n");
  scratch_n.init_from.clear();
  ASSERT_TRUE(train::run_training(scratch_n).completed);
  const auto scratch_sum = nlohmann::json::parse(std::ifstream(scratch_n.out + "/summary.json"));
  EXPECT_EQ(scratch_sum["freeze_stats"]["interval"], freeze::kMinDefaultInterval);
  EXPECT_EQ(scratch_sum["freeze_stats"]["tolerance_from"], "first3") << "auto, from scratch: the paper's";
  // Killed right after the first step's reference was taken, and again later, resumed:
  // the same readings and weights as the run that was never stopped.
  auto k = c;
  k.out = tmpdir("boot_fine_killed");
  ASSERT_TRUE(run_killed_twice(k, 1, 20));
  expect_same_weights(d, k.out);
  EXPECT_EQ(readings(k.out), readings(d));

  train::TrainConfig o;
  train::set_option(o, "--freeze-bootstrap-interval", "off");
  EXPECT_EQ(o.freezing.tracker.bootstrap_interval, freeze::kNoBootstrapping);
  EXPECT_FALSE(freeze::FreezeTracker(3, train::policy_config(o).tracker).bootstrapping());
  freeze::TrackerOptions scratch;
  EXPECT_TRUE(freeze::FreezeTracker(3, scratch).bootstrapping());
}

// --freeze-reference-bn (Note [The reference's batch norm]): the snapshot's running
// statistics by default, pretrained or not; batch asks for each batch's own.
TEST(FreezeTrainer, TheReferencesBatchNormIsRunningUnlessSet) {
  train::TrainConfig c;
  train::set_option(c, "--freeze", "egeria");
  c.init_from = "pretrained.safetensors";
  EXPECT_EQ(train::policy_config(c).reference.bn, quant::ReferenceBn::running);
  train::set_option(c, "--freeze-reference-bn", "batch");
  EXPECT_EQ(train::policy_config(c).reference.bn, quant::ReferenceBn::batch);
  auto r = run_cfg(tmpdir("reference_bn_batch"), "egeria");  // a run with it: readings, told by the report
  r.freezing.reference.bn = quant::ReferenceBn::batch;
  r.freezing.tracker.bootstrap_interval = freeze::kNoBootstrapping;
  ASSERT_TRUE(train::run_training(r).completed);
  auto sum = nlohmann::json::parse(std::ifstream(r.out + "/summary.json"));
  EXPECT_EQ(sum["freeze_stats"]["reference_bn"], "batch");
  EXPECT_GT(sum["freeze_stats"]["evaluations_completed"].get<int64_t>(), 0);
  EXPECT_NE(train::run_report(r.out, "").find("against a reference whose batch norms take each batch's statistics"),
            std::string::npos);
  const std::string msg = eg::testing::error_of([&] { train::set_option(c, "--freeze-reference-bn", "folded"); });
  EXPECT_NE(msg.find("--freeze-reference-bn"), std::string::npos) << msg;
}

// --freeze-bn-settle: auto settles 20 steps where frozen batch norms switch to running
// statistics and none where they keep the batch's; a number where they keep the batch's is
// named, as are values that are no number of steps.
TEST(FreezeTrainer, SettlingIsAutoWithRunningStatisticsAndNamedWhenItCannotApply) {
  train::TrainConfig c;
  EXPECT_EQ(c.freezing.bn_settle_steps(), 0) << "batch statistics, the default: nothing to settle";
  EXPECT_EQ(train::to_json(c)["freeze_bn_settle"], "auto");
  train::set_option(c, "--freeze-bn", "running");
  EXPECT_EQ(c.freezing.bn_settle_steps(), freeze::kBnSettleAutoSteps);
  train::set_option(c, "--freeze-bn-settle", "7");
  EXPECT_EQ(c.freezing.bn_settle_steps(), 7);
  EXPECT_EQ(train::to_json(c)["freeze_bn_settle"], 7);
  train::set_option(c, "--freeze-bn-settle", "0");
  EXPECT_EQ(c.freezing.bn_settle_steps(), 0);
  train::set_option(c, "--freeze-bn-settle", "auto");
  EXPECT_EQ(c.freezing.bn_settle_steps(), freeze::kBnSettleAutoSteps);
  for (const char* bad : {"-2", "soon", "1.5"}) {
    const std::string e = eg::testing::error_of([&] { train::set_option(c, "--freeze-bn-settle", bad); });
    EXPECT_NE(e.find("--freeze-bn-settle must be auto or a non-negative number of steps"), std::string::npos) << e;
  }
  auto batch = run_cfg(tmpdir("settle_batch"), "egeria");
  batch.freezing.bn_settle = 5;
  const std::string e = eg::testing::error_of([&] { train::run_training(batch); });
  EXPECT_NE(e.find("--freeze-bn-settle 5 settles the running statistics a frozen BatchNorm switches to"),
            std::string::npos)
      << e;
}

TEST(FreezeTrainer, EgeriaFlagsReachTheTracker) {
  train::TrainConfig c;
  for (auto [flag, text] : {std::pair{"--freeze", "egeria"},
                            {"--freeze-bootstrap-interval", "11"},
                            {"--freeze-window", "7"},
                            {"--freeze-window-min", "3"},
                            {"--freeze-tolerance", "0.3"},
                            {"--freeze-tolerance-from", "peak"},
                            {"--freeze-last-phase", "off"}})
    train::set_option(c, flag, text);
  for (auto [name, want] :
       {std::pair{"remeasure", freeze::RefreezeTolerance::remeasure},
        std::pair{"keep", freeze::RefreezeTolerance::keep}, std::pair{"scaled", freeze::RefreezeTolerance::scaled}}) {
    train::set_option(c, "--freeze-refreeze-tolerance", name);
    const freeze::PolicyConfig pc = train::policy_config(c);
    EXPECT_EQ(pc.tracker.refreeze_tolerance, want) << name;
    EXPECT_EQ(pc.tracker.window, 7);
    EXPECT_EQ(pc.tracker.bootstrap_interval, 11);
    EXPECT_EQ(pc.tracker.min_window, 3);
    EXPECT_DOUBLE_EQ(pc.tracker.tolerance_coef, 0.3);
    EXPECT_TRUE(pc.tracker.tolerance_from_peak());
    EXPECT_FALSE(pc.tracker.freeze_last_phase);
  }
  auto bad = run_cfg(tmpdir("bad_refreeze"), "egeria");
  try {
    train::set_option(bad, "--freeze-refreeze-tolerance", "first3");
    ADD_FAILURE() << "an unknown --freeze-refreeze-tolerance was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--freeze-refreeze-tolerance"), std::string::npos) << e.what();
  }
}

}  // namespace
