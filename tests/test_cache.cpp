// cache/: the activation cache of the frozen prefix — entries by sample id, reset when
// the prefix changes, gathered ahead of use, a full disk as a clear error — and
// through the trainer: a run with --freeze-cache on ends with the same weights as the
// same run recomputing the prefix, kill and resume included.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cache/activation_cache.h"
#include "core/error.h"
#include "core/rng.h"
#include "tests/test_util.h"
#include "train/safetensors.h"
#include "train/trainer.h"

using namespace eg;

namespace {

std::string tmpdir(const std::string& name) { return eg::testing::fresh_dir("eg_cache_" + name); }

std::vector<float> row(const Tensor& t, int64_t i) {
  const int64_t n = t.numel() / t.size(0);
  const float* p = t.data<float>() + i * n;
  return std::vector<float>(p, p + n);
}

class ActivationCacheTiers : public ::testing::TestWithParam<cache::Tier> {};

TEST_P(ActivationCacheTiers, StoresAndGathersBySampleId) {
  // A folder per tier: ctest runs the two instances in parallel processes.
  cache::ActivationCache c(tmpdir(GetParam() == cache::Tier::disk ? "basic_disk" : "basic_memory"), 20, GetParam());
  EXPECT_EQ(c.key(), -1);
  EXPECT_FALSE(c.contains({1}));
  c.set_key(0);
  Generator g(3);
  Tensor h = Tensor::randn({4, 3, 5, 5}, g);
  c.store({7, 2, 9, 0}, h);
  EXPECT_TRUE(c.contains({9, 7}));
  EXPECT_FALSE(c.contains({9, 7, 1})) << "sample 1 was never stored";
  Tensor got = c.gather({9, 7, 0});
  EXPECT_EQ(got.shape(), (Shape{3, 3, 5, 5}));
  EXPECT_EQ(row(got, 0), row(h, 2));
  EXPECT_EQ(row(got, 1), row(h, 0));
  EXPECT_EQ(row(got, 2), row(h, 3));
  EXPECT_EQ(c.stats().entries, 4);
  EXPECT_EQ(c.stats().bytes_reserved, 20 * 75 * 4);
  EXPECT_EQ(c.stats().on_disk, GetParam() == cache::Tier::disk);

  // Gathered in the background, then served.
  c.prefetch({2, 0});
  Tensor pre = c.gather({2, 0});
  EXPECT_EQ(row(pre, 0), row(h, 1));
  EXPECT_EQ(row(pre, 1), row(h, 3));
  EXPECT_EQ(c.stats().prefetched, 1);
  c.prefetch({2, 5});  // 5 is not cached: nothing to gather
  EXPECT_THROW(c.gather({2, 5}), Error);

  // Another prefix: every entry goes, and the store takes the new shape.
  c.set_key(1);
  EXPECT_FALSE(c.contains({7}));
  EXPECT_EQ(c.stats().entries, 0);
  EXPECT_EQ(c.stats().resets, 1);
  Tensor h2 = Tensor::randn({2, 8, 2, 2}, g);
  c.store({7, 19}, h2);
  EXPECT_EQ(row(c.gather({19}), 0), row(h2, 1));
  EXPECT_EQ(c.stats().bytes_reserved, 20 * 32 * 4);

  // Released when nothing is frozen any more: no entries and no store, until a new key.
  c.prefetch({7, 19});
  c.release();
  EXPECT_EQ(c.key(), -1);
  EXPECT_FALSE(c.contains({19}));
  EXPECT_EQ(c.stats().entries, 0);
  EXPECT_EQ(c.stats().bytes_reserved, 0);
  EXPECT_EQ(c.stats().peak_bytes_reserved, 20 * 75 * 4);
  EXPECT_FALSE(c.stats().on_disk);
  EXPECT_EQ(c.stats().ever_on_disk, GetParam() == cache::Tier::disk);
  EXPECT_THROW(c.gather({19}), Error);
  c.set_key(2);
  Tensor h3 = Tensor::randn({1, 3, 5, 5}, g);
  c.store({4}, h3);
  EXPECT_EQ(row(c.gather({4}), 0), row(h3, 0));
  EXPECT_EQ(c.stats().bytes_reserved, 20 * 75 * 4);
}

INSTANTIATE_TEST_SUITE_P(MemoryAndDisk, ActivationCacheTiers,
                         ::testing::Values(cache::Tier::memory, cache::Tier::disk));

// Entries keep the layout of the batch that sized the store (Note [Entries in the
// convolutions' layout]); a batch of the other layout is converted to it.
TEST(ActivationCache, StoresBlockedNhwcAndPlainAlike) {
  cache::ActivationCache c(tmpdir("blocked"), 4);
  c.set_key(0);
  Generator g(4);
  Tensor h = Tensor::randn({3, 16, 3, 3}, g);
  c.store({0, 1}, h.slice(0, 2).to_format(Format::nchw16c));
  c.store({3}, h.slice(2, 3));
  Tensor got = c.gather({0, 1, 3});
  EXPECT_EQ(got.format(), Format::nchw16c);
  EXPECT_EQ(got.to_vector<float>(), h.to_vector<float>());
  c.set_key(1);  // sized anew by a plain batch: plain entries
  c.store({0}, h.slice(0, 1));
  c.store({2}, h.slice(1, 2).to_format(Format::nchw16c));
  got = c.gather({0, 2});
  EXPECT_EQ(got.format(), Format::plain);
  EXPECT_EQ(got.to_vector<float>(), h.slice(0, 2).to_vector<float>());
  c.set_key(2);  // sized by an NHWC batch (what the CPU's convolutions write where they pick it)
  c.store({1, 2}, h.slice(1, 3).to_format(Format::nhwc));
  c.store({0}, h.slice(0, 1).to_format(Format::nchw16c));
  got = c.gather({0, 1, 2});
  EXPECT_EQ(got.format(), Format::nhwc);
  EXPECT_EQ(got.to_vector<float>(), h.to_vector<float>());
}

// Under --precision bf16 the prefix outputs bf16: entries keep it, in half the bytes.
TEST(ActivationCache, KeepsBf16EntriesInHalfTheBytes) {
  cache::ActivationCache c(tmpdir("bf16"), 4, cache::Tier::memory);
  c.set_key(0);
  Generator g(4);
  Tensor h = Tensor::randn({2, 16, 3, 3}, g).to(DType::bf16);
  c.store({2, 0}, h.to_format(Format::nchw16c));
  EXPECT_EQ(c.stats().bytes_reserved, 4 * 16 * 3 * 3 * 2);
  Tensor got = c.gather({2, 0});
  EXPECT_EQ(got.dtype(), DType::bf16);
  EXPECT_EQ(got.to(DType::f32).to_vector<float>(), h.to(DType::f32).to_vector<float>());
  EXPECT_THROW(c.store({1}, Tensor::randn({1, 16, 3, 3}, g)), Error) << "f32 into a bf16 cache";
  c.set_key(1);  // another prefix: sized anew, here in f32
  c.store({1}, Tensor::randn({1, 16, 3, 3}, g));
  EXPECT_EQ(c.gather({1}).dtype(), DType::f32);
  EXPECT_EQ(c.stats().bytes_reserved, 4 * 16 * 3 * 3 * 4);
}

// A batch through a cache whose prefix grew from shorter ones' (`lowers`, the longest
// first): each sample is served, computed onward from its entry in the longest shorter
// prefix that has one, or computed from the input.
TEST(ActivationCache, ABatchTakesWhatTheShorterPrefixesEntriesHold) {
  cache::ActivationCache c(tmpdir("lower_c"), 6), low(tmpdir("lower_low"), 6, cache::Tier::memory),
      lowest(tmpdir("lower_lowest"), 6, cache::Tier::memory);
  for (auto* k : {&lowest, &low, &c}) k->set_key(0);
  auto affine = [](float a, float b) {
    return [a, b](const Tensor& t) {
      Tensor o = Tensor::empty(t.shape());
      for (int64_t i = 0; i < t.numel(); ++i) o.data<float>()[i] = a * t.data<float>()[i] + b;
      return o;
    };
  };
  // The prefix maps x to 2x + 1; the shorter one's entries are 2x (so the rest of the way
  // adds 1), the shortest's are x (doubled and 1 added the rest of the way).
  const auto prefix = affine(2, 1), from_low = affine(1, 1), from_lowest = affine(2, 1);
  Generator g(7);
  Tensor x = Tensor::randn({5, 2}, g);
  auto xs = [&](std::initializer_list<int64_t> rows, float scale) {
    std::vector<float> v;
    for (int64_t r : rows)
      for (int64_t j = 0; j < 2; ++j) v.push_back(scale * x.data<float>()[r * 2 + j]);
    return Tensor::from_vector(v, {int64_t(rows.size()), 2});
  };
  // The batch's ids 3, 5, 1, 0, 4 (the rows of x): 3 is in c, 5 and 0 in the shorter
  // prefix's cache, 1 in the shortest's, 4 in none. 5 is in the shortest's too, with a
  // wrong value: the longer shorter prefix's entry is the one taken.
  c.store({3}, Tensor::from_vector(std::vector<float>{-1.f, 2.f}, {1, 2}));
  low.store({5, 0}, xs({1, 3}, 2));
  lowest.store({1, 5},
               Tensor::from_vector(std::vector<float>{x.data<float>()[4], x.data<float>()[5], 99.f, 99.f}, {2, 2}));
  const auto p = c.through({3, 5, 1, 0, 4}, x, Device::cpu(), prefix, {{&low, from_low}, {&lowest, from_lowest}});
  EXPECT_EQ(p.hits, 1);
  EXPECT_EQ(p.from_lower, (std::vector<int64_t>{2, 1}));
  const Tensor want = prefix(x);
  EXPECT_EQ(row(p.h, 0), (std::vector<float>{-1.f, 2.f})) << "served";
  for (int64_t i : {1, 2, 3, 4}) EXPECT_EQ(row(p.h, i), row(want, i)) << "row " << i;
  EXPECT_TRUE(c.contains({3, 5, 1, 0, 4}));
  // A batch wholly in one shorter prefix's cache is computed from it alone.
  low.store({2}, Tensor::from_vector(std::vector<float>{0.f, 1.f}, {1, 2}));
  const auto q = c.through({2}, Tensor::randn({1, 2}, g), Device::cpu(), prefix, {{&low, from_low}});
  EXPECT_EQ(q.from_lower, std::vector<int64_t>{1});
  EXPECT_EQ(row(q.h, 0), (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(row(c.gather({2}), 0), (std::vector<float>{1.f, 2.f}));
}

TEST(ActivationCache, BadInputIsAClearError) {
  EXPECT_THROW(cache::ActivationCache("/nonexistent/dir/for/egeria", 4), Error);
  cache::ActivationCache c(tmpdir("bad"), 4);
  Generator g(5);
  EXPECT_THROW(c.store({0}, Tensor::randn({1, 2}, g)), Error) << "store before a key";
  c.set_key(0);
  EXPECT_THROW(c.store({4}, Tensor::randn({1, 2}, g)), Error) << "id out of range";
  EXPECT_THROW(c.store({0, 1}, Tensor::randn({1, 2}, g)), Error) << "rows != ids";
  c.store({0}, Tensor::randn({1, 2}, g));
  EXPECT_THROW(c.store({1}, Tensor::randn({1, 3}, g)), Error) << "another per-sample shape";
  EXPECT_THROW(c.gather({1}), Error) << "not cached";
  cache::ActivationCache blocked(tmpdir("bad_blocked"), 4);  // entries kept blocked: the same errors
  blocked.set_key(0);
  blocked.store({0}, Tensor::randn({1, 16, 2, 2}, g).to_format(Format::nchw16c));
  EXPECT_NE(eg::testing::error_of([&] {
              blocked.store({1}, Tensor::randn({1, 3}, g));
            }).find("per-sample"),
            std::string::npos);
}

// This process's resident memory, in bytes.
int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = -1;
  f >> size >> resident;
  return resident * int64_t(::sysconf(_SC_PAGESIZE));
}

// A shuffled epoch stores entries at random sample ids: they are packed in store order
// (Note [Entries packed in store order]), so the store's memory touched is what it holds,
// whatever the page size, and never a page per entry, which with 2 MB pages faulted in the
// whole store, GBs, in the first steps after a freeze.
TEST(ActivationCache, StoredEntriesTouchOnlyTheMemoryTheyTake) {
  const int64_t samples = 997, per = 12 * 1024;  // 48 KiB entries, a store of 47 MiB
  cache::ActivationCache c(tmpdir("pages"), samples, cache::Tier::memory);
  c.set_key(0);
  Generator g(6);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 64; ++i) ids.push_back((i * 383) % samples);  // spread over the whole store
  const Tensor h = Tensor::randn({int64_t(ids.size()), per}, g);
  const int64_t before = resident_bytes(), held = int64_t(ids.size()) * per * 4;
  c.store(ids, h);
  const int64_t grew = resident_bytes() - before;
  EXPECT_GE(grew, held);
  EXPECT_LE(grew, held + (4 << 20)) << "pages faulted in beyond the entries held";
  std::vector<int64_t> back(ids.rbegin(), ids.rend());
  const Tensor got = c.gather(back);
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(row(got, int64_t(i)), row(h, int64_t(ids.size() - 1 - i)));
}

// A disk that cannot hold the cache: an error naming the directory and the size
// before anything is written (simulated with a file-size limit; SIGXFSZ ignored so
// the limit shows as EFBIG).
TEST(ActivationCache, AFullDiskIsAnErrorNamingTheSpaceNeeded) {
  const std::string dir = tmpdir("full");
  cache::ActivationCache c(dir, 1000, cache::Tier::disk);
  c.set_key(0);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Generator g(6);
  std::string msg;
  try {
    c.store({0}, Tensor::randn({1, 64, 8, 8}, g));
  } catch (const Error& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  EXPECT_NE(msg.find("GiB"), std::string::npos) << msg;
  EXPECT_FALSE(c.contains({0}));
}

// ---- through the trainer

train::TrainConfig cached_cfg(const std::string& out, bool cache) {
  train::TrainConfig c = eg::testing::small_image_run(out);
  c.freezing.policy = "static";  // the first 4 layer modules freeze at the start of epoch 2
  c.freezing.units = train::FreezeUnits::layers;
  c.freezing.static_modules = 4;
  c.freezing.static_epoch = 1;
  c.freezing.bn = train::FrozenBn::running;
  c.freezing.bn_settle = 0;  // entries from the freeze on, as the tests count them (settling: its own test)
  c.augment_mode = train::AugmentMode::sample;
  c.freezing.cache = cache;
  return c;
}

// Each epoch's (cache_hit_samples, cache_miss_samples) from a run's metrics.jsonl.
std::vector<std::pair<int64_t, int64_t>> served_by_epoch(const std::string& dir) {
  std::vector<std::pair<int64_t, int64_t>> served;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "epoch") served.emplace_back(j["cache_hit_samples"].get<int64_t>(), j["cache_miss_samples"]);
  }
  return served;
}

