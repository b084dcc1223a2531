// data/loader: deterministic order and augmentation, exact resumption, look-ahead ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "data/loader.h"
#include "tests/test_util.h"

using namespace eg;

namespace {
std::shared_ptr<const data::ImageDataset> small_data() {
  return std::make_shared<data::ImageDataset>(data::synthetic_images(103, 3, 8, 10, 5));
}
data::LoaderOptions opts() {
  data::LoaderOptions o;
  o.batch_size = 10;
  o.augment = true;
  o.aug.crop_padding = 2;
  o.aug.hflip = true;
  o.workers = 2;
  o.prefetch = 3;
  o.seed = 77;
  return o;
}
std::vector<data::Batch> epoch(data::Loader& l, int64_t e, int64_t start = 0) {
  l.start_epoch(e, start);
  std::vector<data::Batch> v;
  data::Batch b;
  while (l.next(b)) v.push_back(b);
  return v;
}
}  // namespace

TEST(Loader, EpochIsAPermutationAndDeterministic) {
  auto d = small_data();
  data::Loader a(d, opts()), b(d, opts());
  auto ea = epoch(a, 3), eb = epoch(b, 3);
  ASSERT_EQ(ea.size(), 10u);  // drop_last: 103 / 10
  std::set<int64_t> ids;
  for (size_t i = 0; i < ea.size(); ++i) {
    EXPECT_EQ(ea[i].index, int64_t(i));
    EXPECT_EQ(ea[i].ids, eb[i].ids);
    EXPECT_EQ(ea[i].x.to_vector<float>(), eb[i].x.to_vector<float>());
    for (auto id : ea[i].ids) EXPECT_TRUE(ids.insert(id).second);
  }
  auto e4 = epoch(a, 4);
  EXPECT_NE(e4[0].ids, ea[0].ids);  // a new epoch is a new order
}

TEST(Loader, ResumingMidEpochGivesTheSameBatches) {
  auto d = small_data();
  data::Loader a(d, opts()), b(d, opts());
  auto full = epoch(a, 1);
  auto rest = epoch(b, 1, 6);
  ASSERT_EQ(rest.size(), 4u);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_EQ(rest[i].ids, full[6 + i].ids);
    EXPECT_EQ(rest[i].x.to_vector<float>(), full[6 + i].x.to_vector<float>());
  }
}

TEST(Loader, UpcomingIdsAreTheNextBatches) {
  auto d = small_data();
  data::Loader l(d, opts());
  l.start_epoch(0);
  data::Batch b;
  ASSERT_TRUE(l.next(b));
  auto next2 = l.upcoming_ids(2);
  ASSERT_EQ(next2.size(), 20u);
  data::Batch b1, b2;
  ASSERT_TRUE(l.next(b1));
  ASSERT_TRUE(l.next(b2));
  std::vector<int64_t> got = b1.ids;
  got.insert(got.end(), b2.ids.begin(), b2.ids.end());
  EXPECT_EQ(next2, got);
}

TEST(Loader, AugmentationDependsOnlyOnSeedEpochAndId) {
  auto d = small_data();
  data::AugmentOptions o;
  o.crop_padding = 4;
  o.hflip = true;
  std::vector<float> a(3 * 8 * 8), b(3 * 8 * 8), c(3 * 8 * 8);
  data::augment_into(*d, 17, o, 1, 2, a.data());
  data::augment_into(*d, 17, o, 1, 2, b.data());
  EXPECT_EQ(a, b);
  bool differs = false;
  for (int64_t e = 3; e < 8 && !differs; ++e) {
    data::augment_into(*d, 17, o, 1, e, c.data());
    differs = c != a;
  }
  EXPECT_TRUE(differs);
}

std::map<int64_t, std::vector<float>> pixels_by_id(data::Loader& l, int64_t e) {
  std::map<int64_t, std::vector<float>> m;
  for (auto& b : epoch(l, e)) {
    const int64_t n = b.x.numel() / b.x.size(0);
    for (size_t i = 0; i < b.ids.size(); ++i)
      m[b.ids[i]] = std::vector<float>(b.x.data<float>() + int64_t(i) * n, b.x.data<float>() + int64_t(i + 1) * n);
  }
  return m;
}

