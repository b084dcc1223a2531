// CUDA runtime pieces: the caching allocator, copies, and device-independent RNG; the
// f16 convolution and GEMM of the fp16 reference; the GPU reference model.
// Every test skips without a GPU; tools/gpu-check runs them on one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/functions.h"
#include "core/caching_allocator.h"
#include "core/deferred_read.h"
#include "core/device_graph.h"
#include "core/rng.h"
#include "core/staged_upload.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/grad_sync.h"
#include "dist/strategy.h"
#include "freeze/controller.h"
#include "freeze/plasticity.h"
#include "kernels/ops.h"
#include "layers/layers.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "quant/reference.h"
#include "tests/test_util.h"
#include "train/graphed_step.h"
#include "train/trainer.h"

using namespace eg;

#define EG_REQUIRE_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no GPU present"

TEST(Cuda, CachingAllocatorReusesBlocksAndTracksStats) {
  EG_REQUIRE_GPU();
  Allocator& a = cuda_allocator(0);
  a.empty_cache();
  AllocatorStats s0 = a.stats();
  const size_t n = (8u << 20) + 100;
  void* p = a.allocate(n);
  AllocatorStats s1 = a.stats();
  EXPECT_EQ(s1.allocated, s0.allocated + allocation_size_class(n));
  EXPECT_GE(s1.peak_allocated, s1.allocated);
  EXPECT_EQ(s1.system_allocs, s0.system_allocs + 1);
  a.deallocate(p, n);
  EXPECT_EQ(a.stats().allocated, s0.allocated);
  void* q = a.allocate(n);  // same stream, same size class: served from the cache
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().cache_hits, s1.cache_hits + 1);
  a.deallocate(q, n);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, a.stats().allocated);
}

// Note [Caching allocators] on the device: steps whose shapes change, with real cudaMalloc,
// cudaFree and device tensors among the requests, stay within the cache limit (1.5x the
// peak in use unless EG_ALLOC_CACHE_LIMIT says otherwise) and mostly hit the cache. (The policy's order of eviction and its stream keys are tested on
// the CPU, CoreAllocator.*; a missing sync before an eviction would not show here, as the
// copies back to the host synchronise each step.)
TEST(Cuda, ChangingShapesStayWithinTheCacheLimit) {
  EG_REQUIRE_GPU();
  Allocator& a = cuda_allocator(0);
  const double limit = dynamic_cast<CachingAllocator&>(a).cache_limit();
  const double bound = limit > 0 ? limit : std::numeric_limits<double>::infinity();  // 0: no bound
  a.empty_cache();
  a.reset_peak();
  const AllocatorStats s0 = a.stats();
  std::vector<size_t> lengths;
  for (size_t t = 20; t <= 120; ++t) lengths.push_back(t);
  std::vector<size_t> shuffled = lengths;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(1));
  lengths.insert(lengths.end(), shuffled.begin(), shuffled.end());
  size_t requests = 0;
  Generator g(3);
  for (size_t t : lengths) {
    std::vector<std::pair<void*, size_t>> live;
    for (size_t k : {1, 4, 8}) live.emplace_back(a.allocate(t * k * 65536), t * k * 65536);
    Tensor h = Tensor::randn({int64_t(t), 1024}, g);
    Tensor d = h.to(Device::cuda(0)).clone();
    requests += live.size() + 2;
    for (auto& [p, n] : live) a.deallocate(p, n);
    ASSERT_EQ(d.to(Device::cpu()).to_vector<float>(), h.to_vector<float>()) << t;
    ASSERT_LE(double(a.stats().reserved), bound * double(a.stats().peak_allocated));
  }
  const AllocatorStats s1 = a.stats();
  EXPECT_GE(double(s1.cache_hits - s0.cache_hits), 0.8 * double(requests));
  EXPECT_LE(double(s1.peak_reserved), bound * double(s1.peak_allocated));
  a.empty_cache();
}

TEST(Cuda, RoundTripAndZeroing) {
  EG_REQUIRE_GPU();
  Generator g(1);
  Tensor h = Tensor::randn({3, 5, 7}, g);
  Tensor d = h.to(Device::cuda(0));
  EXPECT_TRUE(d.is_cuda());
  EXPECT_EQ(d.to(Device::cpu()).to_vector<float>(), h.to_vector<float>());
  d.zero_();
  for (float v : d.to_vector<float>()) EXPECT_EQ(v, 0.f);
  Tensor c = d.clone();
  EXPECT_TRUE(c.is_cuda());
}

// A class index outside the logits' columns, not checked on the host for device targets,
// makes the loss NaN (which stops a training run) instead of reading another row.
TEST(Cuda, ACrossEntropyTargetOutsideTheClassesGivesANaNLoss) {
  EG_REQUIRE_GPU();
  Generator g(2);
  const Tensor logits = Tensor::randn({4, 5}, g).to(Device::cuda(0));
  for (const int64_t bad : {int64_t(5), int64_t(-2)}) {
    const Tensor target = Tensor::from_vector<int64_t>({0, bad, 4, 2}, {4}).to(Device::cuda(0));
    EXPECT_TRUE(std::isnan(fn::cross_entropy(logits, target).item())) << bad;
  }
  const Tensor fine = Tensor::from_vector<int64_t>({0, 1, 4, 2}, {4});
  EXPECT_NEAR(fn::cross_entropy(logits, fine.to(Device::cuda(0))).item(),
              fn::cross_entropy(logits.to(Device::cpu()), fine).item(), 1e-5);
  // -100, the ignored index, is not out of range.
  const Tensor ignored = Tensor::from_vector<int64_t>({0, -100, 4, 2}, {4}).to(Device::cuda(0));
  EXPECT_TRUE(std::isfinite(fn::cross_entropy(logits, ignored).item()));
}

// A parameter moved by Module::to() takes its optimizer state along (the state made on
// the CPU would otherwise be read through host pointers by the CUDA kernels, and back).
TEST(Cuda, OptimizerStateFollowsItsParameterToAnotherDevice) {
  EG_REQUIRE_GPU();
  for (const bool adamw : {false, true}) {
    Generator g1(3), g2(3);
    nn::Linear moved(4, 3, true, g1), stays(4, 3, true, g2);
    auto make = [&](nn::Linear& l) -> std::unique_ptr<optim::Optimizer> {
      if (adamw)
        return std::make_unique<optim::AdamW>(l.parameters(), 0.01, optim::AdamWOptions{0.9, 0.999, 1e-8, 0.1});
      return std::make_unique<optim::SGD>(l.parameters(), 0.1, optim::SgdOptions{0.9, 0.0, 0.01, false});
    };
    auto opt_moved = make(moved), opt_stays = make(stays);
    auto step = [](nn::Linear& l, optim::Optimizer& opt, int k) {
      for (Tensor p : l.parameters()) {
        Tensor grad = Tensor::full(p.shape(), 0.25 * (k + 1), DType::f32);
        p.set_grad(grad.to(p.device()));
      }
      opt.step();
    };
    for (int k = 0; k < 3; ++k) {
      if (k == 1) moved.to(Device::cuda(0));  // after a step made the state on the CPU
      if (k == 2) moved.to(Device::cpu());  // and back
      step(moved, *opt_moved, k);
      step(stays, *opt_stays, k);
      // The state itself moved (a GPU that reads host memory would train right without).
      const Tensor state = opt_moved->state_dict().at(adamw ? "0.exp_avg" : "0.momentum");
      EXPECT_EQ(state.device(), moved.weight.device()) << (adamw ? "AdamW" : "SGD") << " step " << k;
    }
    const std::vector<float> a = moved.weight.to_vector<float>(), b = stays.weight.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-6) << (adamw ? "AdamW " : "SGD ") << i;
  }
}