TEST(CacheTrainer, CachedRunEndsWithTheWeightsOfTheRecomputingRun) {
  const std::string a = tmpdir("off"), b = tmpdir("on"), killed = tmpdir("killed");
  ASSERT_TRUE(train::run_training(cached_cfg(a, false)).completed);
  ASSERT_TRUE(train::run_training(cached_cfg(b, true)).completed);
  auto sum = nlohmann::json::parse(std::ifstream(b + "/summary.json"));
  ASSERT_TRUE(sum.contains("activation_cache")) << sum.dump();
  const auto& ac = sum["activation_cache"];
  // The prefix freezes after the first step of epoch 2, which computes and stores the
  // other 240 samples; epoch 3 computes the 16 left as they come, and serves the rest.
  EXPECT_EQ(ac["miss_samples"].get<int64_t>(), 256) << ac.dump();
  EXPECT_EQ(ac["hit_samples"].get<int64_t>(), 2 * 256 - 16) << ac.dump();
  EXPECT_GE(ac["whole_batches_from_cache"].get<int64_t>(), 16) << ac.dump();
  EXPECT_GT(ac["prefetched_batches"].get<int64_t>(), 12) << ac.dump();
  EXPECT_GT(ac["forward_flops_saved_fraction"].get<double>(), 0.1) << ac.dump();
  eg::testing::expect_same_weights(a, b);
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(b + "/config.json"))["freeze_cache"], "on");

  // Killed while the cache is serving, resumed: the cache starts empty and refills,
  // and the run still ends where the uninterrupted one did (this one on disk).
  auto c = cached_cfg(killed, true);
  c.freezing.cache_dir = killed;  // the disk tier, end to end
  eg::testing::run_stopped_and_resumed(c, 40);
  EXPECT_TRUE(
      nlohmann::json::parse(std::ifstream(killed + "/summary.json"))["activation_cache"]["on_disk"].get<bool>());
  EXPECT_FALSE(ac["on_disk"].get<bool>()) << "a few MB: in memory";
  eg::testing::expect_same_weights(a, killed);
  // The backing file never outlives the run.
  for (auto& e : std::filesystem::directory_iterator(killed))
    EXPECT_EQ(e.path().filename().string().find(".egeria-activation-cache"), std::string::npos) << e.path();
}

