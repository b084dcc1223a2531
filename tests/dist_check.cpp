// dist/'s MPI communicator under a real launcher (tests/dist_test.sh runs it under
// mpirun -np 2): every collective against values known in advance, on every rank.
// With --throw-on-rank R, rank R fails before a barrier the others wait in: the job must
// end at once, naming the rank (dist::abort_job), not hang.
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "dist/communicator.h"

using namespace eg;

int main(int argc, char** argv) {
  int passed = 0, failed = 0, rank = -1;
  auto check = [&](bool ok, const std::string& what) {
    if (ok) return void(++passed);
    ++failed;
    std::printf("FAIL (rank %d): %s\n", rank, what.c_str());
  };
  try {
    const bool fail_mode = argc > 2 && std::strcmp(argv[1], "--throw-on-rank") == 0;
    check(dist::launched_by_mpi(), "no launcher environment seen");
    dist::Communicator& w = dist::world();
    rank = w.rank();
    const int n = w.size();
    if (fail_mode) {
      if (rank == std::atoi(argv[2])) EG_THROW("a test failure on rank ", rank);
      w.barrier();  // the failed rank never comes
      std::printf("rank %d passed a barrier that a failed rank never reached\n", rank);
      return 3;
    }
    check(w.backend() == "mpi", "backend " + w.backend());
    check(n == 2, "world size " + std::to_string(n));
    check(w.local_size() == n && w.local_rank() == rank, "local rank/size on one machine");
    Tensor f = Tensor::from_vector<float>({0.5f * float(rank + 1), float(rank)}, {2});
    w.all_reduce(f);
    check(f.to_vector<float>() == std::vector<float>{1.5f, 1.f}, "f32 sum");
    Tensor d = Tensor::from_vector<double>({double(rank), -double(rank)}, {2});
    w.all_reduce(d, dist::ReduceOp::max);
    check(d.to_vector<double>() == std::vector<double>{1.0, 0.0}, "f64 max");
    Tensor k = Tensor::from_vector<int64_t>({int64_t(rank) << 40, 7}, {2});
    w.all_reduce(k);
    check(k.to_vector<int64_t>() == std::vector<int64_t>{int64_t(1) << 40, 14}, "s64 sum");
    // bf16 (the gradient sync's wire format): summed in f32 and rounded to nearest even.
    Tensor h =
        Tensor::from_vector<float>({rank ? 3.f : 1.5f, rank ? 0.00390625f : 1.f, 0.00390625f}, {3}).to(DType::bf16);
    w.all_reduce(h);
    check(h.dtype() == DType::bf16 && h.to(DType::f32).to_vector<float>() == std::vector<float>{4.5f, 1.f, 0.0078125f},
          "bf16 sum (1 + 2^-8 rounds to 1)");
    Tensor big = Tensor::full({3 << 20}, float(rank + 1));
    w.all_reduce(big);
    check(big.to_vector<float>()[(3 << 20) - 1] == 3.f, "a 12 MB all-reduce");
    Tensor b = Tensor::from_vector<float>({float(rank * 9 + 1)}, {1});
    w.broadcast(b, 1);
    check(b.to_vector<float>()[0] == 10.f, "broadcast from rank 1");
    auto g = w.all_gather(std::string(size_t(rank + 1), char('a' + rank)));
    check(g == std::vector<std::string>{"a", "bb"}, "all_gather of unequal lengths");
    Tensor i32 = Tensor::zeros({2}, DType::s32);
    bool refused = false;
    try {
      w.all_reduce(i32);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("f32, f64, s64 or bf16") != std::string::npos;
    }
    check(refused, "an s32 all-reduce is a named error");
    w.barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_check (rank %d): error: %s\n", rank, e.what());
    dist::abort_job(1);
  }
  std::printf("dist_check rank %d: %d passed, %d failed\n", rank, passed, failed);
  return failed == 0 ? 0 : 1;
}