// Note [Deferred reads] on a GPU: the value lands in a pinned slot behind the kernels
// that make it; value() waits for it (a host sync, counted only if it had to wait), a
// lagged read is never counted; slots are reused once their copies have landed.
TEST(Cuda, ADeferredScalarLandsBehindItsKernels) {
  EG_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const Device prev = set_training_device(dev);
  for (int round = 0; round < 3; ++round) {  // the second and third take the first's slots again
    Tensor x = Tensor::full({1}, 1.5 + round, DType::f32, dev);
    Generator g(static_cast<uint64_t>(round));
    Tensor big = Tensor::randn({1 << 22}, g).to(dev);
    ops::call(ops::scale, big, big, 2.0);  // queued work before the copy
    const DeferredScalar d = DeferredScalar::of(x);
    const Tensor f64 = Tensor::full({}, 0.5 + round, DType::f64).to(dev);
    const DeferredScalar h = DeferredScalar::of(f64);
    x.zero_();  // after the copy: not in the value
    const int64_t s0 = host_syncs();
    EXPECT_EQ(d.lagged_value(), 1.5 + round);
    EXPECT_EQ(host_syncs(), s0) << "a lagged read is not counted";
    EXPECT_TRUE(d.landed());
    EXPECT_EQ(h.value(), 0.5 + round);
    EXPECT_LE(host_syncs() - s0, 1);
  }
  set_training_device(prev);
}

// Staged batches of changing shapes (translation's) land whole through the slots' reused
// and grown device blocks (Note [Staged uploads]): each batch taken is its host batch,
// behind queued work and past a batch dropped untaken, as an untrained one is.
TEST(Cuda, AStagedUploadMovesBatchesOfChangingShapes) {
  EG_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const Device prev = set_training_device(dev);
  StagedUpload up(dev);
  const std::vector<Shape> shapes = {{4, 6}, {3, 9}, {8, 7}, {2, 3}, {8, 9}, {1, 1}, {5, 7}, {9, 9}};
  std::vector<std::vector<int64_t>> want;
  std::vector<Shape> want_shapes;
  std::vector<Tensor> got;
  Generator g(1);
  Tensor busy = Tensor::randn({1 << 22}, g).to(dev);
  int64_t next = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<int64_t> v(size_t(shape_numel(shapes[i])));
    for (auto& e : v) e = next++;
    for (int k = 0; k < 20; ++k) ops::call(ops::scale, busy, busy, 1.0);  // the step before, still running
    up.stage(Tensor::from_vector(v, shapes[i]));
    if (i == 3) {
      (void)up.take([](const Tensor&) { return Tensor(); });
      continue;
    }
    got.push_back(up.take([](const Tensor& t) { return t.clone(); }));
    want.push_back(v);
    want_shapes.push_back(shapes[i]);
  }
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_EQ(got[k].shape(), want_shapes[k]) << "batch " << k;
    EXPECT_EQ(got[k].to(Device::cpu()).to_vector<int64_t>(), want[k]) << "batch " << k;
  }
  set_training_device(prev);
}

// A HostCopy leaves the GPU behind the kernels that write its tensor, without the host
// waiting (no sync counted when it is made), in plain layout from an NHWC tensor; one
// dropped before it lands waits for its copy, so its pinned block is not reused early.
TEST(Cuda, AHostCopyLandsBehindItsKernelsWithoutAHostSync) {
  EG_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const Device prev = set_training_device(dev);
  for (int round = 0; round < 3; ++round) {
    Generator g(static_cast<uint64_t>(round));
    const Tensor host = Tensor::randn({4, 16, 5, 6}, g);
    Tensor x = host.to(dev);
    Tensor big = Tensor::randn({1 << 22}, g).to(dev);
    ops::call(ops::scale, big, big, 2.0);  // queued work before the copy
    ops::call(ops::scale, x, x, 2.0);
    const int64_t s0 = host_syncs();
    const HostCopy c = HostCopy::of(x);
    const HostCopy nhwc = HostCopy::of(x.to_format(Format::nhwc));
    (void)HostCopy::of(big);  // dropped at once
    EXPECT_EQ(host_syncs(), s0) << "making a host copy waited for the GPU";
    x.zero_();  // after the copy: not in it
    std::vector<float> want = host.to_vector<float>();
    for (float& v : want) v *= 2;
    EXPECT_TRUE(c.get().device().is_cpu());
    EXPECT_EQ(c.get().to_vector<float>(), want);
    EXPECT_EQ(nhwc.get().format(), Format::plain);
    EXPECT_EQ(nhwc.get().to_vector<float>(), want);
  }
  set_training_device(prev);
}

TEST(Cuda, DropoutMaskEqualsTheCpuMask) {
  EG_REQUIRE_GPU();
  Tensor x = Tensor::ones({1000});
  Tensor y = Tensor::empty({1000}), m = Tensor::empty({1000}, DType::u8);
  ops::run(ops::dropout_fwd, ops::Backend::cpu, x, y, m, 0.3, Tensor::from_vector(std::vector<int64_t>{42, 0}, {2}), 7);
  Tensor xd = x.to(Device::cuda(0)), yd = Tensor::empty({1000}, DType::f32, Device::cuda(0)),
         md = Tensor::empty({1000}, DType::u8, Device::cuda(0));
  // Counter 7 again, as a base of 3 read on the GPU and 4 past it.
  ops::run(ops::dropout_fwd, ops::Backend::cuda, xd, yd, md, 0.3,
           Tensor::from_vector(std::vector<int64_t>{42, 3}, {2}, Device::cuda(0)), 4);
  EXPECT_EQ(md.to_vector<uint8_t>(), m.to_vector<uint8_t>());
}

TEST(Cuda, OutOfMemoryIsAClearError) {
  EG_REQUIRE_GPU();
  try {
    Tensor::empty({int64_t(1) << 42}, DType::f32, Device::cuda(0));  // 16 TiB
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA out of memory"), std::string::npos) << e.what();
  }
}

