// dist/: the local communicator and the thread-group test double (the MPI backend is
// checked under mpirun by tests/dist_check.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "autograd/functions.h"
#include "autograd/node.h"
#include "dist/communicator.h"
#include "dist/grad_sync.h"
#include "dist/strategy.h"
#include "layers/layers.h"
#include "optim/optimizer.h"
#include "tests/test_util.h"

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

// --device under several ranks: "cuda" is one GPU a rank (its local rank's); a named GPU
// shared by the ranks of one host is refused, here through a Strategy of two thread ranks
// too (one host: local size 2), before any GPU is looked for.
TEST(Dist, RanksTakeOneGpuEachAndNeverShareOne) {
  EXPECT_EQ(dist::rank_device_name("cuda", 4, 2, 4), "cuda:2");
  EXPECT_EQ(dist::rank_device_name("cuda", 1, 0, 1), "cuda");
  EXPECT_EQ(dist::rank_device_name("cuda:1", 1, 0, 1), "cuda:1");
  EXPECT_EQ(dist::rank_device_name("cuda:0", 2, 0, 1), "cuda:0") << "two hosts, a rank each";
  EXPECT_EQ(dist::rank_device_name("cpu", 4, 3, 4), "cpu");
  const std::string want = "--device cuda:0 with 2 ranks on this host would put them all on one GPU; use --device cuda";
  on_ranks(2, [&](dist::Communicator& c) {
    const std::string e = eg::testing::error_of([&] { dist::Strategy s(c, "cuda:0", {}); });
    EXPECT_NE(e.find(want), std::string::npos) << e;
  });
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

// ---- the gradient-ready hook and the overlapped gradient sync (dist/grad_sync.h)

namespace {

double amax(const Tensor& t) {
  double m = 0;
  for (float v : t.to_vector<float>()) m = std::max(m, double(std::abs(v)));
  return m;
}

// A leaf used three times (as a tied embedding is: source, target, output projection) is
// announced once, after its last accumulation, with its whole gradient; a leaf the graph
// does not reach is never announced.
TEST(GradReadyHook, ALeafUsedSeveralTimesIsReadyAfterItsLastUse) {
  Generator g(1);
  Tensor w = Tensor::randn({4, 4}, g), unused = Tensor::randn({3}, g);
  w.set_requires_grad(true);
  unused.set_requires_grad(true);
  Tensor x = Tensor::randn({2, 4}, g);
  Tensor loss = fn::sum(fn::linear(fn::linear(fn::linear(x, w, Tensor()), w, Tensor()), w, Tensor()));
  std::vector<const TensorImpl*> announced;
  std::vector<Tensor> grad_then;
  {
    autograd::GradReadyScope scope([&](const TensorImpl* leaf) {
      announced.push_back(leaf);
      grad_then.push_back(w.grad().clone());
    });
    loss.backward();
  }
  ASSERT_EQ(announced.size(), 1u);
  EXPECT_EQ(announced[0], w.impl_ptr().get());
  EXPECT_EQ(grad_then[0].to_vector<float>(), w.grad().to_vector<float>()) << "announced before its last accumulation";
  EXPECT_FALSE(unused.grad().defined());
}

// Counts the all-reduces handed to it and passes them on.
struct Recorder final : dist::Communicator {
  explicit Recorder(dist::Communicator& inner) : inner(inner) {}
  int rank() const override { return inner.rank(); }
  int size() const override { return inner.size(); }
  int local_rank() const override { return inner.local_rank(); }
  int local_size() const override { return inner.local_size(); }
  std::string backend() const override { return "recorder"; }
  void all_reduce(Tensor& t, dist::ReduceOp op) override {
    {
      std::lock_guard<std::mutex> l(mu);
      sizes.push_back(t.numel());
    }
    cv.notify_all();
    inner.all_reduce(t, op);
  }
  void broadcast(Tensor& t, int root) override { inner.broadcast(t, root); }
  void barrier() override { inner.barrier(); }
  std::vector<std::string> all_gather(const std::string& b) override { return inner.all_gather(b); }
  dist::Communicator& inner;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> sizes;
};

struct TwoLayers {
  explicit TwoLayers(Generator& g) : first(32, 64, true, g), last(64, 16, true, g) {}
  std::vector<Tensor> params() {
    auto p = first.parameters(), q = last.parameters();
    p.insert(p.end(), q.begin(), q.end());
    return p;
  }
  nn::Linear first, last;
};

}  // namespace

// The overlap: backward reaches the last layer first, and its bucket is handed to the
// communicator while the first layer's gradients do not exist yet. A probe between the
// layers, whose backward runs after the last layer's and before the first's, waits for
// the hand-over and looks at the first layer's gradient.
TEST(GradSync, TheLastLayersBucketIsAllReducedBeforeTheFirstLayersGradientExists) {
  auto group = dist::make_thread_group(1);
  Recorder rec(*group[0]);
  Generator g(2);
  TwoLayers m(g);
  optim::SGD opt(m.params(), 0.1);
  opt.set_bucket_caps(size_t(1) << 20, 64 * 16 * 4 + 16 * 4);  // the last layer's bucket, then the first's
  opt.zero_grad();
  ASSERT_EQ(opt.grad_buckets().buckets().size(), 2u);
  const int64_t last_numel = 64 * 16 + 16;
  ASSERT_EQ(opt.grad_buckets().buckets()[0].flat.numel(), last_numel);
  bool handed_over = false;
  double first_grad_then = -1;
  Tensor h = fn::relu(m.first.forward(Tensor::randn({8, 32}, g)));
  Tensor probed = Tensor::empty(h.shape());
  {
    probed.copy_(h);
    autograd::record_function("probe", {h}, {&probed}, {},
                              [&](const autograd::Tensors& go, const autograd::Tensors&, const autograd::Node&) {
      std::unique_lock<std::mutex> l(rec.mu);
      handed_over = rec.cv.wait_for(l, std::chrono::seconds(20), [&] { return !rec.sizes.empty(); });
      first_grad_then = amax(m.first.weight.grad());
      return autograd::Tensors{go[0]};
    });
  }
  Tensor loss = fn::sum(m.last.forward(probed));
  dist::GradSync sync(rec, {});
  sync.begin(opt.grad_buckets(), opt.params());
  sync.backward(loss);
  sync.finish();
  EXPECT_TRUE(handed_over) << "the last layer's bucket was not handed over during backward";
  EXPECT_EQ(first_grad_then, 0.0) << "the first layer's gradient existed before the hand-over";
  ASSERT_EQ(rec.sizes.size(), 2u);
  EXPECT_EQ(rec.sizes[0], last_numel);
  EXPECT_GT(amax(m.first.weight.grad()), 0.0);
  EXPECT_EQ(sync.stats().buckets_launched_in_backward, 2);
  EXPECT_EQ(sync.stats().last_step_bytes, int64_t(opt.grad_buckets().bytes()));
}

// Two ranks as threads, each with its own data: after the sync every rank holds the sum
// of both ranks' gradients, the same with and without overlap; with bf16 on the wire,
// each rank's gradient rounded to bf16, summed in f32 and rounded once, in half the bytes.
TEST(GradSync, EveryRankEndsWithTheSumOfTheRanksGradients) {
  auto bf16 = [](float v) { return bf16_to_float(float_to_bf16(v)); };
  for (auto [overlap, dtype] : {std::pair{true, DType::f32}, {false, DType::f32}, {true, DType::bf16}}) {
    auto group = dist::make_thread_group(2);
    std::vector<std::vector<float>> synced(2), local(2);
    std::vector<int64_t> sent(2), bucket_bytes(2);
    auto rank_main = [&](int r) {
      Generator g(7);  // the same weights on both ranks
      TwoLayers m(g);
      optim::SGD opt(m.params(), 0.1);
      opt.set_bucket_caps(4096, 1024);
      Generator data(100 + uint64_t(r));
      Tensor x = Tensor::randn({4, 32}, data);
      auto loss = [&] { return fn::sum(m.last.forward(fn::relu(m.first.forward(x)))); };
      opt.zero_grad();
      loss().backward();
      local[size_t(r)] = m.first.weight.grad().to_vector<float>();
      opt.zero_grad();
      dist::GradSync sync(*group[size_t(r)], {overlap, dtype});
      sync.begin(opt.grad_buckets(), opt.params());
      sync.backward(loss());
      sync.finish();
      synced[size_t(r)] = m.first.weight.grad().to_vector<float>();
      sent[size_t(r)] = sync.stats().last_step_bytes;
      bucket_bytes[size_t(r)] = int64_t(opt.grad_buckets().bytes());
    };
    std::thread t1(rank_main, 1);
    rank_main(0);
    t1.join();
    const std::string what = std::string("overlap ") + (overlap ? "on" : "off") + ", " + dtype_name(dtype);
    EXPECT_EQ(synced[0], synced[1]) << what;
    EXPECT_EQ(sent[0], dtype == DType::f32 ? bucket_bytes[0] : bucket_bytes[0] / 2) << what;
    for (size_t i = 0; i < synced[0].size(); ++i) {
      if (dtype == DType::f32) ASSERT_NEAR(synced[0][i], local[0][i] + local[1][i], 1e-5) << i << " " << what;
      else ASSERT_EQ(synced[0][i], bf16(bf16(local[0][i]) + bf16(local[1][i]))) << i << " " << what;
    }
  }
}

namespace {

// An enqueuing communicator (as NCCL's) of one rank, whose all-reduces "land" only at
// join(): each unjoined tensor is doubled there, as if a second rank had the same
// gradients. It records the order of the calls.
struct Enqueuing final : dist::Communicator {
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "enqueuing"; }
  bool enqueues() const override { return true; }
  void all_reduce(Tensor&, dist::ReduceOp) override { calls.push_back("all_reduce"); }
  void all_reduce_unjoined(Tensor& t, dist::ReduceOp) override {
    calls.push_back("unjoined " + std::to_string(t.numel()));
    in_flight.push_back(t);
  }
  void join() override {
    calls.push_back("join");
    for (Tensor& t : in_flight) ops::call(ops::scale, t, t, 2.0);
    in_flight.clear();
  }
  void broadcast(Tensor&, int) override {}
  void barrier() override {}
  std::vector<std::string> all_gather(const std::string& b) override { return {b}; }
  std::vector<std::string> calls;
  std::vector<Tensor> in_flight;
};

}  // namespace