// augment_variants 1: a sample is cropped and flipped the same way in every epoch
// (what the activation cache needs); by default it changes between epochs.
TEST(Loader, PerSampleAugmentationIsTheSameEveryEpoch) {
  auto o = opts();
  o.augment_variants = 1;
  data::Loader fixed(small_data(), o);
  auto e0 = pixels_by_id(fixed, 0), e1 = pixels_by_id(fixed, 1);
  ASSERT_EQ(e0.size(), e1.size());
  int same = 0, both = 0;  // 3 of the 103 samples are dropped from each epoch's last batch
  for (auto& [id, v] : e0) {
    both += e1.count(id) > 0;
    same += e1.count(id) && e1[id] == v;
  }
  EXPECT_GT(both, 90);
  EXPECT_EQ(same, both);
  data::Loader varying(small_data(), opts());
  auto v0 = pixels_by_id(varying, 0), v1 = pixels_by_id(varying, 1);
  int changed = 0;
  for (auto& [id, v] : v0) changed += v1.count(id) && v1[id] != v;
  EXPECT_GT(changed, int(v0.size()) / 2);
}

// augment_variants V: epoch e loads each sample as epoch e mod V of the default
// (a new augmentation every epoch) loads it, so a sample comes in V augmentations, in
// turn, whatever the epoch's order.
TEST(Loader, AugmentVariantsAreTheFirstEpochsAugmentationsTakenInTurn) {
  auto o = opts();
  o.augment_variants = 3;
  data::Loader turns(small_data(), o), anew(small_data(), opts());
  std::vector<std::map<int64_t, std::vector<float>>> fresh;
  for (int64_t e = 0; e < 3; ++e) fresh.push_back(pixels_by_id(anew, e));
  for (int64_t e = 0; e < 7; ++e) {
    int same = 0, both = 0;
    for (auto& [id, v] : pixels_by_id(turns, e)) {
      const auto& f = fresh[size_t(e % 3)];
      if (!f.count(id)) continue;  // in the drop_last remainder of one of the two epochs
      ++both;
      same += f.at(id) == v;
    }
    EXPECT_GT(both, 80) << "epoch " << e;
    EXPECT_EQ(same, both) << "epoch " << e;
  }
}

TEST(Loader, RejectsBadOptions) {
  auto d = small_data();
  auto o = opts();
  o.batch_size = 0;
  EXPECT_THROW(data::Loader(d, o), Error);
  o = opts();
  o.batch_size = 1000;
  EXPECT_THROW(data::Loader(d, o), Error);
  o = opts();
  o.augment_variants = -1;
  EXPECT_THROW(data::Loader(d, o), Error);
  data::Loader l(d, opts());
  EXPECT_THROW(l.start_epoch(0, 11), Error);
  // Geometry the workers would index out of bounds with: named, before any worker runs.
  auto cut = std::make_shared<data::ImageDataset>(*d);
  cut->images = cut->images.slice(0, 50);  // 103 labels for 50 images
  std::string msg = eg::testing::error_of([&] { data::Loader(cut, opts()); });
  EXPECT_NE(msg.find("got images [50, 3, 8, 8] and 103 labels of s64"), std::string::npos) << msg;
  class Flat final : public data::SampleSource {  // a tabular source: not [C, H, W]
   public:
    int64_t size() const override { return 8; }
    Shape sample_shape() const override { return {784}; }
    int64_t label(int64_t) const override { return 0; }
    void load(int64_t, uint64_t, int64_t, float*) const override {}
  };
  msg = eg::testing::error_of([&] { data::Loader(std::make_shared<Flat>(), opts()); });
  EXPECT_NE(msg.find("a sample must be [C, H, W] (SampleSource::sample_shape), got [784]"), std::string::npos) << msg;
}

// A batch whose memory cannot be had stops the loader with the allocator's error when
// the batch is consumed, as a sample's error does (it ended the process from the worker).
#ifdef __SANITIZE_ADDRESS__
// ASan aborts on a request it cannot serve unless told to fail it as the system
// allocator does (a null that egeria's allocators turn into their error): so the test
// below runs under ASan too. Options in ASAN_OPTIONS are added to this one.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif
TEST(Loader, ABatchTooLargeForMemoryIsAnErrorWhereItIsConsumed) {
  class Huge final : public data::SampleSource {
   public:
    int64_t size() const override { return 4; }
    Shape sample_shape() const override { return {1, int64_t(1) << 20, int64_t(1) << 20}; }  // 4 TiB of f32
    int64_t label(int64_t) const override { return 0; }
    void load(int64_t, uint64_t, int64_t, float*) const override {}
  };
  data::LoaderOptions o;
  o.batch_size = 2;
  o.workers = 2;
  data::Loader l(std::make_shared<Huge>(), o);
  l.start_epoch(0);
  data::Batch b;
  const std::string msg = eg::testing::error_of([&] { l.next(b); });
  EXPECT_NE(msg.find("out of host memory"), std::string::npos) << msg;
}