TEST(Cuda, Tf32ConvolutionIsOptInAndStaysClose) {
  // ResNet-56's first-stage shape: exact f32 by default, within TF32's ~1e-3 when asked.
  EG_REQUIRE_GPU();
  Generator g(5);
  Tensor x = Tensor::randn({32, 16, 32, 32}, g), w = Tensor::randn({16, 16, 3, 3}, g);
  ops::Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  Tensor ref = Tensor::empty({32, 16, 32, 32});
  ops::run(ops::conv2d_fwd, ops::Backend::ref, x, w, Tensor(), ref, p);
  const Device d = Device::cuda(0);
  auto worst = [&](bool tf32) {
    set_allow_tf32(tf32);
    Tensor y = Tensor::empty({32, 16, 32, 32}, DType::f32, d);
    ops::run(ops::conv2d_fwd, ops::Backend::cuda, x.to(d), w.to(d), Tensor(), y, p);
    set_allow_tf32(false);
    std::vector<float> a = y.to(Device::cpu()).to_vector<float>(), b = ref.to_vector<float>();
    double e = 0;
    for (size_t i = 0; i < a.size(); ++i) e = std::max(e, double(std::fabs(a[i] - b[i])));
    return e;  // outputs are ~N(0, 144): compare with their scale of ~12
  };
  EXPECT_FALSE(allow_tf32());
  EXPECT_LT(worst(false), 1e-3);
  const double tf32 = worst(true);
  EXPECT_LT(tf32, 0.2);
}

// The f16 forward of conv2d (cuDNN, f32 accumulation) against the f32 ground truth on
// the same inputs rounded to f16: what remains is the output's rounding to f16, twice
// (after the convolution, before the bias is added, and after), and accumulation order:
// at most ~2^-11 of the largest output, so the bound is 2e-3 of it (a wrong layout or
// dtype errs by the output's own scale).
namespace {
Tensor rounded_to_f16(const Tensor& x) { return x.to(DType::f16).to(DType::f32); }
double worst_excess(const Tensor& got, const Tensor& want, double atol, double rtol) {
  const auto a = got.to_vector<float>(), b = want.to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / (atol + rtol * std::fabs(double(b[i]))));
  return worst;  // <= 1 passes
}
}  // namespace

TEST(Cuda, HalfConvolutionMatchesF32OnTheRoundedInputs) {
  EG_REQUIRE_GPU();
  struct Case {
    Shape x, w;
    int64_t stride, pad, groups;
  };
  // ResNet's 3x3 layers and stride-2 transition, a 1x1 projection, a depthwise layer.
  for (const Case& c : {Case{{8, 16, 16, 16}, {16, 16, 3, 3}, 1, 1, 1}, Case{{8, 16, 16, 16}, {32, 16, 3, 3}, 2, 1, 1},
                        Case{{4, 32, 8, 8}, {64, 32, 1, 1}, 2, 0, 1}, Case{{4, 32, 9, 9}, {32, 1, 3, 3}, 1, 1, 32}}) {
    Generator g(7);
    ops::Conv2dParams p;
    p.stride_h = p.stride_w = c.stride;
    p.pad_h = p.pad_w = c.pad;
    p.groups = c.groups;
    const double fan_in = double(c.w[1] * c.w[2] * c.w[3]);
    Tensor x = rounded_to_f16(Tensor::randn(c.x, g)), b = rounded_to_f16(Tensor::randn({c.w[0]}, g));
    Tensor w = rounded_to_f16(Tensor::randn(c.w, g));
    {
      float* wp = w.data<float>();  // weights ~ 1/sqrt(fan_in), as initialisers make them
      for (int64_t i = 0; i < w.numel(); ++i) wp[i] = float(wp[i] / std::sqrt(fan_in));
      w = rounded_to_f16(w);
    }
    const Shape ys = ops::conv2d_out_shape(c.x, c.w, p);
    Tensor want = Tensor::empty(ys);
    ops::run(ops::conv2d_fwd, ops::Backend::ref, x, w, b, want, p);
    const Device d = Device::cuda(0);
    Tensor y = Tensor::empty(ys, DType::f16, d);
    ops::call(ops::conv2d_fwd, x.to(DType::f16).to(d), w.to(DType::f16).to(d), b.to(DType::f16).to(d), y, p);
    double scale = 0;
    for (float v : want.to_vector<float>()) scale = std::max(scale, double(std::fabs(v)));
    EXPECT_LE(worst_excess(y.to(Device::cpu()).to(DType::f32), want, 2e-3 * scale, 2e-3), 1.0)
        << shape_str(c.x) << " * " << shape_str(c.w);
  }
  // Mixed dtypes are an error naming them, not garbage.
  const Device d = Device::cuda(0);
  Tensor x = Tensor::zeros({1, 4, 4, 4}, DType::f16, d), w = Tensor::zeros({4, 4, 3, 3}, DType::f32, d);
  Tensor y = Tensor::empty({1, 4, 2, 2}, DType::f16, d);
  EXPECT_THROW(ops::call(ops::conv2d_fwd, x, w, Tensor(), y, ops::Conv2dParams{}), Error);
}

// f16 operands with an f32 output (the fp16 reference's linear layers) or an f16 one,
// batched and transposed, against the f32 ground truth on the rounded operands.
TEST(Cuda, HalfGemmMatchesF32OnTheRoundedInputs) {
  EG_REQUIRE_GPU();
  Generator g(8);
  const Device d = Device::cuda(0);
  auto h = [d](const Tensor& t) { return t.to(DType::f16).to(d); };
  Tensor x = rounded_to_f16(Tensor::randn({37, 96}, g)), w = rounded_to_f16(Tensor::randn({50, 96}, g));
  Tensor b = Tensor::randn({50}, g);
  Tensor want = Tensor::empty({37, 50});
  ops::run(ops::linear_fwd, ops::Backend::ref, x, w, b, want);
  Tensor y = Tensor::empty({37, 50}, DType::f32, d);
  ops::call(ops::linear_fwd, h(x), h(w), b.to(d), y);
  // f32 output: only the accumulation order differs (outputs ~ sqrt(96) ~ 10).
  EXPECT_LE(worst_excess(y.to(Device::cpu()), want, 1e-4, 1e-5), 1.0);

  for (bool t : {false, true}) {  // a [3,24,40] b [3,40,24], or both transposed
    Tensor a = rounded_to_f16(Tensor::randn(t ? Shape{3, 40, 24} : Shape{3, 24, 40}, g));
    Tensor bb = rounded_to_f16(Tensor::randn(t ? Shape{3, 24, 40} : Shape{3, 40, 24}, g));
    Tensor want2 = Tensor::empty({3, 24, 24}), y2 = Tensor::empty({3, 24, 24}, DType::f16, d);
    ops::run(ops::gemm, ops::Backend::ref, a, bb, want2, t, t, 1.0, 0.0);
    ops::call(ops::gemm, h(a), h(bb), y2, t, t, 1.0, 0.0);
    EXPECT_LE(worst_excess(y2.to(Device::cpu()).to(DType::f32), want2, 1e-2, 1e-3), 1.0) << "transposed " << t;
  }
}

