// Host syncs (Note [Host syncs] in core/device.h): which Tensor calls count, and how many a
// training step makes. A GPU run makes the same calls, each a point where the GPU waits
// for the host; the counts here are the ones to bring down (a step that never waits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "core/allocator.h"
#include "core/deferred_read.h"
#include "core/device.h"
#include "core/side_stream.h"
#include "core/staged_upload.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/strategy.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "models/transformer.h"
#include "optim/optimizer.h"
#include "tests/test_util.h"
#include "train/graphed_step.h"
#include "train/trainer.h"

namespace eg {
namespace {

int64_t syncs_of(const std::function<void()>& f) {
  const int64_t before = host_syncs();
  f();
  return host_syncs() - before;
}

TEST(HostSyncs, CountTheCallsThatReadOrMoveValuesBetweenHostAndDevice) {
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  Tensor one = Tensor::from_vector(std::vector<float>{4}, {1});
  EXPECT_EQ(syncs_of([&] { (void)one.item(); }), 1);
  EXPECT_EQ(syncs_of([&] { (void)x.to_vector<float>(); }), 1);
  EXPECT_EQ(syncs_of([&] { (void)x.to(Device::cpu()); }), 1) << "a GPU run's download";
  EXPECT_EQ(syncs_of([&] { (void)x.to(DType::f64); }), 2) << "down to the host and back";
  EXPECT_EQ(syncs_of([&] { (void)Tensor::from_vector(std::vector<float>{1}, {1}, Device::cpu()); }), 1) << "an upload";
  // Work that stays on the device: kernels, copies, new tensors, zeros.
  EXPECT_EQ(syncs_of([&] {
              Tensor y = fn::mul(x, x);
              Tensor c = y.clone();
              c.copy_(x);
              Tensor z = Tensor::zeros({3});
              Tensor e = Tensor::empty({3});
            }),
            0);
  // The gradient norm: one read for all the buckets, not one a bucket.
  Tensor a = Tensor::from_vector(std::vector<float>{3, 0}, {2}).set_requires_grad(true);
  Tensor b = Tensor::from_vector(std::vector<float>{0, 4}, {2}).set_requires_grad(true);
  optim::SGD opt({a, b}, 0.1);
  opt.set_bucket_caps(8, 8);  // a bucket each
  opt.zero_grad();
  fn::sum(fn::mul(fn::add(a, b), fn::add(a, b))).backward();
  double norm = 0;
  EXPECT_EQ(syncs_of([&] { norm = opt.clip_grad_norm(1e9); }), 1);
  EXPECT_EQ(opt.grad_buckets().buckets().size(), 2u);
  EXPECT_NEAR(norm, 2 * std::sqrt(3.0 * 3 + 4 * 4) * std::sqrt(2.0), 1e-5);
}

// The step of `egeria bench step` (its batch made once, on the device) makes none: one
// process defers the loss's read (Note [Deferred reads]; the benchmark reads it after the
// step, its own wait), and the backward's seed gradient and the Transformer's padding
// masks are made on the device. Its timed steps take every block from the allocator's
// cache (no system call, which on a GPU may wait for the device), and the host's time to
// issue a step is within the step's (on the CPU, all of it).
TEST(HostSyncs, ABenchmarkStepMakesNone) {
  auto local = dist::make_local();
  // MobileNetV2 in bf16: its 24-channel batch norms once went to ref, whose widenings
  // count as host syncs.
  for (auto [model, precision] :
       {std::pair{"resnet20", DType::f32}, {"transformer-tiny", DType::f32}, {"mobilenetv2", DType::bf16}}) {
    train::StepBenchOptions o;
    o.model = model;
    o.precision = precision;
    o.batch_size = 4;
    o.seq_len = 6;
    o.iterations = 3;
    o.threads = 1;
    const train::StepBench r = train::bench_step(o, *local);
    EXPECT_EQ(r.host_syncs_per_step, 0) << model;
    EXPECT_EQ(r.system_allocs, 0) << model;
    EXPECT_EQ(r.system_frees, 0) << model;
    EXPECT_GT(r.median_host_ms, 0) << model;
    EXPECT_LE(r.median_host_ms, r.median_step_ms) << model;
    ASSERT_EQ(r.step_ms.size(), 3u) << model;  // every timed step, the median among them
    std::vector<double> sorted = r.step_ms;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted[1], r.median_step_ms) << model;
  }
}

// Note [Op profiles]: bench step --profile counts every op of a step once per call (a
// ResNet-20 step: 19 convolutions and 2 option-A shortcuts, fixed 1x1 convolutions,
// forward; the 19 for their weights; all but the stem for their inputs, the image needing
// no gradient), times them within the step, and counts the layout
// conversions (here the global pool's plain copy of the last nChw16c feature map and the
// ReLU backward's conversion of the pool's plain gradient back to it).
TEST(StepProfile, CountsEachOpOfAStepAndTheLayoutConversions) {
  auto local = dist::make_local();
  const testing::CpuLayoutSetting blocked(CpuLayout::blocked);
  train::StepBenchOptions o;
  o.model = "resnet20";
  o.batch_size = 4;
  o.iterations = 2;
  o.threads = 1;
  o.profile = true;
  const train::StepBench r = train::bench_step(o, *local);
  std::map<std::string, double> calls;
  double ops_ms = 0;
  for (const ops::OpTime& t : r.op_times) {
    EXPECT_EQ(t.backend, ops::Backend::cpu) << t.op;
    EXPECT_GT(t.seconds, 0) << t.op;
    calls[t.op] += double(t.calls) / r.iterations;
    ops_ms += 1000 * t.seconds / r.iterations;
  }
  EXPECT_EQ(calls["conv2d_fwd"], 21);
  EXPECT_EQ(calls["conv2d_bwd_weight"], 19);
  EXPECT_EQ(calls["conv2d_bwd_data"], 20);
  EXPECT_EQ(calls["global_avgpool_fwd"], 1);
  EXPECT_GE(calls["sgd_step_multi"] + calls["sgd_step"], 1);
  double step_ms = 0;
  for (double t : r.step_ms) step_ms += t / r.iterations;
  EXPECT_GT(ops_ms, 0);
  EXPECT_LE(ops_ms, step_ms);
  EXPECT_EQ(r.conversions.count, 2 * r.iterations);
  EXPECT_EQ(r.conversions.bytes, 2 * r.iterations * 4 * 64 * 8 * 8 * 4);  // f32 [4, 64, 8, 8] each way
  EXPECT_LE(r.conversions.seconds * 1000 / r.iterations, step_ms);
  const nlohmann::json j = train::step_profile_json(r);
  EXPECT_EQ(j["steps"], 2);
  EXPECT_NEAR(j["ops_ms_per_step"].get<double>() + j["outside_ops_ms_per_step"].get<double>(),
              j["mean_step_ms"].get<double>(), 1e-9);
  EXPECT_EQ(j["layout_conversions_per_step"], 2.0);
  ASSERT_FALSE(j["ops"].empty());
  EXPECT_GE(j["ops"][0]["ms_per_step"].get<double>(), j["ops"].back()["ms_per_step"].get<double>()) << "slowest first";

  o.profile = false;  // and nothing is kept without it
  const train::StepBench quiet = train::bench_step(o, *local);
  EXPECT_TRUE(quiet.op_times.empty());
  EXPECT_EQ(quiet.conversions.count, 0);
}

// An op run inside another op counts in the outer one's time only; a profiler inside
// another takes the ops meanwhile and gives them back when it goes.
TEST(StepProfile, NestedOpsAndProfilers) {
  const Tensor x = Tensor::ones({2, 16, 4, 4}).to_format(Format::nchw16c);
  Tensor y = Tensor::empty({2, 16});
  ops::OpProfiler outer;
  ops::call(ops::global_avgpool_fwd, x, y);  // converts x to plain inside the op
  {
    ops::OpProfiler inner;
    ops::call(ops::global_avgpool_fwd, x, y);
    ops::call(ops::global_avgpool_fwd, x, y);
    ASSERT_EQ(inner.times().size(), 1u);
    EXPECT_EQ(inner.times()[0].calls, 2);
    EXPECT_EQ(inner.conversions().count, 2);
  }
  ops::call(ops::global_avgpool_fwd, x, y);
  ASSERT_EQ(outer.times().size(), 1u);
  EXPECT_EQ(outer.times()[0].calls, 2);
  EXPECT_EQ(outer.conversions().count, 2);
  EXPECT_EQ(outer.conversions().bytes, 2 * x.nbytes());
  {
    ops::detail::OpTimer nested_by_hand("outer_op", ops::Backend::cpu);
    ops::call(ops::global_avgpool_fwd, x.to_plain(), y);  // inside: not timed on its own
  }
  const auto t = outer.times();
  EXPECT_EQ(t.size(), 2u);
  bool outer_op = false;
  for (const auto& e : t) outer_op |= e.op == "outer_op" && e.calls == 1;
  EXPECT_TRUE(outer_op);
  for (const auto& e : t) {
    if (e.op == "global_avgpool_fwd") {
      EXPECT_EQ(e.calls, 2) << "the nested call is the outer op's";
    }
  }
}

// --cuda-graphs on is refused where there is nothing to capture, naming the flag: on the
// CPU (benchmark and GraphedStep alike); the graphed step itself runs in Cuda.* tests.
TEST(HostSyncs, CudaGraphsAreRefusedOnTheCpu) {
  auto local = dist::make_local();
  train::StepBenchOptions o;
  o.model = "resnet20";
  o.batch_size = 2;
  o.iterations = 1;
  o.cuda_graphs = true;
  const std::string e = testing::error_of([&] { train::bench_step(o, *local); });
  EXPECT_NE(e.find("--cuda-graphs on runs on a GPU"), std::string::npos) << e;
  dist::Strategy dp(*local, "cpu", {});
  Tensor w = Tensor::zeros({2}).set_requires_grad(true);
  optim::SGD opt({w}, 0.1);
  const std::string e2 = testing::error_of([&] { train::GraphedStep gs(dp, opt, nullptr, {}); });
  EXPECT_NE(e2.find("--cuda-graphs on runs on a GPU"), std::string::npos) << e2;
}

// Note [Graphed steps]: which steps a graphed step runs eagerly, captures or replays. One
// shape: the warm-up, then a capture, then replays. A new shape: its first step eager,
// its second captured. At the limit, a new shape is captured only once it has run more
// than twice as often as the least-used graph, which it replaces; until then its steps
// are eager. An
// optimizer not ready to capture keeps steps eager; reset() starts the warm-up anew.
TEST(HostSyncs, GraphPolicyCapturesTheMostFrequentShapesUpToItsLimit) {
  using A = train::GraphPolicy::Action;
  const train::GraphKey a = {8, 16, 16}, b = {8, 24, 16}, c = {8, 32, 32}, d = {3, 8, 8};
  train::GraphPolicy p(3, 2);
  std::optional<train::GraphKey> evict;
  auto next = [&](const train::GraphKey& k, bool ready = true) { return p.next(k, ready, &evict); };
  EXPECT_EQ(next(a), A::eager);
  EXPECT_EQ(next(a), A::eager);
  EXPECT_EQ(next(a), A::eager);
  EXPECT_EQ(next(a, false), A::eager) << "warmed up, but the optimizer is not ready";
  EXPECT_EQ(next(a), A::capture);
  EXPECT_FALSE(evict);
  EXPECT_EQ(next(a), A::replay);
  EXPECT_EQ(next(b), A::eager) << "a shape's first step";
  EXPECT_EQ(next(b), A::capture);
  EXPECT_EQ(next(b), A::replay);
  EXPECT_EQ(p.graphs(), 2);
  // a: 6 steps, b: 3. c runs eagerly until it has run more than twice as often as b (6),
  // then replaces it.
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(next(c), A::eager) << i;
    EXPECT_FALSE(evict);
  }
  EXPECT_EQ(next(c), A::capture);
  ASSERT_TRUE(evict);
  EXPECT_EQ(*evict, b);
  EXPECT_EQ(next(c), A::replay);
  EXPECT_EQ(next(a), A::replay);
  EXPECT_EQ(next(b), A::eager) << "dropped, and seen 4 times against the least-used graph's 7 (a's)";
  EXPECT_EQ(next(d), A::eager);
  EXPECT_EQ(p.graphs(), 2);
  p.reset();
  EXPECT_EQ(p.graphs(), 0);
  EXPECT_EQ(next(a), A::eager) << "warm-up anew";
  EXPECT_EQ(next(a), A::eager);
  EXPECT_EQ(next(a), A::eager);
  EXPECT_EQ(next(a), A::capture);
  EXPECT_THROW(train::GraphPolicy(3, 0), Error);
}

