// What freezing buys per training step: ResNet-20/56 and MobileNetV2, batch 128, 3x32x32 (or the input of
// EG_BENCH_IMAGE, below), one SGD step (forward, backward, update) with the first k
// freezing units (the paper's partition, freeze/partition.h) frozen, k = 0 .. all but the
// head. Counters:
//   img/s         training throughput
//   peak_MiB      the allocator's high-water mark during the step: parameters, optimizer
//                 state, gradients, saved activations and workspaces
//   step_MiB      of which allocated during the step (saved activations, gradients of
//                 the active parameters, workspaces)
//   frozen_params share of the parameters frozen
// A frozen prefix runs under no-grad: it saves no activation for backward and owns no
// gradient memory, so peak_MiB falls with k (the "measure the memory drop").
// TrainStepFrozenCached: the same step with the frozen prefix's output read from the
// activation cache (cache/, --freeze-cache on): gathered for the batch's 128 sample
// ids, then the active modules only.
// CacheStore: the cache's stores in the epochs after a freeze, into memory not yet touched.
// TrainStepFrozenSet: a set of units frozen that is not a prefix (Note [Frozen sets] in
// freeze/policy.h): unit u alone, behind the trainable units before it, and every body
// unit but the first. Such a unit runs its backward to its input and skips its weight
// gradients and update: the step saves less than the prefix of as many units.
// EG_BENCH_DEVICE=cuda:0 runs on the GPU (the CUDA caching allocator's figures).
// EG_BENCH_IMAGE=CxHxW sets the input (default 3x32x32, CIFAR's), so that the step costs
// bench/time_to_accuracy.py models a run's time from are those of the run's own input
// (1x28x28 for Fashion-MNIST): what a frozen unit saves depends on its share of the step.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "bench/machine_context.h"
#include "cache/activation_cache.h"
#include "core/allocator.h"
#include "core/rng.h"
#include "freeze/partition.h"
#include "freeze/policy.h"
#include "layers/layers.h"
#include "models/model.h"
#include "optim/optimizer.h"

using namespace eg;