// The GPU fallback of the reference model ("fp32-gpu"): the same activations as the
// CPU fp32 reference, and Egeria runs on the GPU that use it and its fp16 version
// (whose accuracy tests/test_quant.cpp checks).
TEST(Cuda, GpuReferenceModelMatchesTheCpuOneAndTrains) {
  EG_REQUIRE_GPU();
  models::ModelConfig mc;
  mc.name = "resnet20";
  mc.in_channels = 1;
  mc.image_size = 16;
  Generator g(2);
  auto m = models::build_model(mc, g);
  auto cpu = quant::make_reference("fp32", mc, m->state_dict());
  auto gpu = quant::make_reference("fp32-gpu", quant::model_factory(mc), m->state_dict(), Device::cuda(0));
  EXPECT_EQ(gpu->precision(), "fp32-gpu");
  Tensor x = Tensor::randn({16, 1, 16, 16}, g);
  for (int64_t k : {0, 4, 9}) {
    Tensor a = cpu->activation(x, k), b = gpu->activation(x, k).to(Device::cpu());
    EXPECT_LT(freeze::sp_loss(a, b), 1e-9) << "module " << k;
  }
  // Inline, on the reference thread's side stream, and there beside a graphed step.
  enum Mode { inline_, background, graphed };
  for (const char* precision : {"fp32-gpu", "fp16-gpu"})
    for (Mode mode : {inline_, background, graphed}) {
      train::TrainConfig c = eg::testing::small_image_run("");
      c.epochs = 2;
      c.device = "cuda:0";
      c.out = std::string("/tmp/eg_cuda_gpu_reference_") + precision + "_" + std::to_string(int(mode));
      c.cuda_graphs = mode == graphed;
      const bool background = mode != inline_;
      c.freezing.policy = "egeria";
      c.freezing.reference.precision = precision;
      c.freezing.reference.synchronous = !background;
      c.freezing.tracker.interval = 2;
      c.freezing.tracker.bootstrap_interval = -1;  // every n, the paper
      c.freezing.tracker.window = 2;
      auto s = train::run_training(c);
      ASSERT_TRUE(s.completed) << precision;
      auto sum = nlohmann::json::parse(std::ifstream(c.out + "/summary.json"));
      EXPECT_GT(sum["freeze_stats"]["evaluations_completed"].get<int64_t>(), 0) << precision << " " << int(mode);
      EXPECT_EQ(sum["freeze_stats"]["evaluations_dropped"].get<int64_t>(), 0) << precision << " " << int(mode);
      EXPECT_EQ(sum["freeze_stats"]["reference_gpu_seconds"].get<double>() > 0, background) << precision;
      if (mode == graphed) {
        EXPECT_GT(sum["cuda_graph_captures"].get<int64_t>(), 0) << precision;
      }
    }
}

// A GPU reference in the background (Note [Side streams] in core/side_stream.h): the
// reference thread runs it on a side stream after a mark of the training stream, so its
// reading is the inline reading's, though the unit's input is written by a copy queued
// behind ~100 ms of other kernels, dropped by the training thread at once, and its block
// asked for again and overwritten; and submitting makes no host sync of the training
// thread (inline, the reading waits for the GPU there). A first reading warms the
// controller (the reference built, the stream and its handles made), so the second's
// forward is queued while the products still run; its training output is on the host,
// so nothing but the mark orders the side stream behind the copy.
TEST(Cuda, AGpuReferenceOnItsSideStreamReadsWhatTheInlineOneReads) {
  EG_REQUIRE_GPU();
  const Device d = Device::cuda(0);
  models::ModelConfig mc;
  mc.name = "resnet20";
  mc.in_channels = 1;
  mc.image_size = 16;
  Generator g(2);
  auto m = models::build_model(mc, g), moved = models::build_model(mc, g);
  auto snap = std::make_shared<freeze::Snapshot>(m->state_dict());
  moved->to(d);
  moved->eval();
  Tensor x = Tensor::randn({16, 1, 16, 16}, g);
  const int64_t begin = 2, last = 4;
  Tensor h, out;
  {
    autograd::NoGradGuard ng;
    h = moved->layer_output(x.to(d), Tensor(), begin - 1);
    out = moved->layer_output(x.to(d), Tensor(), last).to(Device::cpu());
  }
  Tensor busy = Tensor::randn({2048, 2048}, g).to(d), busy_out = Tensor::empty({2048, 2048}, DType::f32, d);
  for (const char* precision : {"fp32-gpu", "fp16-gpu"}) {
    double reading[2] = {0, 0};
    int64_t syncs[2] = {0, 0};
    for (int background = 0; background < 2; ++background) {
      freeze::ControllerOptions o;
      o.precision = precision;
      o.gpu = d;
      o.synchronous = background == 0;
      freeze::PlasticityController ctl(mc, o);
      ctl.set_snapshot(snap);
      ASSERT_TRUE(ctl.submit(0, last, x, out, Tensor(), h, begin)) << precision;
      ctl.drain();
      ASSERT_EQ(ctl.poll().size(), 1u) << precision << " " << ctl.first_error();
      {
        Tensor late = Tensor::zeros(h.shape(), DType::f32, d);
        for (int i = 0; i < 300; ++i) ops::call(ops::gemm, busy, busy, busy_out, false, false, 1.0, 0.0);
        late.copy_(h);  // queued behind the products
        const int64_t s0 = host_syncs();
        ASSERT_TRUE(ctl.submit(1, last, x, out, Tensor(), late, begin)) << precision;
        syncs[background] = host_syncs() - s0;
      }
      Tensor garbage = Tensor::full(h.shape(), 1e6, DType::f32, d);  // the dropped input's block, if it were free
      ctl.drain();
      const auto r = ctl.poll();
      ASSERT_EQ(r.size(), 1u) << precision << " " << ctl.first_error();
      reading[background] = r[0].plasticity;
      if (background) {
        EXPECT_GT(ctl.reference_gpu_seconds(), 0) << precision;
      }
    }
    EXPECT_GT(reading[0], 0) << precision;
    // Not bit-equal: the Gram kernel adds its partial sums with atomics.
    EXPECT_NEAR(reading[1], reading[0], 1e-4 * reading[0]) << precision;
    EXPECT_GT(syncs[0], 0) << precision << ": the inline reading waits for the GPU";
    EXPECT_EQ(syncs[1], 0) << precision;
  }
}