// Two steady-state steps (`step(i)` runs step i) record the same ops with the same
// arguments, take every block from the allocators' caches, and make no host sync.
void expect_replayable_steps(const std::string& what, const std::function<void(int64_t)>& step) {
  for (int64_t i = 0; i < 3; ++i) step(i);  // warm-up: plans, caches, the autocast weight copies
  std::vector<ops::OpRecord> seen[2];
  int64_t syncs[2] = {}, allocs[2] = {};
  for (int k = 0; k < 2; ++k) {
    const uint64_t a0 = cpu_allocator().stats().system_allocs;
    const int64_t s0 = host_syncs();
    ops::OpRecorder rec;
    step(3 + k);
    seen[k] = rec.records();
    syncs[k] = host_syncs() - s0;
    allocs[k] = int64_t(cpu_allocator().stats().system_allocs - a0);
  }
  EXPECT_GT(seen[0].size(), 100u) << what;
  ASSERT_EQ(seen[0].size(), seen[1].size()) << what;
  for (size_t i = 0; i < seen[0].size(); ++i)
    ASSERT_EQ(seen[0][i], seen[1][i]) << what << ": op " << i << " differs between steps: " << seen[0][i].str()
                                      << " then " << seen[1][i].str();
  EXPECT_EQ(allocs[1], 0) << what << ": a steady-state step's blocks all come from the cache";
  EXPECT_EQ(syncs[0], 0) << what;
  EXPECT_EQ(syncs[1], 0) << what;
}

