// data/loader: deterministic order and augmentation, exact resumption, look-ahead ids.
#include <gtest/gtest.h>

#include <set>

#include "data/loader.h"

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

TEST(Loader, RejectsBadOptions) {
  auto d = small_data();
  auto o = opts();
  o.batch_size = 0;
  EXPECT_THROW(data::Loader(d, o), Error);
  o = opts();
  o.batch_size = 1000;
  EXPECT_THROW(data::Loader(d, o), Error);
  data::Loader l(d, opts());
  EXPECT_THROW(l.start_epoch(0, 11), Error);
}