// NCCL with one rank (the only GPU a machine here lends): the communicator all-reduces
// and broadcasts CUDA tensors, and a ResNet-20 step whose gradient buckets go through
// the overlapped sync matches the step without it (a sum over one rank is the identity).
// Several GPUs are needed to see a real reduction; the CPU ranks' tests cover the sums.
TEST(Cuda, NcclOneRankGradientSyncMatchesTheUnsyncedStep) {
  EG_REQUIRE_GPU();
  auto host = dist::make_local();
  auto nccl = dist::make_nccl(*host, Device::cuda(0));
  EXPECT_EQ(nccl->backend(), "nccl");
  EXPECT_TRUE(nccl->enqueues());
  Tensor v = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}).to(Device::cuda(0));
  nccl->all_reduce(v);
  nccl->broadcast(v, 0);
  EXPECT_EQ(v.to(Device::cpu()).to_vector<float>(), (std::vector<float>{1, 2, 3}));

  models::ModelConfig mc;
  mc.name = "resnet20";
  mc.image_size = 16;
  std::vector<std::vector<float>> after;
  std::vector<float> before;
  enum Sync { none, f32, bf16 };  // bf16: the buckets rounded to bf16 on the wire (--grad-sync-dtype)
  for (Sync synced : {none, f32, bf16}) {
    Generator g(3);
    auto m = models::build_model(mc, g);
    m->to(Device::cuda(0));
    optim::SGD opt(m->parameters(), 0.1, {0.9, 0, 0, false});
    opt.set_bucket_caps(size_t(64) << 10, size_t(16) << 10);  // several buckets
    Generator d(4);
    Tensor x = Tensor::randn({8, 3, 16, 16}, d).to(Device::cuda(0));
    Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8}).to(Device::cuda(0));
    Tensor loss = fn::cross_entropy(m->forward(x), y);
    opt.zero_grad();
    if (synced != none) {
      dist::GradSync sync(*nccl, {true, synced == bf16 ? DType::bf16 : DType::f32});
      sync.begin(opt.grad_buckets(), opt.params());
      sync.backward(loss);
      sync.finish();
      EXPECT_GT(sync.stats().buckets_launched_in_backward, 1);
      EXPECT_EQ(sync.stats().last_step_bytes * (synced == bf16 ? 2 : 1), int64_t(opt.grad_buckets().bytes()));
    } else {
      loss.backward();
    }
    const auto weights = [&] {
      std::vector<float> w;
      for (auto& p : m->parameters())
        for (float f : p.to(Device::cpu()).to_vector<float>()) w.push_back(f);
      return w;
    };
    if (synced == none) before = weights();
    opt.step();
    after.push_back(weights());
  }
  // Not bit-equal: two identical steps on a GPU can differ in the last bits (cuDNN may
  // pick backward algorithms that add with atomics; on an H100, weights 1e-8 apart). A
  // sync that reduced wrongly (twice, or the wrong bucket) moves weights by lr x grad,
  // some 1e-3; rounding a gradient to bf16 changes it by 2^-8 of itself at most, so each
  // weight's step (lr x grad: the first step's momentum is the gradient) by 2^-8 of that step.
  ASSERT_EQ(after[0].size(), after[1].size());
  for (size_t i = 0; i < after[0].size(); ++i) ASSERT_NEAR(after[0][i], after[1][i], 1e-6) << "weight " << i;
  for (size_t i = 0; i < after[0].size(); ++i)
    ASSERT_NEAR(after[0][i], after[2][i], std::abs(after[0][i] - before[i]) * 0x1p-8f + 1e-6f) << "bf16 weight " << i;
}

// --precision bf16 and fp16 on CUDA (Note [16-bit CUDA kernels]): one SGD step of
// ResNet-20 and of transformer-tiny under autocast on the GPU lands as close to the f32
// step on the GPU as the CPU's bf16 step (whose kernels the op table checks against ref)
// lands to the CPU's f32 step: the loss within 2%, the step taken (new weights less old,
// over all parameters) within twice the CPU's distance in L2, plus 3%. A kernel that
// misread 16-bit bytes as f32, or refused them, fails here. The distances are bf16's
// own: ResNet-20 at batch 8, through batch norm's backward, takes a step 21% (L2) from
// f32's on the CPU and on an H100 alike (f16: 6%); transformer-tiny 1.4%.
namespace {
struct StepResult {
  float loss = 0;
  std::vector<float> step;  // new weights less old, every parameter in order
};
StepResult one_step(const std::string& model, Device dev, DType precision) {
  models::ModelConfig mc;
  mc.name = model;
  const bool transformer = models::is_translation_model(model);
  mc.image_size = 16;
  mc.vocab = 256;
  Generator g(5);
  auto m = models::build_model(mc, g);
  m->to(dev);
  std::vector<float> before;
  for (auto& p : m->parameters())
    for (float f : p.to(Device::cpu()).to_vector<float>()) before.push_back(f);
  optim::SGD opt(m->parameters(), 0.1, {0.9, 0, 0, false});
  Generator d(6);
  const int64_t b = 8, t = 6;
  Tensor x, x2, y;
  if (transformer) {
    auto ids = [&] {
      std::vector<int64_t> v(size_t(b * t));
      for (auto& i : v) i = 4 + int64_t(d.next_u32() % 252);
      return v;
    };
    x = Tensor::from_vector(ids(), {b, t}).to(dev);
    x2 = Tensor::from_vector(ids(), {b, t}).to(dev);
    y = Tensor::from_vector(ids(), {b * t}).to(dev);
  } else {
    x = Tensor::randn({b, 3, 16, 16}, d).to(dev);
    y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {b}).to(dev);
  }
  Tensor loss;
  {
    autograd::Autocast ac(precision);
    Tensor logits = m->forward_frozen(x, x2, 0);
    loss = fn::cross_entropy(transformer ? fn::reshape(logits, {b * t, logits.size(2)}) : logits, y);
  }
  opt.zero_grad();
  loss.backward();
  opt.step();
  StepResult r;
  r.loss = loss.item();
  size_t k = 0;
  for (auto& p : m->parameters())
    for (float f : p.to(Device::cpu()).to_vector<float>()) r.step.push_back(f - before[k++]);
  return r;
}
double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += double(a[i] - b[i]) * (a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}
}  // namespace

TEST(Cuda, HalfStepsFollowTheF32StepAsTheCpuBf16StepDoes) {
  EG_REQUIRE_GPU();
  for (const char* model : {"resnet20", "transformer-tiny"}) {
    const StepResult gpu_f32 = one_step(model, Device::cuda(0), DType::f32);
    const StepResult cpu_f32 = one_step(model, Device::cpu(), DType::f32);
    const StepResult cpu = one_step(model, Device::cpu(), DType::bf16);
    const double bound = 2 * relative_l2(cpu.step, cpu_f32.step) + 0.03;
    for (DType low : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(model) + " " + dtype_name(low));
      const StepResult gpu = one_step(model, Device::cuda(0), low);
      ASSERT_TRUE(std::isfinite(gpu.loss));
      EXPECT_NEAR(gpu.loss, gpu_f32.loss, 0.02 * std::abs(gpu_f32.loss));
      ASSERT_EQ(gpu.step.size(), gpu_f32.step.size());
      EXPECT_LT(relative_l2(gpu.step, gpu_f32.step), bound);
    }
  }
}