// Note [Op records]: what a CUDA graph of the training step needs, checked on the CPU. Two
// steady-state steps of ResNet-20 with SGD (f32, and bf16 under autocast) run the same ops
// with the same arguments (the learning rate on the device), take every block from the
// allocators' caches, and make no host sync: the loss is on its way to the host when the
// step ends (Note [Deferred reads]). ResNet-50 (bf16, at 64 pixels) for its stem, max pool,
// bottlenecks and projections, and its gradients added where they live (Note [Gradient
// destinations]), offered the same way every step.
TEST(HostSyncs, SteadyStateStepsRunTheSameOpsAndAllocateNothingNew) {
  auto local = dist::make_local();
  for (auto [model, precision] :
       {std::pair{"resnet20", DType::f32}, {"resnet20", DType::bf16}, {"resnet50", DType::bf16}}) {
    const bool imagenet = std::string(model) == "resnet50";
    models::ModelConfig mc;
    mc.name = model;
    mc.image_size = imagenet ? 64 : 32;
    mc.small_input = !imagenet;
    mc.num_classes = 10;
    Generator g(3);
    auto m = models::build_model(mc, g);
    optim::SGD opt(m->parameters(), 0.05, {0.9, 0, 5e-4, false});
    dist::Strategy dp(*local, "cpu", {});
    const int64_t n = imagenet ? 4 : 8;
    const Tensor x = Tensor::randn({n, 3, mc.image_size, mc.image_size}, g);
    std::vector<int64_t> labels;
    for (int64_t k = 0; k < n; ++k) labels.push_back(k);
    const Tensor y = Tensor::from_vector(labels, {n});
    expect_replayable_steps(std::string(model) + " " + dtype_name(precision), [&](int64_t i) {
      opt.set_lr(0.05 / double(1 + i));  // a schedule: the value moves, the launches do not
      Tensor loss;
      {
        autograd::Autocast ac(precision);
        loss = fn::cross_entropy(m->forward(x), y);
      }
      const dist::StepResult r = dp.step(loss, n, opt, i, 0);
      ASSERT_TRUE(r.deferred);
      ASSERT_TRUE(std::isfinite(r.loss_later.lagged_value()));
    });
  }
}

