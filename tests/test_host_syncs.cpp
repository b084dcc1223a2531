// Host syncs (Note [Host syncs] in core/device.h): which Tensor calls count, and how many a
// training step makes. A GPU run makes the same calls, each a point where the GPU waits
// for the host; the counts here are the ones to bring down (a step that never waits).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
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
// masks are made on the device.
TEST(HostSyncs, ABenchmarkStepMakesNone) {
  auto local = dist::make_local();
  for (const char* model : {"resnet20", "transformer-tiny"}) {
    train::StepBenchOptions o;
    o.model = model;
    o.batch_size = 4;
    o.seq_len = 6;
    o.iterations = 2;
    o.threads = 1;
    EXPECT_EQ(train::bench_step(o, *local).host_syncs_per_step, 0) << model;
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
// step ends (Note [Deferred reads]).
TEST(HostSyncs, SteadyStateStepsRunTheSameOpsAndAllocateNothingNew) {
  auto local = dist::make_local();
  for (DType precision : {DType::f32, DType::bf16}) {
    models::ModelConfig mc;
    mc.name = "resnet20";
    mc.image_size = 32;
    mc.small_input = true;
    mc.num_classes = 10;
    Generator g(3);
    auto m = models::build_model(mc, g);
    optim::SGD opt(m->parameters(), 0.05, {0.9, 0, 5e-4, false});
    dist::Strategy dp(*local, "cpu", {});
    const Tensor x = Tensor::randn({8, 3, 32, 32}, g);
    const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
    expect_replayable_steps(std::string("resnet20 ") + dtype_name(precision), [&](int64_t i) {
      opt.set_lr(0.05 / double(1 + i));  // a schedule: the value moves, the launches do not
      Tensor loss;
      {
        autograd::Autocast ac(precision);
        loss = fn::cross_entropy(m->forward(x), y);
      }
      const dist::StepResult r = dp.step(loss, 8, opt, i, 0);
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