// --augment-variants 2: a sample comes in two fixed augmentations, in turn, and the cache
// keeps an entry for each, so the cached run still ends with the recomputing run's weights.
TEST(CacheTrainer, EachOfASamplesAugmentationsHasAnEntryOfItsOwn) {
  const std::string a = tmpdir("v2_off"), b = tmpdir("v2_on");
  auto two = [](train::TrainConfig c) {
    c.augment_variants = 2;
    return c;
  };
  ASSERT_TRUE(train::run_training(two(cached_cfg(a, false))).completed);
  ASSERT_TRUE(train::run_training(two(cached_cfg(b, true))).completed);
  const auto ac = nlohmann::json::parse(std::ifstream(b + "/summary.json"))["activation_cache"];
  // Frozen after the first step of epoch 2 (the second augmentation): its other 240 samples
  // stored; epoch 3 (the first augmentation) stores all 256; epoch 4 (the second again)
  // serves the 240 and stores the 16 of the first step.
  EXPECT_EQ(ac["miss_samples"].get<int64_t>(), 2 * 256) << ac.dump();
  EXPECT_EQ(ac["hit_samples"].get<int64_t>(), 240) << ac.dump();
  EXPECT_EQ(ac["peak_bytes_reserved"].get<int64_t>(), 2 * 256 * 16 * 32 * 32 * 4) << ac.dump();
  eg::testing::expect_same_weights(a, b);
  // Each epoch's line says how many of its samples came from the cache.
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(served_by_epoch(b), (std::vector<P>{{0, 0}, {0, 240}, {0, 256}, {240, 16}}));
}