// Note [Device graphs]: a capture runs nothing; each replay runs the captured kernels on
// the tensors they were captured with (an input rewritten between replays is read anew),
// and what the capture allocated stays the graph's (its pool) until the graph is gone.
TEST(Cuda, AGraphReplaysItsKernelsOnTheirTensors) {
  EG_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  Tensor in = Tensor::full({1000}, 1.0, DType::f32, dev);
  Tensor out = Tensor::zeros({1000}, DType::f32, dev);
  {
    DeviceGraph g(dev);
    g.capture([&] {
      Tensor t = fn::scale(in, 3.0);  // a temporary from the graph's pool
      ops::call(ops::binary_fwd, ops::Binary::add, t, in, out);
    });
    EXPECT_TRUE(g.captured());
    EXPECT_EQ(out.to_vector<float>()[7], 0.f) << "a capture runs nothing";
    EXPECT_GT(g.pool_bytes(), 0u);
    Tensor eager = Tensor::full({1000}, 5.0, DType::f32, dev);  // the temporary's size: not its block
    g.replay();
    EXPECT_EQ(out.to_vector<float>()[7], 4.f);
    EXPECT_EQ(eager.to_vector<float>()[7], 5.f) << "a replay wrote an eager tensor's block";
    in.copy_(Tensor::full({1000}, 2.0, DType::f32));
    g.replay();
    EXPECT_EQ(out.to_vector<float>()[999], 8.f);
    EXPECT_EQ(g.replays(), 2);
    DeviceGraph bad(dev);
    const std::string e = eg::testing::error_of([&] { bad.capture([&] { (void)out.item(); }); });
    EXPECT_NE(e.find("capturing a CUDA graph"), std::string::npos) << e << " (a host read inside a capture)";
    EXPECT_FALSE(bad.captured());
  }
  Tensor after = fn::scale(in, 1.0);  // the pools' blocks are the shared cache's again
  EXPECT_EQ(after.to_vector<float>()[0], 2.f);
}

// Note [Shared graph pools]: a second graph capturing the same work into the first's pool
// needs no new block; each replays its own kernels on its own outputs, in any order, and
// the pool outlives the graph that made it while another holds it.
TEST(Cuda, GraphsSharingAPoolTakeEachOthersTemporaries) {
  EG_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const int64_t n = int64_t(1) << 18;
  Tensor in = Tensor::full({n}, 1.0, DType::f32, dev);
  Tensor out[2] = {Tensor::zeros({1}, DType::f32, dev), Tensor::zeros({1}, DType::f32, dev)};
  auto body = [&](int k) {
    return [&, k] {
      Tensor t = fn::scale(in, k == 0 ? 3.0 : 5.0);  // temporaries from the pool
      Tensor u = fn::scale(t, 2.0);
      ops::call(ops::sum_to, u, out[k]);
    };
  };
  auto g1 = std::make_unique<DeviceGraph>(dev);
  g1->capture(body(0));
  const size_t one = g1->pool_bytes();
  EXPECT_GT(one, 0u);
  DeviceGraph g2(dev, g1->pool());
  g2.capture(body(1));
  EXPECT_EQ(g2.pool_bytes(), one) << "the second capture took the first's temporaries";
  const float fn_ = float(n);
  g1->replay();
  EXPECT_EQ(out[0].to_vector<float>()[0], 6 * fn_);
  g2.replay();
  EXPECT_EQ(out[1].to_vector<float>()[0], 10 * fn_);
  in.copy_(Tensor::full({n}, 2.0, DType::f32));
  g2.replay();
  g1->replay();
  EXPECT_EQ(out[0].to_vector<float>()[0], 12 * fn_);
  EXPECT_EQ(out[1].to_vector<float>()[0], 20 * fn_);
  g1.reset();  // g2 holds the pool
  EXPECT_EQ(g2.pool_bytes(), one);
  g2.replay();
  EXPECT_EQ(out[1].to_vector<float>()[0], 20 * fn_);
}