// The same for a Transformer with AdamW: its dropout reads the seed and the step's first
// counter from the device (Note [Random state on the device] in core/rng.h), AdamW its step
// counts, so that the launches are those of the step before. Without mark_step() the
// dropout's counters move on and the records differ (the check can fail).
TEST(HostSyncs, TransformerStepsWithDropoutAndAdamWRunTheSameOps) {
  auto local = dist::make_local();
  for (DType precision : {DType::f32, DType::bf16}) {
    models::ModelConfig mc;
    mc.name = "transformer-tiny";
    Generator g(3);
    auto m = models::build_model(mc, g);
    optim::AdamW opt(m->parameters(), 1e-3);
    dist::Strategy dp(*local, "cpu", {});
    Generator data(5);
    auto ids = [&](int64_t b, int64_t n) {
      std::vector<int64_t> v(size_t(b * n));
      for (auto& t : v) t = 4 + int64_t(data.next_u32() % uint32_t(mc.vocab - 4));
      return Tensor::from_vector(v, {b, n});
    };
    const Tensor src = ids(4, 6), tgt = ids(4, 6), y = ids(1, 24).reshape({24});
    bool mark = true;
    auto step = [&](int64_t i) {
      if (mark) g.mark_step();
      opt.set_lr(1e-3 * double(i + 1) / 8);  // warm-up
      Tensor loss;
      {
        autograd::Autocast ac(precision);
        Tensor logits = m->forward_frozen(src, tgt, 0);
        loss = fn::cross_entropy(fn::reshape(logits, {24, logits.size(2)}), y);
      }
      const dist::StepResult r = dp.step(loss, 24, opt, i, 0);
      ASSERT_TRUE(r.deferred);
      ASSERT_TRUE(std::isfinite(r.loss_later.lagged_value()));
    };
    expect_replayable_steps(std::string("transformer-tiny ") + dtype_name(precision), step);
    if (precision == DType::bf16) continue;
    mark = false;
    std::vector<ops::OpRecord> seen[2];
    for (int k = 0; k < 2; ++k) {
      ops::OpRecorder rec;
      step(10 + k);
      seen[k] = rec.records();
    }
    EXPECT_NE(seen[0], seen[1]) << "unmarked steps draw from counters further on";
  }
}