namespace {

Device bench_device() {
  const char* d = std::getenv("EG_BENCH_DEVICE");
  return Device::parse(d && *d ? d : "cpu");
}

struct BenchImage {
  int64_t channels = 3, size = 32;
};

BenchImage bench_image() {
  BenchImage im;
  const char* e = std::getenv("EG_BENCH_IMAGE");
  if (!e || !*e) return im;
  long long c = 0, h = 0, w = 0;
  char tail = 0;
  if (std::sscanf(e, "%lldx%lldx%lld%c", &c, &h, &w, &tail) != 3 || c < 1 || h < 8 || h != w) {
    std::fprintf(stderr, "EG_BENCH_IMAGE=%s: expected CxHxW with square images of 8 pixels or more, e.g. 1x28x28\n", e);
    std::exit(2);
  }
  im.channels = c;
  im.size = h;
  return im;
}

Allocator& allocator_of(const Device& d) { return d.is_cpu() ? cpu_allocator() : cuda_allocator(d.index); }

void BM_TrainStepFrozen(benchmark::State& st, const char* name, freeze::UnitSet set, bool cached) {
  const Device dev = bench_device();
  const BenchImage im = bench_image();
  models::ModelConfig mc;
  mc.name = name;
  mc.in_channels = im.channels;
  mc.image_size = im.size;
  Generator g(1);
  auto m = models::build_model(mc, g);
  m->to(dev);
  m->train();
  const auto part = freeze::make_partition(*m, freeze::PartitionMode::automatic);
  if (!set.empty() && set.back() >= part.size() - 1) {
    st.SkipWithError("a unit past the last body unit");
    return;
  }
  const int64_t layers = part.layer_prefix(freeze::prefix_length(set));
  freeze::apply_frozen_layers(*m, part.layers_of(set));
  optim::SGD opt(m->parameters(), 0.1, {0.9, 0, 5e-4, false});
  const int64_t b = 128;
  Tensor x = Tensor::randn({b, im.channels, im.size, im.size}, g).to(dev);
  std::vector<int64_t> yv(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) yv[size_t(i)] = i % 10;
  Tensor y = Tensor::from_vector(yv, {b}).to(dev);
  std::unique_ptr<cache::ActivationCache> cache;
  std::vector<int64_t> ids(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) ids[size_t(i)] = 3 * i;  // scattered over the file, as a shuffled batch
  if (cached) {
    const char* tmp = std::getenv("TMPDIR");
    cache = std::make_unique<cache::ActivationCache>(tmp && *tmp ? tmp : "/tmp", 3 * b);
    cache->set_key(0);
    cache->store(ids, m->forward_layers(x, 0, layers, layers));
  }
  auto logits = [&] {
    if (!cached) return m->forward_frozen(x, Tensor(), layers);
    return m->forward_layers(cache->gather(ids).to(dev), layers, -1, layers);
  };
  auto step = [&] {
    Tensor loss = fn::cross_entropy(logits(), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss.item();  // synchronises the device
  };
  step();  // gradients and momentum exist, as in steady training
  Allocator& a = allocator_of(dev);
  const double before = double(a.stats().allocated);
  a.reset_peak();
  step();
  const double peak = double(a.stats().peak_allocated);
  for (auto _ : st) benchmark::DoNotOptimize(step());
  int64_t frozen = 0;
  std::string names;
  for (int64_t u : set)
    frozen += part.units()[size_t(u)].params, names += (names.empty() ? "" : ", ") + part.units()[size_t(u)].name;
  st.counters["img/s"] = benchmark::Counter(double(b), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["peak_MiB"] = peak / (1 << 20);
  st.counters["step_MiB"] = (peak - before) / (1 << 20);
  st.counters["frozen_params"] = double(frozen) / double(m->num_parameters());
  const int64_t k = int64_t(set.size());
  if (k == 0) st.SetLabel("nothing frozen");
  else if (freeze::prefix_length(set) == k) st.SetLabel("frozen through " + part.units()[size_t(k - 1)].name);
  else st.SetLabel("frozen: " + names);
}

// A shuffled epoch's stores into a fresh store: batches of 128 of ResNet-20's stem+layer1
// outputs (blocked, as the prefix gives them), at scattered ids, into a store of 30,000
// images x 4 augmentations, the measured fine-tuning runs' (Note [Entries packed in store
// order]). Every batch goes to memory the store has not touched, as in the epochs after a freeze.
void BM_CacheStore(benchmark::State& st) {
  const BenchImage im = bench_image();
  const int64_t b = 128, samples = 30000 * 4;
  Generator g(2);
  const Tensor h = Tensor::randn({b, 16, im.size, im.size}, g).to_format(Format::nchw16c);
  std::vector<int64_t> order(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) order[size_t(i)] = i * 7919 % samples;  // every id once, scattered
  const char* tmp = std::getenv("TMPDIR");
  cache::ActivationCache c(tmp && *tmp ? tmp : "/tmp", samples, cache::Tier::memory);
  int64_t key = 0, at = 0;
  c.set_key(key);
  std::vector<int64_t> ids(static_cast<size_t>(b));
  for (auto _ : st) {
    if (at + b > samples) c.set_key(++key), at = 0;
    std::copy_n(order.begin() + at, b, ids.begin());
    at += b;
    c.store(ids, h);
  }
  st.counters["MB/s"] = benchmark::Counter(double(h.numel()) * 4e-6, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  benchmark::RegisterBenchmark("CacheStore/resnet20/k:1", BM_CacheStore)->Unit(benchmark::kMillisecond)->UseRealTime();

  for (const char* name : {"resnet20", "resnet56", "mobilenetv2"}) {
    models::ModelConfig mc;
    mc.name = name;
    Generator g(1);
    const int64_t units = freeze::make_partition(*models::build_model(mc, g), freeze::PartitionMode::automatic).size();
    for (bool cached : {false, true})
      for (int64_t k = cached ? 1 : 0; k < units; ++k)
        benchmark::RegisterBenchmark(
            (std::string(cached ? "TrainStepFrozenCached/" : "TrainStepFrozen/") + name + "/k:" + std::to_string(k))
                .c_str(),
            BM_TrainStepFrozen, name, freeze::first_units(k), cached)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    std::vector<std::pair<std::string, freeze::UnitSet>> sets;
    for (int64_t u = 1; u + 1 < units; ++u) sets.push_back({"units:" + std::to_string(u), {u}});
    freeze::UnitSet body;
    for (int64_t u = 1; u + 1 < units; ++u) body.push_back(u);
    sets.push_back({"units:1-" + std::to_string(units - 2), body});
    for (auto& [label, set] : sets)
      benchmark::RegisterBenchmark((std::string("TrainStepFrozenSet/") + name + "/" + label).c_str(),
                                   BM_TrainStepFrozen, name, set, false)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  const BenchImage im = bench_image();
  benchmark::AddCustomContext(
      "image", std::to_string(im.channels) + "x" + std::to_string(im.size) + "x" + std::to_string(im.size));
  eg::add_machine_context();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