// On an enqueuing communicator (NCCL) every bucket is all-reduced without the compute
// stream waiting for it, during backward, and the stream waits once, after backward
// (Note [NCCL stream ordering]); a bf16 wire is widened back into the buckets after
// that wait, never before it.
TEST(GradSync, AnEnqueuingCommunicatorIsJoinedOnceAfterBackward) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Enqueuing comm;
    Generator g(3);
    TwoLayers m(g);
    optim::SGD opt(m.params(), 0.1);
    opt.set_bucket_caps(size_t(1) << 20, 64 * 16 * 4 + 16 * 4);  // the last layer's bucket, then the first's
    Tensor x = Tensor::randn({8, 32}, g);
    auto loss = [&] { return fn::sum(m.last.forward(fn::relu(m.first.forward(x)))); };
    opt.zero_grad();
    loss().backward();
    const auto local = m.first.weight.grad().to_vector<float>();
    opt.zero_grad();
    dist::GradSync sync(comm, {true, dtype});
    sync.begin(opt.grad_buckets(), opt.params());
    sync.backward(loss());
    EXPECT_EQ(comm.calls, (std::vector<std::string>{"unjoined 1040", "unjoined 2112"})) << dtype_name(dtype);
    sync.finish();
    EXPECT_EQ(comm.calls.back(), "join") << dtype_name(dtype);
    EXPECT_EQ(comm.calls.size(), 3u) << dtype_name(dtype);
    EXPECT_EQ(sync.stats().buckets_launched_in_backward, 2);
    const auto synced = m.first.weight.grad().to_vector<float>();
    for (size_t i = 0; i < local.size(); ++i) {
      const float want = dtype == DType::f32 ? 2 * local[i] : 2 * bf16_to_float(float_to_bf16(local[i]));
      ASSERT_EQ(synced[i], want) << i << " " << dtype_name(dtype);
    }
  }
}