// Translation batches of one padded shape (--pad-to-multiple) differ in their ids and
// where their padding starts, which a graph of that shape must not depend on: written in
// place into the task's graph inputs (train::GraphInput), each step runs the same ops with
// the same arguments (the padding masks and the loss's ignored targets made from the ids
// on the device), allocates nothing new and makes no host sync; in f32 and bf16, with and
// without a frozen prefix.
TEST(HostSyncs, PaddedTranslationBatchesOfOneShapeRunTheSameOps) {
  auto local = dist::make_local();
  models::TransformerConfig tc = models::transformer_preset("transformer-tiny", 40);
  // Two batches of [3, 8] sources and targets: real tokens, then eos, then padding (0).
  auto batch = [&](uint64_t seed, std::vector<int64_t> lens, int64_t width) {
    Generator r(seed);
    std::vector<int64_t> v(size_t(3 * width), tc.pad_id);
    for (size_t row = 0; row < 3; ++row) {
      for (int64_t k = 0; k + 1 < lens[row]; ++k) v[row * size_t(width) + size_t(k)] = 4 + int64_t(r.next_u32() % 36);
      v[row * size_t(width) + size_t(lens[row] - 1)] = tc.eos_id;
    }
    return Tensor::from_vector(v, {3, width});
  };
  const Tensor batches[2][3] = {{batch(1, {8, 3, 5}, 8), batch(2, {6, 8, 2}, 8), batch(3, {6, 8, 2}, 8)},
                                {batch(4, {2, 2, 7}, 8), batch(5, {8, 4, 4}, 8), batch(6, {8, 4, 4}, 8)}};
  // f32 and bf16; the whole model trained, and with its first 2 layer modules frozen (the
  // prefix under no-grad, as a frozen step runs it).
  for (DType precision : {DType::f32, DType::bf16})
    for (int64_t frozen : {0, 2}) {
      Generator g(3);
      models::Transformer m(tc, g);
      optim::AdamW opt(m.parameters(), 1e-3);
      dist::Strategy dp(*local, "cpu", {});
      train::GraphInput in[3];
      const std::string what =
          std::string("padded translation batches, ") + dtype_name(precision) + ", frozen " + std::to_string(frozen);
      expect_replayable_steps(what, [&](int64_t i) {
        g.mark_step();
        Tensor t[3];
        for (int k = 0; k < 3; ++k) {
          t[k] = in[k].place({3, 8}, DType::s64, Device::cpu(), 3 * 16);
          t[k].copy_(batches[i % 2][k]);
        }
        Tensor loss;
        {
          autograd::Autocast ac(precision);
          Tensor logits = m.forward_frozen(t[0], t[1], frozen);
          loss = fn::cross_entropy(fn::reshape(logits, {24, logits.size(2)}), t[2].reshape({24}), 0.1, tc.pad_id);
        }
        const dist::StepResult r = dp.step(loss, 12, opt, i, 0);
        ASSERT_TRUE(r.deferred);
        ASSERT_TRUE(std::isfinite(r.loss_later.lagged_value()));
      });
      EXPECT_EQ(in[0].moves(), 0) << what << ": made once, big enough";
      (void)in[0].place({3, 17}, DType::s64, Device::cpu());
      EXPECT_EQ(in[0].moves(), 1) << "a bigger batch moves the buffer (and drops the graphs reading it)";
    }
}

