// The local communicator, the thread-group test double, and the choice of the
// process's communicator (dist/communicator.h). MPI is in dist/mpi.cpp.
#include "dist/communicator.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace eg::dist {

namespace {

void check_reducible(const Tensor& t, const char* call) {
  EG_CHECK(t.device().is_cpu(), call, ": the tensor must be on the CPU, got ", t.device().str());
  EG_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64 || t.dtype() == DType::s64 || t.dtype() == DType::bf16,
           call, ": f32, f64, s64 or bf16 tensors, got ", dtype_name(t.dtype()));
}

class Local final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void all_reduce(Tensor& t, ReduceOp) override { check_reducible(t, "all_reduce"); }
  void broadcast(Tensor&, int root) override { EG_CHECK(root == 0, "broadcast: no rank ", root, " in a world of 1"); }
  void barrier() override {}
  std::vector<std::string> all_gather(const std::string& bytes) override { return {bytes}; }
};

// Ranks as threads: each collective is one exchange of every rank's bytes, between two
// rendezvous (the second keeps a fast rank from overwriting a slot another still reads).
struct Rendezvous {
  explicit Rendezvous(int n) : n(n), slots(size_t(n)) {}
  std::vector<std::string> exchange(int rank, std::string payload) {
    std::unique_lock<std::mutex> l(mu);
    slots[size_t(rank)] = std::move(payload);
    wait_all(l);
    std::vector<std::string> all = slots;
    wait_all(l);
    return all;
  }
  void wait_all(std::unique_lock<std::mutex>& l) {
    const int64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(l, [&] { return generation != gen; });
    }
  }
  const int n;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<std::string> slots;
};

template <class T>
T combine(T a, T b, ReduceOp op) {
  return op == ReduceOp::sum ? a + b : op == ReduceOp::max ? std::max(a, b) : std::min(a, b);
}

template <class T>
void reduce_into(T* out, const std::vector<std::string>& all, int64_t n, ReduceOp op) {
  // Every rank folds the contributions in rank order, so all ranks get the same bits.
  std::memcpy(out, all[0].data(), size_t(n) * sizeof(T));
  for (size_t r = 1; r < all.size(); ++r) {
    const T* in = reinterpret_cast<const T*>(all[r].data());
    for (int64_t i = 0; i < n; ++i) out[i] = combine(out[i], in[i], op);
  }
}

// bf16 values (the gradient sync's 16-bit wire format) are combined in f32, in rank
// order, and rounded once.
void reduce_bf16_into(bf16_t* out, const std::vector<std::string>& all, int64_t n, ReduceOp op) {
  auto at = [&](size_t r, int64_t i) { return bf16_to_float(reinterpret_cast<const bf16_t*>(all[r].data())[i]); };
  for (int64_t i = 0; i < n; ++i) {
    float acc = at(0, i);
    for (size_t r = 1; r < all.size(); ++r) acc = combine(acc, at(r, i), op);
    out[i] = float_to_bf16(acc);
  }
}

class ThreadRank final : public Communicator {
 public:
  ThreadRank(std::shared_ptr<Rendezvous> rv, int rank) : rv_(std::move(rv)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return rv_->n; }
  int local_rank() const override { return rank_; }
  int local_size() const override { return rv_->n; }
  std::string backend() const override { return "threads"; }
  void all_reduce(Tensor& t, ReduceOp op) override {
    check_reducible(t, "all_reduce");
    const auto all = rv_->exchange(rank_, bytes_of(t));
    for (auto& a : all) EG_CHECK(a.size() == all[0].size(), "all_reduce: the ranks' tensors differ in size");
    if (t.dtype() == DType::f32) reduce_into(t.data<float>(), all, t.numel(), op);
    if (t.dtype() == DType::f64) reduce_into(t.data<double>(), all, t.numel(), op);
    if (t.dtype() == DType::s64) reduce_into(t.data<int64_t>(), all, t.numel(), op);
    if (t.dtype() == DType::bf16) reduce_bf16_into(t.data<bf16_t>(), all, t.numel(), op);
  }
  void broadcast(Tensor& t, int root) override {
    EG_CHECK(root >= 0 && root < size(), "broadcast: no rank ", root, " in a world of ", size());
    const auto all = rv_->exchange(rank_, bytes_of(t));
    EG_CHECK(all[size_t(root)].size() == t.nbytes(), "broadcast: the ranks' tensors differ in size");
    std::memcpy(t.raw(), all[size_t(root)].data(), t.nbytes());
  }
  void barrier() override { rv_->exchange(rank_, {}); }
  std::vector<std::string> all_gather(const std::string& bytes) override { return rv_->exchange(rank_, bytes); }

 private:
  static std::string bytes_of(const Tensor& t) {
    EG_CHECK(t.device().is_cpu(), "thread-group collectives take CPU tensors");
    return std::string(static_cast<const char*>(t.raw()), t.nbytes());
  }
  std::shared_ptr<Rendezvous> rv_;
  int rank_;
};

}  // namespace

std::unique_ptr<Communicator> make_local() { return std::make_unique<Local>(); }

std::vector<std::unique_ptr<Communicator>> make_thread_group(int n) {
  EG_CHECK(n >= 1, "a thread group needs at least one rank, got ", n);
  auto rv = std::make_shared<Rendezvous>(n);
  std::vector<std::unique_ptr<Communicator>> g;
  for (int r = 0; r < n; ++r) g.push_back(std::make_unique<ThreadRank>(rv, r));
  return g;
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

int fail_process(const std::string& program, const std::exception& e) {
  std::string who;
  try {
    if (launched_by_mpi())
      who = " (rank " + std::to_string(world().rank()) + " of " + std::to_string(world().size()) + ")";
  } catch (const std::exception&) {  // MPI itself failed: the message says so
  }
  std::fprintf(stderr, "%s: error%s: %s\n", program.c_str(), who.c_str(), e.what());
  if (!who.empty() && world().size() > 1) abort_job(1);
  return 1;
}

Communicator& world() {
  static std::unique_ptr<Communicator> w = launched_by_mpi() ? make_mpi() : make_local();
  return *w;
}

}  // namespace eg::dist