// Note [Graphed steps]: a step captured after its warm-up and replayed trains the weights
// an eager step trains (the same kernels on the same values): ResNet-20 with
// SGD and momentum under a changing learning rate, clipped; transformer-tiny with AdamW
// and dropout (its masks drawn from counters the host moves past each replay), bf16 too,
// and fp16 with loss scaling decided on the device (unscale, skip, the scale's update).
// The host's records end where the eager run's do (the generator, AdamW's step counts).
TEST(Cuda, AGraphedStepTrainsTheWeightsOfTheEagerStep) {
  EG_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const Device prev = set_training_device(dev);
  auto local = dist::make_local();
  for (const char* name : {"resnet20", "transformer-tiny"})
    for (DType precision : {DType::f32, DType::bf16, DType::f16}) {
      const bool tfm = std::string(name) == "transformer-tiny";
      std::vector<float> weights[2], losses[2], norms[2];
      uint64_t offsets[2] = {};
      std::map<std::string, Tensor> state[2];
      for (int graphed = 0; graphed < 2; ++graphed) {
        models::ModelConfig mc;
        mc.name = name;
        mc.image_size = 32;
        mc.small_input = true;
        mc.num_classes = 10;
        Generator g(3);
        auto m = models::build_model(mc, g);
        m->to(dev);
        std::unique_ptr<optim::Optimizer> opt;
        if (tfm) {
          opt = std::make_unique<optim::AdamW>(m->parameters(), 1e-3);
        } else {
          opt = std::make_unique<optim::SGD>(m->parameters(), 0.05, optim::SgdOptions{0.9, 0, 5e-4, false});
        }
        // fp16 with loss scaling decided on the device; a small growth interval, so the
        // replays double the scale (and a skip halves it) as the eager steps do.
        dist::Strategy dp(*local, "cuda:0", {}, optim::LossScaleOptions{precision == DType::f16, 1024, 2});
        Generator data(5);
        Tensor x, x2, y;
        int64_t samples = 8;
        if (tfm) {
          auto ids = [&](int64_t n) {
            std::vector<int64_t> v(static_cast<size_t>(n));
            for (auto& t : v) t = 4 + int64_t(data.next_u32() % uint32_t(mc.vocab - 4));
            return v;
          };
          x = Tensor::from_vector(ids(24), {4, 6}, dev), x2 = Tensor::from_vector(ids(24), {4, 6}, dev);
          y = Tensor::from_vector(ids(24), {24}, dev);
          samples = 24;
        } else {
          x = Tensor::randn({8, 3, 32, 32}, data).to(dev);
          y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8}, dev);
        }
        auto forward = [&] {
          autograd::Autocast ac(precision);
          Tensor logits = m->forward_frozen(x, x2, 0);
          return fn::cross_entropy(tfm ? fn::reshape(logits, {samples, logits.size(2)}) : logits, y);
        };
        train::GraphedStep gs(dp, *opt, &g, {2, 1.0, {}});
        for (int64_t i = 0; i < 7; ++i) {
          opt->set_lr((tfm ? 1e-3 : 0.05) / double(1 + i));
          dist::StepResult r;
          if (graphed) {
            r = gs.run({}, forward, samples);
          } else {
            g.mark_step();
            r = dp.step(forward(), samples, *opt, i, 1.0);
          }
          losses[graphed].push_back(float(r.loss_later.value()));
          norms[graphed].push_back(float(r.grad_norm_later.value()));
        }
        if (graphed) {
          EXPECT_EQ(gs.captures(), 1);
          EXPECT_EQ(gs.replays(), 5) << "7 steps, 2 eager";
          EXPECT_GT(gs.graph_bytes(), 0u);
        }
        for (auto& p : m->parameters())
          for (float v : p.to(Device::cpu()).to(DType::f32).to_vector<float>()) weights[graphed].push_back(v);
        offsets[graphed] = g.offset();
        state[graphed] = opt->state_dict();
      }
      // Within the order of atomic adds (the embedding's and some cuDNN gradients' sums
      // differ in their last bits from run to run): a stale learning rate, bias correction
      // or dropout mask moves the losses by percents. In 16 bits AdamW turns those last
      // bits into rounding-only steps of a whole lr (an H200 measured transformer-tiny's
      // graphed losses 0.02-0.09% and a norm 0.1% from the eager ones: docs/gpu.md).
      const std::string what = std::string(name) + " " + dtype_name(precision);
      const double loss_tol = precision == DType::f32 ? 1e-4 : 3e-3, norm_tol = precision == DType::f32 ? 1e-3 : 3e-3;
      ASSERT_EQ(losses[0].size(), losses[1].size());
      for (size_t i = 0; i < losses[0].size(); ++i)
        EXPECT_NEAR(losses[1][i], losses[0][i], loss_tol * std::abs(losses[0][i])) << what << " step " << i;
      for (size_t i = 0; i < norms[0].size(); ++i) {
        if (!std::isfinite(norms[0][i])) {  // an fp16 overflow's, skipped in both
          EXPECT_FALSE(std::isfinite(norms[1][i])) << what << " norm at step " << i;
          continue;
        }
        EXPECT_NEAR(norms[1][i], norms[0][i], norm_tol * std::abs(norms[0][i])) << what << " norm at step " << i;
      }
      ASSERT_EQ(weights[0].size(), weights[1].size());
      float worst = 0;
      for (size_t i = 0; i < weights[0].size(); ++i) worst = std::max(worst, std::abs(weights[1][i] - weights[0][i]));
      // AdamW takes a step of about lr wherever a gradient is 0 but for rounding (the
      // attention key biases': a softmax ignores what is added to a whole row of scores), and
      // the clipping norm's atomic sums differ in their last bits from run to run: its
      // weights are compared within twice the steps' learning rates (the losses and norms
      // above stay tight); SGD's within rounding.
      const float adamw_noise = 2 * 1e-3f * 2.6f;
      EXPECT_LE(worst, tfm ? adamw_noise : 1e-4f) << what;
      EXPECT_EQ(offsets[0], offsets[1]) << what << ": the generator moves past what each replay drew";
      ASSERT_EQ(state[0].size(), state[1].size()) << what;
      for (auto& [k, t] : state[0]) {
        if (k.find(".step") == std::string::npos) continue;
        EXPECT_EQ(t.to(Device::cpu()).to(DType::f64).to_vector<double>(),
                  state[1].at(k).to(Device::cpu()).to(DType::f64).to_vector<double>())
            << what << ": " << k;
      }
    }
  set_training_device(prev);
}

// Note [Graphed steps]: batches of three shapes (translation's padded lengths), a graph
// per shape and at most 2 held: the steps of a shape replay its graph from inputs written
// in place (train::GraphInput), a third shape runs eagerly until it has run more than
// twice as often as the least-used graph, which it replaces, and the run trains the weights of the
// eager one (AdamW, dropout; losses within the order of atomic adds).
TEST(Cuda, AGraphedStepKeepsAGraphPerBatchShape) {
  EG_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const Device prev = set_training_device(dev);
  auto local = dist::make_local();
  // Steps' shapes: [B, S, T] of 4 sentences.
  const std::vector<std::vector<int64_t>> shapes = {{4, 8, 8}, {4, 16, 8}, {4, 16, 16}};
  const int order[] = {0, 0, 0, 0, 1, 0, 1, 0, 1, 2, 2, 2, 2, 2, 2, 2, 0, 2, 1, 0, 2};
  std::vector<float> weights[2], losses[2];
  int64_t captures = 0, replayed = 0, held = 0;
  for (int graphed = 0; graphed < 2; ++graphed) {
    models::ModelConfig mc;
    mc.name = "transformer-tiny";
    Generator g(3);
    auto m = models::build_model(mc, g);
    m->to(dev);
    optim::AdamW opt(m->parameters(), 1e-3);
    dist::Strategy dp(*local, "cuda:0", {});
    train::GraphInput in[3];
    Tensor t[3];
    Generator data(5);
    auto forward = [&] {
      Tensor logits = m->forward_frozen(t[0], t[1], 0);
      const int64_t n = t[2].numel();
      return fn::cross_entropy(fn::reshape(logits, {n, logits.size(2)}), t[2].reshape({n}), 0.1, 0);
    };
    train::GraphedStep gs(dp, opt, &g, {2, 1.0, {}, 2});
    for (int64_t i = 0; i < int64_t(std::size(order)); ++i) {
      const std::vector<int64_t>& sh = shapes[size_t(order[i])];
      for (int k = 0; k < 3; ++k) {  // ids, the rows' last quarter padding (0)
        const int64_t len = sh[k == 0 ? 1 : 2];
        std::vector<int64_t> v(size_t(sh[0] * len));
        for (size_t j = 0; j < v.size(); ++j)
          v[j] = int64_t(j % size_t(len)) >= len * 3 / 4 ? 0 : 4 + int64_t(data.next_u32() % uint32_t(mc.vocab - 4));
        t[k] = in[k].place({sh[0], len}, DType::s64, dev, 4 * 16);
        t[k].copy_(Tensor::from_vector(v, {sh[0], len}));
      }
      opt.set_lr(1e-3 * double(1 + i % 3));
      const int64_t samples = sh[0] * sh[2] * 3 / 4;
      dist::StepResult r;
      if (graphed) {
        r = gs.run(sh, forward, samples);
      } else {
        g.mark_step();
        r = dp.step(forward(), samples, opt, i, 1.0);
      }
      losses[graphed].push_back(float(r.loss_later.value()));
    }
    if (graphed) captures = gs.captures(), replayed = gs.replayed_steps(), held = gs.graphs();
    for (auto& p : m->parameters())
      for (float v : p.to(Device::cpu()).to_vector<float>()) weights[graphed].push_back(v);
  }
  // Shape 0: 2 eager steps (the warm-up), captured at its 3rd; shape 1: eager, captured at
  // its 2nd; shape 2: eager until its 7th step (more than twice shape 1's 3), captured in
  // place of shape 1's graph; shape 1's last step eager: 3 captures, 10 eager steps, 8
  // replays.
  EXPECT_EQ(captures, 3);
  EXPECT_EQ(held, 2);
  EXPECT_EQ(replayed, 8);
  ASSERT_EQ(losses[0].size(), losses[1].size());
  for (size_t i = 0; i < losses[0].size(); ++i)
    EXPECT_NEAR(losses[1][i], losses[0][i], 1e-4 * std::abs(losses[0][i])) << "step " << i;
  ASSERT_EQ(weights[0].size(), weights[1].size());
  float worst = 0;
  for (size_t i = 0; i < weights[0].size(); ++i) worst = std::max(worst, std::abs(weights[1][i] - weights[0][i]));
  // AdamW steps by about lr where a gradient is 0 but for rounding (the attention key
  // biases'; see AGraphedStepTrainsTheWeightsOfTheEagerStep): within twice the 21 steps'
  // learning rates (2e-3 on average).
  EXPECT_LE(worst, 2 * 21 * 2e-3f);
  set_training_device(prev);
}

