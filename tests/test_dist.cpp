// dist/: the local communicator and the thread-group test double (the MPI backend is
// checked under mpirun by tests/dist_check.cpp).
#include <gtest/gtest.h>

#include <thread>

#include "dist/communicator.h"

using namespace eg;

namespace {

// Runs f(rank's communicator) on one thread per rank of a fresh thread group.
void on_ranks(int n, const std::function<void(dist::Communicator&)>& f) {
  auto group = dist::make_thread_group(n);
  std::vector<std::thread> ts;
  for (auto& c : group) ts.emplace_back([&f, &c] { f(*c); });
  for (auto& t : ts) t.join();
}

}  // namespace

TEST(Dist, LocalIsAWorldOfOne) {
  auto c = dist::make_local();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  Tensor t = Tensor::from_vector<float>({1.5f, -2}, {2});
  c->all_reduce(t);
  c->broadcast(t, 0);
  c->barrier();
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1.5f, -2}));
  EXPECT_EQ(c->all_gather("x"), (std::vector<std::string>{"x"}));
  EXPECT_THROW(c->broadcast(t, 1), Error);
  Tensor i32 = Tensor::zeros({2}, DType::s32);
  EXPECT_THROW(c->all_reduce(i32), Error);
  EXPECT_FALSE(dist::launched_by_mpi()) << "the test suite runs without a launcher";
  EXPECT_EQ(dist::world().backend(), "local");
}

TEST(Dist, ThreadGroupCollectivesAgreeOnEveryRank) {
  const int n = 3;
  std::vector<std::vector<float>> sums(n), maxes(n), bcast(n);
  std::vector<std::vector<int64_t>> counts(n);
  std::vector<std::vector<std::string>> gathered(n);
  on_ranks(n, [&](dist::Communicator& c) {
    const int r = c.rank();
    Tensor s = Tensor::from_vector<float>({0.1f * float(r + 1), float(r)}, {2});
    c.all_reduce(s);
    Tensor m = Tensor::from_vector<float>({float(r), -float(r)}, {2});
    c.all_reduce(m, dist::ReduceOp::max);
    Tensor k = Tensor::from_vector<int64_t>({r, 10}, {2});
    c.all_reduce(k);
    Tensor b = Tensor::from_vector<float>({float(r * 7)}, {1});
    c.broadcast(b, 2);
    c.barrier();
    sums[size_t(r)] = s.to_vector<float>();
    maxes[size_t(r)] = m.to_vector<float>();
    counts[size_t(r)] = k.to_vector<int64_t>();
    bcast[size_t(r)] = b.to_vector<float>();
    gathered[size_t(r)] = c.all_gather(std::string(size_t(r), 'a' + char(r)));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(sums[size_t(r)], sums[0]) << "bit for bit on every rank";
    EXPECT_FLOAT_EQ(sums[size_t(r)][0], 0.6f);
    EXPECT_EQ(sums[size_t(r)][1], 3.f);
    EXPECT_EQ(maxes[size_t(r)], (std::vector<float>{2.f, 0.f}));
    EXPECT_EQ(counts[size_t(r)], (std::vector<int64_t>{3, 30}));
    EXPECT_EQ(bcast[size_t(r)], (std::vector<float>{14.f}));
    EXPECT_EQ(gathered[size_t(r)], (std::vector<std::string>{"", "b", "cc"}));
  }
}