// --pad-to-multiple changes only rounding: padded positions are masked out of attention
// and their targets out of the loss, so a Transformer (no dropout, whose draws follow the
// shape) trains on batches padded from 5 and 6 to 8 tokens as on the batches themselves.
// With SGD: AdamW would blow up gradients that are 0 but for rounding (the attention key
// biases': a softmax ignores what it adds to all of a row's scores) to whole steps.
TEST(HostSyncs, PaddingTranslationBatchesChangesOnlyRounding) {
  auto local = dist::make_local();
  models::TransformerConfig tc = models::transformer_preset("transformer-tiny", 40);
  tc.dropout = 0;
  Generator data(7);
  std::vector<int64_t> src(4 * 5), tin(4 * 6), tout(4 * 6);
  for (auto* v : {&src, &tin, &tout})
    for (auto& t : *v) t = 4 + int64_t(data.next_u32() % 36);
  for (int64_t r = 0; r < 4; ++r) {  // ragged rows: eos, then padding
    src[size_t(r * 5 + 4 - r)] = tc.eos_id;
    for (int64_t k = 5 - r; k < 5; ++k) src[size_t(r * 5 + k)] = tc.pad_id;
    tin[size_t(r * 6)] = tc.bos_id;
    for (int64_t k = 6 - r; k < 6; ++k) tin[size_t(r * 6 + k)] = tout[size_t(r * 6 + k)] = tc.pad_id;
  }
  auto pad = [&](const std::vector<int64_t>& v, int64_t n, int64_t to) {
    std::vector<int64_t> p(size_t(4 * to), tc.pad_id);
    for (int64_t r = 0; r < 4; ++r) std::copy_n(v.begin() + r * n, n, p.begin() + r * to);
    return Tensor::from_vector(p, {4, to});
  };
  std::vector<double> losses[2];
  std::vector<float> weights[2];
  for (int padded = 0; padded < 2; ++padded) {
    Generator g(3);
    models::Transformer m(tc, g);
    optim::SGD opt(m.parameters(), 0.1, {0.9, 0, 0, false});
    dist::Strategy dp(*local, "cpu", {});
    const int64_t S = padded ? 8 : 5, T = padded ? 8 : 6;
    const Tensor x = pad(src, 5, S), y_in = pad(tin, 6, T), y_out = pad(tout, 6, T);
    for (int64_t i = 0; i < 4; ++i) {
      Tensor logits = m.forward(x, y_in);
      Tensor loss =
          fn::cross_entropy(fn::reshape(logits, {4 * T, logits.size(2)}), y_out.reshape({4 * T}), 0.1, tc.pad_id);
      losses[padded].push_back(dp.step(loss, 18, opt, i, 0).loss_later.value());
    }
    for (auto& p : m.parameters())
      for (float v : p.to_vector<float>()) weights[padded].push_back(v);
  }
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5 * losses[0][i]) << i;
  ASSERT_EQ(weights[0].size(), weights[1].size());
  float worst = 0;
  for (size_t i = 0; i < weights[0].size(); ++i) worst = std::max(worst, std::abs(weights[1][i] - weights[0][i]));
  EXPECT_LE(worst, 1e-5f);
  EXPECT_GT(losses[0].front() - losses[0].back(), 0.01) << "it trains";
}