// fp16 with a loss scale far too large: the first steps overflow and are skipped, so the
// warm-up makes no SGD momentum buffer (their first step is host-launched and reads the
// overflow flag on the host, which a capture forbids). The graphed step warms up on
// (Optimizer::ready_to_capture), captures a later step, and trains the eager weights.
TEST(Cuda, AGraphedStepWarmsUpOnThroughOverflowingSteps) {
  EG_REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  const Device prev = set_training_device(dev);
  auto local = dist::make_local();
  // Runs 0 and 2 eager, run 1 graphed: the graphed weights are held to the eager runs'
  // own spread where cuDNN's algorithms make one (an H200 measured 7e-4: docs/gpu.md).
  std::vector<float> weights[3];
  int overflows[3] = {};
  for (int run = 0; run < 3; ++run) {
    const bool graphed = run == 1;
    models::ModelConfig mc;
    mc.name = "resnet20";
    mc.image_size = 32;
    mc.small_input = true;
    mc.num_classes = 10;
    Generator g(3);
    auto m = models::build_model(mc, g);
    m->to(dev);
    optim::SGD opt(m->parameters(), 0.05, optim::SgdOptions{0.9, 0, 5e-4, false});
    dist::Strategy dp(*local, "cuda:0", {}, optim::LossScaleOptions{true, double(int64_t(1) << 24), 1000});
    Generator data(5);
    const Tensor x = Tensor::randn({8, 3, 32, 32}, data).to(dev);
    const Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8}, dev);
    auto forward = [&] {
      autograd::Autocast ac(DType::f16);
      return fn::cross_entropy(m->forward_frozen(x, Tensor(), 0), y);
    };
    train::GraphedStep gs(dp, opt, &g, {2, 1.0, {}});
    for (int64_t i = 0; i < 16; ++i) {
      dist::StepResult r;
      if (graphed) {
        r = gs.run({}, forward, 8);
      } else {
        g.mark_step();
        r = dp.step(forward(), 8, opt, i, 1.0);
      }
      if (!std::isfinite(r.grad_norm_later.value())) ++overflows[run];
    }
    if (graphed) {
      EXPECT_EQ(gs.captures(), 1);
      EXPECT_GT(gs.replays(), 1) << "captured after the overflowing steps";
    }
    for (auto& p : m->parameters())
      for (float v : p.to(Device::cpu()).to(DType::f32).to_vector<float>()) weights[run].push_back(v);
  }
  EXPECT_GE(overflows[0], 2) << "the scale overflows through the 2-step warm-up";
  EXPECT_EQ(overflows[1], overflows[0]);
  EXPECT_EQ(overflows[2], overflows[0]);
  ASSERT_EQ(weights[0].size(), weights[1].size());
  ASSERT_EQ(weights[0].size(), weights[2].size());
  float worst = 0, spread = 0;
  for (size_t i = 0; i < weights[0].size(); ++i) {
    worst = std::max(worst, std::abs(weights[1][i] - weights[0][i]));
    spread = std::max(spread, std::abs(weights[2][i] - weights[0][i]));
  }
  EXPECT_LE(worst, std::max(1e-4f, 2 * spread)) << "the eager runs' own spread: " << spread;
  set_training_device(prev);
}

// `egeria train --cuda-graphs on` (Note [Graphed steps]): ResNet-20 with Egeria freezing
// on the GPU trains as without graphs (the same losses within the order of atomic adds),
// captures anew after each freeze and unfreeze, replays most steps, and makes no host
// sync in a steady-state step.
TEST(Cuda, ATrainingRunWithCudaGraphsTrainsAsWithout) {
  EG_REQUIRE_GPU();
  // Runs 0 and 2 without graphs, run 1 with: the graphed losses are held to the eager
  // runs' own spread where there is one (an H200's eager and graphed runs parted by 3% at
  // step 8 of a run whose losses jump: docs/gpu.md).
  nlohmann::json sj[3];
  std::vector<double> losses[3];
  for (int run = 0; run < 3; ++run) {
    const bool graphs = run == 1;
    // 4 epochs of 16 steps; half the layer modules freeze at epoch 3 (a new graph), the LR
    // falls at epoch 4 (the multi-tensor step reads it on the device).
    train::TrainConfig c = eg::testing::small_image_run(eg::testing::fresh_dir("cuda_graphs_" + std::to_string(run)));
    c.device = "cuda:0";
    c.threads = 1;
    c.freezing.policy = "static";
    c.cuda_graphs = graphs;
    c.log_every = 4;
    train::run_training(c);
    sj[run] = nlohmann::json::parse(eg::testing::slurp(c.out + "/summary.json"));
    std::ifstream m(c.out + "/metrics.jsonl");
    for (std::string line; std::getline(m, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.value("type", "") == "step") losses[run].push_back(j.at("loss").get<double>());
    }
  }
  ASSERT_EQ(losses[0].size(), losses[1].size());
  ASSERT_EQ(losses[0].size(), losses[2].size());
  ASSERT_FALSE(losses[0].empty());
  for (size_t i = 0; i < losses[0].size(); ++i) {
    const double spread = std::abs(losses[2][i] - losses[0][i]);
    EXPECT_NEAR(losses[1][i], losses[0][i], std::max(1e-3 * losses[0][i], 2 * spread))
        << "logged step " << i << "; the eager runs' own spread " << spread;
  }
  EXPECT_GE(sj[1].at("cuda_graph_captures").get<int64_t>(), 2) << sj[1].dump();
  EXPECT_GE(sj[1].at("cuda_graph_replayed_steps").get<int64_t>(), 40) << sj[1].dump() << " of 64 steps";
  EXPECT_EQ(sj[1].at("host_syncs_per_step"), 0);
  EXPECT_FALSE(sj[0].contains("cuda_graph_captures"));
  EXPECT_FALSE(sj[2].contains("cuda_graph_captures"));
}