// Data-parallel shares: rank r of 3 with batch 4 gets the positions r, r + 3, ... of each
// global batch of 12 that one process with batch 12 loads, with the same augmentation.
TEST(Loader, RanksTakeInterleavedSharesOfTheOneProcessBatches) {
  auto one = opts();
  one.batch_size = 12;
  data::Loader whole(small_data(), one);
  const auto all = epoch(whole, 1);
  ASSERT_EQ(all.size(), 8u);  // 103 samples: 8 full global batches
  for (int r = 0; r < 3; ++r) {
    auto o = opts();
    o.batch_size = 4;
    o.shard_rank = r, o.shards = 3;
    data::Loader l(small_data(), o);
    EXPECT_EQ(l.batches_per_epoch(), 8);
    const auto mine = epoch(l, 1);
    ASSERT_EQ(mine.size(), all.size());
    l.start_epoch(1);
    EXPECT_EQ(l.upcoming_ids(1), mine[0].ids);
    for (size_t k = 0; k < all.size(); ++k) {
      ASSERT_EQ(mine[k].ids.size(), 4u);
      const int64_t per = mine[k].x.numel() / 4;
      for (size_t i = 0; i < 4; ++i) {
        const size_t at = size_t(r) + 3 * i;
        EXPECT_EQ(mine[k].ids[i], all[k].ids[at]);
        EXPECT_EQ(mine[k].y.data<int64_t>()[i], all[k].y.data<int64_t>()[at]);
        EXPECT_TRUE(std::equal(mine[k].x.data<float>() + int64_t(i) * per,
                               mine[k].x.data<float>() + int64_t(i + 1) * per,
                               all[k].x.data<float>() + int64_t(at) * per));
      }
    }
  }
}

// The workers share each batch: every worker loads some samples of the batch being built
// (not a batch each), and the batches are the ones a single worker makes, sample for
// sample (each sample a pure function of (seed, epoch, id), packed in position order).
TEST(Loader, WorkersShareEachBatchAndBuildTheSameBatches) {
  class Slow final : public data::SampleSource {
   public:
    int64_t size() const override { return 96; }
    Shape sample_shape() const override { return {1, 2, 1}; }
    int64_t label(int64_t id) const override { return id % 7; }
    void load(int64_t id, uint64_t seed, int64_t epoch, float* out) const override {
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      {
        std::lock_guard<std::mutex> l(mu);
        threads[id].insert(std::this_thread::get_id());
      }
      out[0] = float(id) + 1000.f * float(epoch), out[1] = float(seed);
    }
    mutable std::mutex mu;
    mutable std::map<int64_t, std::set<std::thread::id>> threads;
  };
  auto batches = [](int workers, std::shared_ptr<Slow> src) {
    data::LoaderOptions o;
    o.batch_size = 32;
    o.workers = workers;
    o.seed = 5;
    data::Loader l(src, o);
    std::vector<std::vector<float>> xs;
    std::vector<std::vector<int64_t>> ys, ids;
    for (int64_t epoch : {0, 1}) {
      l.start_epoch(epoch);
      for (data::Batch b; l.next(b);) {
        xs.push_back(b.x.to_vector<float>());
        ys.push_back(b.y.to_vector<int64_t>());
        ids.push_back(b.ids);
      }
    }
    return std::make_tuple(xs, ys, ids);
  };
  auto one = std::make_shared<Slow>(), four = std::make_shared<Slow>();
  const auto [x1, y1, i1] = batches(1, one);
  const auto [x4, y4, i4] = batches(4, four);
  EXPECT_EQ(x1, x4);
  EXPECT_EQ(y1, y4);
  EXPECT_EQ(i1, i4);
  ASSERT_EQ(i4.size(), 6u);
  for (size_t b = 0; b < i4.size(); ++b)
    for (size_t k = 0; k < i4[b].size(); ++k) {
      EXPECT_EQ(x4[b][2 * k], float(i4[b][k]) + (b < 3 ? 0.f : 1000.f));
      EXPECT_EQ(y4[b][k], i4[b][k] % 7);
    }
  // The first batch of the run: built by more than one worker.
  std::set<std::thread::id> builders;
  for (int64_t id : i4[0])
    for (auto t : four->threads[id]) builders.insert(t);
  EXPECT_GT(builders.size(), 1u) << "one worker built the whole first batch";
}