// Note [Deferred reads] on the CPU: the value is read when the DeferredScalar is made (no
// wait, no sync); copies share it; a known value reads as itself; a tensor that is not one
// f32 or f64 element is refused naming it.
TEST(HostSyncs, ADeferredScalarOnTheCpuIsReadAtOnce) {
  Tensor one = Tensor::from_vector(std::vector<float>{2.5f}, {1});
  DeferredScalar d;
  EXPECT_FALSE(d.defined());
  EXPECT_EQ(syncs_of([&] { d = DeferredScalar::of(one); }), 0);
  one.zero_();  // later writes do not reach a value already read
  const DeferredScalar copy = d;
  EXPECT_TRUE(d.landed());
  EXPECT_EQ(syncs_of([&] { EXPECT_EQ(d.value(), 2.5); }), 0);
  EXPECT_EQ(copy.lagged_value(), 2.5);
  EXPECT_EQ(DeferredScalar(0.25).value(), 0.25);
  EXPECT_EQ(DeferredScalar::of(Tensor::full({}, 3.0, DType::f64)).value(), 3.0);
  try {
    (void)DeferredScalar::of(Tensor::zeros({2}));
    FAIL() << "two elements";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one f32 or f64 element"), std::string::npos) << e.what();
  }
}

// A HostCopy of a host tensor is that tensor, at once and without a sync; pinned memory
// without a GPU is the CPU allocator's, as a plain host tensor.
TEST(HostSyncs, AHostCopyOfAHostTensorIsItself) {
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  HostCopy c;
  EXPECT_FALSE(c.defined());
  EXPECT_EQ(syncs_of([&] { c = HostCopy::of(x); }), 0);
  EXPECT_EQ(syncs_of([&] { EXPECT_EQ(c.get().raw(), x.raw()); }), 0);
  Tensor p = Tensor::empty_pinned({2, 3}, DType::bf16);
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_EQ(p.nbytes(), 12u);
  p.copy_(Tensor::full({2, 3}, 1.5, DType::bf16));
  EXPECT_EQ(p.to(DType::f32).to_vector<float>(), std::vector<float>(6, 1.5f));
}

// A side stream and a stream mark (Note [Side streams]) on the CPU do nothing and wait for
// nothing; a side stream on a GPU this process cannot use is refused naming it.
TEST(HostSyncs, ASideStreamOnTheCpuIsNothing) {
  EXPECT_EQ(syncs_of([&] {
              SideStream side(Device::cpu());
              const StreamMark m = StreamMark::here(Device::cpu());
              EXPECT_TRUE(m.empty());
              m.wait();
              side.synchronize();
            }),
            0);
  EXPECT_TRUE(StreamMark().empty());
  const Device beyond = Device::cuda(cuda_device_count());
  try {
    SideStream side(beyond);
    ADD_FAILURE() << "a side stream on " << beyond.str() << " was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(beyond.str()), std::string::npos) << e.what();
  }
}