// FreezeOut grows the frozen prefix unit by unit (stem, layer1, layer2, layer3 after steps
// 16, 28, 40, 52): the entries of the shorter prefixes serve the samples the longer one
// has not stored yet, computed onward through the units it gained, and the run still ends
// with the recomputing run's weights.
TEST(CacheTrainer, AGrowingPrefixComputesOnwardFromTheShorterOnesEntries) {
  const std::string a = tmpdir("grow_off"), b = tmpdir("grow_on");
  auto growing = [](train::TrainConfig c) {
    c.freezing.policy = "freezeout";
    c.freezing.freezeout_t0 = 0.25;
    c.freezing.units = train::FreezeUnits::automatic;
    c.freezing.unit_regex = "^(layer[0-9]+)\\.";  // stem, layer1, layer2, layer3, head
    return c;
  };
  ASSERT_TRUE(train::run_training(growing(cached_cfg(a, false))).completed);
  ASSERT_TRUE(train::run_training(growing(cached_cfg(b, true))).completed);
  const auto ac = nlohmann::json::parse(std::ifstream(b + "/summary.json"))["activation_cache"];
  // Epoch 2, the first frozen, stores every sample under the stem; from then on each has
  // an entry at some depth, so none is computed from its input again.
  EXPECT_EQ(ac["miss_samples"].get<int64_t>(), 256) << ac.dump();
  EXPECT_EQ(ac["hit_samples"].get<int64_t>() + ac["lower_samples"].get<int64_t>(), 2 * 256) << ac.dump();
  EXPECT_GT(ac["lower_samples"].get<int64_t>(), 256) << ac.dump();
  // The four stores together at the end: 256 samples of the stem's and layer1's outputs
  // (16 x 32 x 32), layer2's (32 x 16 x 16) and layer3's (64 x 8 x 8), f32.
  EXPECT_EQ(ac["peak_bytes_reserved"].get<int64_t>(), 256 * 4 * (2 * 16 * 32 * 32 + 32 * 16 * 16 + 64 * 8 * 8))
      << ac.dump();
  EXPECT_EQ(ac["bytes_reserved"].get<int64_t>(), ac["peak_bytes_reserved"].get<int64_t>()) << ac.dump();
  eg::testing::expect_same_weights(a, b);
}