namespace {

// A thread rank whose communicator says it enqueues, as NCCL's does: the strategy then
// takes GPU ranks' path (Note [Deferred reads across ranks]) on the CPU.
struct EnqueuingRank final : dist::Communicator {
  explicit EnqueuingRank(dist::Communicator& inner) : inner(inner) {}
  int rank() const override { return inner.rank(); }
  int size() const override { return inner.size(); }
  int local_rank() const override { return inner.local_rank(); }
  int local_size() const override { return inner.local_size(); }
  std::string backend() const override { return "enqueuing"; }
  bool enqueues() const override { return true; }
  void all_reduce(Tensor& t, dist::ReduceOp op) override { inner.all_reduce(t, op); }
  void broadcast(Tensor& t, int root) override { inner.broadcast(t, root); }
  void barrier() override { inner.barrier(); }
  std::vector<std::string> all_gather(const std::string& b) override { return inner.all_gather(b); }
  dist::Communicator& inner;
};

struct RankSteps {
  std::vector<double> losses;
  std::vector<bool> deferred;
  std::vector<float> weights;
};

// Four steps of two thread ranks; at step 2 rank 1 has no sample, at step 3 its loss is
// NaN when `nan`.
std::vector<RankSteps> two_ranks_train(bool enqueuing, bool nan) {
  auto group = dist::make_thread_group(2);
  std::vector<RankSteps> out(2);
  auto rank_main = [&](int r) {
    EnqueuingRank wrapped(*group[size_t(r)]);
    dist::Communicator& comm = enqueuing ? static_cast<dist::Communicator&>(wrapped) : *group[size_t(r)];
    dist::Strategy dp(comm, "cpu", {});
    Generator g(7);  // the same weights on both ranks
    TwoLayers m(g);
    optim::SGD opt(m.params(), 0.05, {0.9});
    opt.set_bucket_caps(4096, 1024);
    Generator data(100 + uint64_t(r));
    for (int step = 0; step < 4; ++step) {
      const int64_t samples = r == 1 && step == 2 ? 0 : 3 + r;
      Tensor loss;
      if (samples > 0) {
        Tensor x = Tensor::randn({samples, 32}, data);
        loss = fn::scale(fn::sum(fn::relu(m.last.forward(fn::relu(m.first.forward(x))))), 1.0 / double(samples));
        if (nan && r == 1 && step == 3) loss = fn::scale(loss, NAN);
      }
      dist::StepResult s = dp.step(loss, samples, opt, step, 0.0);
      out[size_t(r)].deferred.push_back(s.deferred);
      out[size_t(r)].losses.push_back(s.deferred ? s.loss_later.value() : s.loss);
      if (s.not_finite != dist::StepResult::NotFinite::none) break;
    }
    out[size_t(r)].weights = m.first.weight.to_vector<float>();
  };
  std::thread t1(rank_main, 1);
  rank_main(0);
  t1.join();
  return out;
}

}  // namespace