// A staged upload (Note [Staged uploads]) moves a batch without the host waiting: on the
// CPU, take() hands the consumer the staged tensor itself; one tensor staged at a time.
TEST(HostSyncs, AStagedUploadMakesNone) {
  StagedUpload up(Device::cpu());
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  EXPECT_THROW(up.take([](const Tensor& t) { return t; }), Error);
  EXPECT_EQ(syncs_of([&] { up.stage(x); }), 0);
  EXPECT_TRUE(up.staged());
  EXPECT_THROW(up.stage(x), Error) << "a second stage before the first was taken";
  Tensor seen;
  Tensor got;
  EXPECT_EQ(syncs_of([&] { got = up.take([&](const Tensor& t) { return seen = t, fn::scale(t, 2.0); }); }), 0);
  EXPECT_FALSE(up.staged());
  EXPECT_EQ(seen.raw(), x.raw());
  EXPECT_EQ(got.to_vector<float>(), (std::vector<float>{2, 4, 6}));
}

// A training run's steady-state step (summary.json host_syncs_per_step) makes none: the
// batch is staged (Note [Staged uploads]) and the loss read behind the next step (Note
// [Deferred reads]); with --grad-clip the gradient norm too is computed, applied and read
// so, and with loss scaling the overflow flag and the scale (optim/loss_scaler.h).
TEST(HostSyncs, ATrainingStepStagesItsBatchAndDefersItsLoss) {
  for (double clip : {0.0, 1.0, 2.0}) {
    train::TrainConfig c;
    c.model = "resnet20";
    c.dataset = "synthetic";
    c.train_limit = 256;
    c.test_limit = 32;
    c.batch_size = 32;
    c.epochs = 1;
    c.threads = 2;
    c.grad_clip = clip > 0 ? 1.0 : 0.0;
    // The third run with loss scaling, its flag, skip and update decided on the device too.
    if (clip == 2.0) c.loss_scale = {true, 1024, 4};
    c.out = eg::testing::fresh_dir("host_syncs_" + std::to_string(int(clip)));
    c.log_every = 1000;  // a log step reads its own loss
    train::run_training(c);
    const auto sj = nlohmann::json::parse(eg::testing::slurp(c.out + "/summary.json"));
    EXPECT_EQ(sj.at("host_syncs_per_step"), 0)
        << "--grad-clip " << c.grad_clip << (clip == 2.0 ? ", loss scaling" : "");
    if (clip == 2.0) {
      EXPECT_EQ(sj.at("loss_scale_final"), 1024 * 2 * 2) << "8 clean steps, doubled every 4";
    }
  }
}

// `egeria train --cuda-graphs on` is refused, naming what stands in its way, before any
// step: the CPU, the activation cache (the batch on the host), a translation task (batch
// shapes change). Training with it runs in Cuda.ATrainingRunWithCudaGraphsTrainsAsWithout.
TEST(HostSyncs, TrainingWithCudaGraphsIsRefusedWhereItCannotCapture) {
  train::TrainConfig c = eg::testing::small_image_run(eg::testing::fresh_dir("graphs_refused"));
  c.cuda_graphs = true;
  std::string e = eg::testing::error_of([&] { train::run_training(c); });
  EXPECT_NE(e.find("--cuda-graphs on runs on a GPU"), std::string::npos) << e;
  c.freezing.policy = "egeria";
  c.freezing.cache = true;
  c.freezing.bn = train::FrozenBn::running;
  c.augment_mode = train::AugmentMode::sample;
  e = eg::testing::error_of([&] { train::run_training(c); });
  EXPECT_NE(e.find("--freeze-cache on keeps the batch on the host"), std::string::npos) << e;
}

}  // namespace
}  // namespace eg