// The same under --precision bf16: the entries are the prefix's bf16 output, so the cached
// run still ends with the recomputing run's weights, bit for bit, its cache half the size.
TEST(CacheTrainer, Bf16CachedRunEndsWithTheWeightsOfTheRecomputingRun) {
  const std::string a = tmpdir("bf16_off"), b = tmpdir("bf16_on");
  auto bf16 = [](train::TrainConfig c) {
    c.precision = DType::bf16;
    return c;
  };
  ASSERT_TRUE(train::run_training(bf16(cached_cfg(a, false))).completed);
  ASSERT_TRUE(train::run_training(bf16(cached_cfg(b, true))).completed);
  const auto ac = nlohmann::json::parse(std::ifstream(b + "/summary.json"))["activation_cache"];
  EXPECT_EQ(ac["hit_samples"].get<int64_t>(), 2 * 256 - 16) << ac.dump();
  // 256 samples of the 4th layer module's output (ResNet-20's first stage: 16 x 32 x 32), 2 bytes each.
  EXPECT_EQ(ac["peak_bytes_reserved"].get<int64_t>(), 256 * 16 * 32 * 32 * 2) << ac.dump();
  eg::testing::expect_same_weights(a, b);
}

// Egeria with --freeze-reference-scope unit: the front unit's input is the frozen
// prefix's output, which a cached step takes from the cache; the readings are the ones
// the recomputing run takes, value for value.
TEST(CacheTrainer, UnitScopeReadingsFromCachedInputsAreTheRecomputedOnes) {
  auto egeria = [](const std::string& out, bool cache) {
    auto c = cached_cfg(out, cache);
    c.freezing.policy = "egeria";
    c.freezing.reference_scope = train::ReferenceScope::unit;
    c.freezing.reference.synchronous = true;
    c.freezing.tracker.interval = 2;
    c.freezing.tracker.bootstrap_interval = -1;  // every n, the paper
    c.freezing.tracker.window = 2;
    c.freezing.tracker.tolerance_coef = 0.5;  // as the trainer tests (test_freeze_train.cpp)
    return c;
  };
  const std::string a = tmpdir("unit_off"), b = tmpdir("unit_on");
  ASSERT_TRUE(train::run_training(egeria(a, false)).completed);
  ASSERT_TRUE(train::run_training(egeria(b, true)).completed);
  auto lines = [](const std::string& d) {
    std::vector<std::string> v;
    std::ifstream f(d + "/freeze.jsonl");
    for (std::string l; std::getline(f, l);) {
      auto j = nlohmann::json::parse(l);
      if (j["type"] == "evaluation" || j["type"] == "freeze" || j["type"] == "unfreeze")
        v.push_back(j["type"].get<std::string>() + "@" + j["step"].dump() + ":" +
                    (j.contains("plasticity") ? j["plasticity"].dump() : ""));
    }
    return v;
  };
  EXPECT_EQ(lines(a), lines(b));
  auto sum = nlohmann::json::parse(std::ifstream(b + "/summary.json"));
  EXPECT_GT(sum["freeze_stats"]["unit_scope_submissions"].get<int64_t>(), 0) << sum["freeze_stats"].dump();
  EXPECT_GT(sum["activation_cache"]["hit_samples"].get<int64_t>(), 0) << sum["activation_cache"].dump();
}