// A sample whose load throws data::BadSample stops the loader naming it, or with
// skip_bad is left out of its batch (which is that much shorter), the others in order.
TEST(Loader, BadSamplesStopTheLoaderOrAreLeftOutOfTheirBatch) {
  class SomeBad final : public data::SampleSource {
   public:
    int64_t size() const override { return 12; }
    Shape sample_shape() const override { return {1, 1, 1}; }
    int64_t label(int64_t id) const override { return id % 3; }
    void load(int64_t id, uint64_t, int64_t, float* out) const override {
      if (id == 2 || id == 4 || id == 5) throw data::BadSample("sample " + std::to_string(id) + " is damaged");
      out[0] = float(id);
    }
  };
  auto src = std::make_shared<SomeBad>();
  data::LoaderOptions o;
  o.batch_size = 3;
  o.shuffle = false;
  o.workers = 2;
  {
    data::Loader l(src, o);
    l.start_epoch(0);
    data::Batch b;
    try {
      l.next(b);  // ids 0, 1, 2: 2 is bad
      ADD_FAILURE() << "a bad sample did not stop the loader";
    } catch (const data::BadSample& e) {
      EXPECT_STREQ(e.what(), "sample 2 is damaged");
    }
  }
  o.skip_bad = true;
  data::Loader l(src, o);
  l.start_epoch(0);
  std::vector<std::vector<int64_t>> ids, left_out;
  for (data::Batch b; l.next(b);) {
    ids.push_back(b.ids);
    ASSERT_EQ(b.x.size(0), int64_t(b.ids.size()));
    ASSERT_EQ(b.y.numel(), int64_t(b.ids.size()));
    for (size_t i = 0; i < b.ids.size(); ++i) {
      EXPECT_EQ(b.x.data<float>()[i], float(b.ids[i]));
      EXPECT_EQ(b.y.data<int64_t>()[i], b.ids[i] % 3);
    }
    left_out.emplace_back();
    for (auto& [id, why] : b.left_out) {
      left_out.back().push_back(id);
      EXPECT_EQ(why, "sample " + std::to_string(id) + " is damaged");
    }
  }
  EXPECT_EQ(ids, (std::vector<std::vector<int64_t>>{{0, 1}, {3}, {6, 7, 8}, {9, 10, 11}}));
  EXPECT_EQ(left_out, (std::vector<std::vector<int64_t>>{{2}, {4, 5}, {}, {}}));
}

// The dataset table: each in-memory row's reader gives images of its classes, normalised
// by its own statistics through image_samples; other kinds have no reader; names outside
// the table are a user's data (find_dataset) or an error naming the known ones.
TEST(DatasetTable, RowsDescribeWhatTheirReadersGive) {
  std::set<std::string> names;
  for (auto& d : data::datasets()) {
    EXPECT_TRUE(names.insert(d.name).second) << d.name << " twice";
    EXPECT_EQ(bool(d.read), d.kind == data::DataKind::images) << d.name;
    if (d.kind == data::DataKind::images) {
      EXPECT_GT(d.classes, 0) << d.name;
    }
  }
  const data::DatasetInfo& s = data::dataset_info("synthetic");
  const data::ImageDataset test = data::load_image_dataset({"synthetic", "", 100, {}}, false);
  ASSERT_EQ(test.size(), 100);
  for (int64_t i = 0; i < test.size(); ++i) EXPECT_LT(test.labels.data<int64_t>()[i], s.classes);
  // Sample 0 through image_samples without augmentation: (x / 255 - mean) / std, channel by channel.
  auto src = data::image_samples(std::make_shared<data::ImageDataset>(test), {0, false, s.norm});
  std::vector<float> x(size_t(3 * 32 * 32));
  src->load(0, 1, 0, x.data());
  for (int64_t ch = 0; ch < 3; ++ch) {
    const float u = float(test.images.data<uint8_t>()[ch * 32 * 32]);
    EXPECT_NEAR(x[size_t(ch * 32 * 32)], (u / 255.f - s.norm.mean[ch]) / s.norm.std[ch], 1e-5f);
  }
  EXPECT_EQ(data::dataset_info("cifar100").classes, 100);
  EXPECT_EQ(data::dataset_info("en-es").kind, data::DataKind::sentence_pairs);
  EXPECT_EQ(data::find_dataset("my-own-data"), nullptr);
  try {
    data::dataset_info("imagenet22k");
    FAIL() << "an unknown dataset was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dataset 'imagenet22k' (known: fashion-mnist"), std::string::npos)
        << e.what();
  }
}