// Ranks whose gradients travel on an enqueuing communicator (GPU ranks, NCCL) read no
// loss in the step: the global mean comes all-reduced with the gradients, the same on
// every rank, and trains the same weights as ranks that read it; a NaN on one rank
// reaches every rank's reading, so all of them stop at that step.
TEST(Strategy, EnqueuingRanksReadTheGlobalLossLateAndTrainAsRanksThatReadIt) {
  const auto read = two_ranks_train(false, false), late = two_ranks_train(true, false);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(read[size_t(r)].deferred, std::vector<bool>(4, false)) << r;
    EXPECT_EQ(late[size_t(r)].deferred, std::vector<bool>(4, true)) << r;
    EXPECT_EQ(late[size_t(r)].weights, read[size_t(r)].weights) << "rank " << r;
    ASSERT_EQ(late[size_t(r)].losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_NEAR(late[size_t(r)].losses[i], read[size_t(r)].losses[i], 1e-6 * std::abs(read[0].losses[i])) << i;
  }
  EXPECT_EQ(late[0].losses, late[1].losses) << "the ranks read different global losses";
  EXPECT_EQ(late[0].weights, late[1].weights);

  const auto stopped = two_ranks_train(true, true);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(stopped[size_t(r)].losses.size(), 4u) << r;
    EXPECT_TRUE(std::isnan(stopped[size_t(r)].losses[3])) << "rank " << r << " did not see rank 1's NaN";
    EXPECT_EQ(stopped[size_t(r)].losses[2], late[size_t(r)].losses[2]);
  }
}