// --freeze-bn-settle 5 (Note [Settling a frozen BatchNorm]): the prefix frozen after the
// first step of epoch 2 keeps its batch norms on each batch's statistics for 5 steps while
// their running statistics become those batches' average, and the cache stores nothing
// until they switch; the cached run still ends with the recomputing run's weights, and a
// run killed while they settle resumes to the same weights.
TEST(CacheTrainer, SettlingBatchNormsHoldTheCacheBackAndResumeBitIdentically) {
  const std::string a = tmpdir("settle_off"), b = tmpdir("settle_on"), killed = tmpdir("settle_killed");
  auto settle = [](train::TrainConfig c) {
    c.freezing.bn_settle = 5;
    return c;
  };
  ASSERT_TRUE(train::run_training(settle(cached_cfg(a, false))).completed);
  ASSERT_TRUE(train::run_training(settle(cached_cfg(b, true))).completed);
  eg::testing::expect_same_weights(a, b);
  // Epoch 2: its first step before the freeze, 5 settling (80 samples), the other 160 stored;
  // epoch 3 serves those and stores the 96 others; epoch 4 serves all. (Without settling:
  // {0, 240}, {240, 16}, {256, 0}.)
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(served_by_epoch(b), (std::vector<P>{{0, 0}, {0, 160}, {160, 96}, {256, 0}}));
  eg::testing::run_stopped_and_resumed(settle(cached_cfg(killed, true)), 19);
  eg::testing::expect_same_weights(a, killed);
}

