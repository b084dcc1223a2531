// CUDA runtime pieces: the caching allocator, copies, and device-independent RNG; the
// GPU reference model.
// Every test skips without a GPU; tools/gpu-check runs them on one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "core/tensor.h"
#include "freeze/plasticity.h"
#include "kernels/ops.h"
#include "models/model.h"
#include "quant/reference.h"
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

TEST(Cuda, DropoutMaskEqualsTheCpuMask) {
  EG_REQUIRE_GPU();
  Tensor x = Tensor::ones({1000});
  Tensor y = Tensor::empty({1000}), m = Tensor::empty({1000}, DType::u8);
  ops::run(ops::dropout_fwd, ops::Backend::cpu, x, y, m, 0.3, 42, 7);
  Tensor xd = x.to(Device::cuda(0)), yd = Tensor::empty({1000}, DType::f32, Device::cuda(0)),
         md = Tensor::empty({1000}, DType::u8, Device::cuda(0));
  ops::run(ops::dropout_fwd, ops::Backend::cuda, xd, yd, md, 0.3, 42, 7);
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

// The GPU fallback of the reference model ("fp32-gpu"): the same activations as the
// CPU fp32 reference, and an Egeria run on the GPU that uses it.
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
  train::TrainConfig c;
  c.model = "resnet20";
  c.dataset = "synthetic";
  c.train_limit = 256;
  c.test_limit = 64;
  c.batch_size = 16;
  c.epochs = 2;
  c.device = "cuda:0";
  c.out = "/tmp/eg_cuda_gpu_reference";
  c.freeze = "egeria";
  c.freeze_reference = "fp32-gpu";
  c.freeze_interval = 2;
  c.freeze_window = 2;
  auto s = train::run_training(c);
  ASSERT_TRUE(s.completed);
  auto sum = nlohmann::json::parse(std::ifstream(c.out + "/summary.json"));
  EXPECT_GT(sum["freeze_stats"]["evaluations_completed"].get<int64_t>(), 0);
  EXPECT_EQ(sum["freeze_stats"]["evaluations_dropped"].get<int64_t>(), 0);
}