TEST(CacheTrainer, RefusesConfigurationsWhereACachedOutputWouldBeWrong) {
  auto expect_error = [](train::TrainConfig c, const std::string& needle) {
    try {
      train::run_training(c);
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c = cached_cfg(tmpdir("refuse"), true);
  c.freezing.bn = train::FrozenBn::batch;
  expect_error(c, "--freeze-bn running");
  c.freezing.cache = false;
  c.freezing.bn_settle = 4;
  expect_error(c,
               "--freeze-bn-settle 4 settles the running statistics a frozen BatchNorm switches to, which only "
               "--freeze-bn running does");
  c = cached_cfg(tmpdir("refuse"), true);
  c.augment_mode = train::AugmentMode::epoch;
  expect_error(c, "--augment-mode sample");
  c = cached_cfg(tmpdir("refuse"), true);
  c.freezing.policy = "none";
  expect_error(c, "--freeze none");
  c = cached_cfg(tmpdir("refuse"), true);
  c.augment_mode = train::AugmentMode::epoch;
  c.augment_variants = 3;
  expect_error(c,
               "--augment-variants 3 chooses among each sample's fixed augmentations: it needs --augment-mode sample");
  c.augment_mode = train::AugmentMode::sample;
  c.augment_variants = 0;
  expect_error(c, "--augment-variants must be at least 1, got 0");
  auto expect_bad_text = [](const char* flag, const char* text, const std::string& needle) {
    train::TrainConfig d;
    try {
      train::set_option(d, flag, text);
      ADD_FAILURE() << flag << " " << text << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_bad_text("--freeze-cache", "maybe", "--freeze-cache must be on or off, got 'maybe'");
  expect_bad_text("--augment-mode", "sometimes", "--augment-mode must be epoch or sample, got 'sometimes'");
  c = cached_cfg(tmpdir("refuse"), true);
  c.augment = false;  // no augmentation at all: a sample's input never changes
  c.epochs = 2;
  EXPECT_TRUE(train::run_training(c).completed);
}

}  // namespace
