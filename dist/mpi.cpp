// The MPI communicator: OpenMPI's MPI_COMM_WORLD, CPU tensors (dist/communicator.h).
// MPI is initialised on first use with MPI_THREAD_MULTIPLE (a communication thread will
// call it beside the training thread) and errors returned rather than fatal, so that
// EG_MPI_CHECK turns them into eg::Error; it is finalised at exit.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "dist/communicator.h"

#ifdef EG_WITH_MPI
#include <mpi.h>

namespace eg::dist {

namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, size_t(len));
}
#define EG_MPI_CHECK(expr) EG_CHECK_GEN(expr, MPI_SUCCESS, mpi_error_string)

// MPI has no bf16: it travels as a 2-byte type of ours, reduced by ops of ours that
// combine in f32 and round back (made once MPI is initialised; MPI_Finalize frees them).
template <ReduceOp Op>
void bf16_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16_t* a = static_cast<const bf16_t*>(in);
  bf16_t* b = static_cast<bf16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    b[i] = float_to_bf16(Op == ReduceOp::sum ? x + y : Op == ReduceOp::max ? std::max(x, y) : std::min(x, y));
  }
}

struct Bf16Mpi {
  MPI_Datatype type;
  MPI_Op sum, max, min;
};

const Bf16Mpi& bf16_mpi() {
  static const Bf16Mpi b = [] {
    Bf16Mpi m{};
    EG_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &m.type));
    EG_MPI_CHECK(MPI_Type_commit(&m.type));
    EG_MPI_CHECK(MPI_Op_create(bf16_op<ReduceOp::sum>, 1, &m.sum));
    EG_MPI_CHECK(MPI_Op_create(bf16_op<ReduceOp::max>, 1, &m.max));
    EG_MPI_CHECK(MPI_Op_create(bf16_op<ReduceOp::min>, 1, &m.min));
    return m;
  }();
  return b;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::s64: return MPI_INT64_T;
    case DType::bf16: return bf16_mpi().type;
    default: EG_THROW("MPI collectives take f32, f64, s64 or bf16 tensors, got ", dtype_name(t));
  }
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  if (t == DType::bf16)
    return op == ReduceOp::sum ? bf16_mpi().sum : op == ReduceOp::max ? bf16_mpi().max : bf16_mpi().min;
  return op == ReduceOp::sum ? MPI_SUM : op == ReduceOp::max ? MPI_MAX : MPI_MIN;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Counts are ints in MPI: large tensors go in pieces.
constexpr int64_t kChunk = int64_t(1) << 30;

class Mpi final : public Communicator {
 public:
  Mpi() {
    int initialized = 0;
    EG_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) {
      int provided = 0;
      EG_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit(finalize_at_exit);
    }
    int level = 0;
    EG_MPI_CHECK(MPI_Query_thread(&level));
    // Collectives run on a thread of their own beside training: at least one thread at a time.
    EG_CHECK(level >= MPI_THREAD_SERIALIZED, "this MPI library gives thread level ", level,
             " (MPI_THREAD_SERIALIZED or more is needed, for a communication thread)");
    EG_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    EG_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    EG_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MPI_Comm local;
    EG_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
    EG_MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
    EG_MPI_CHECK(MPI_Comm_size(local, &local_size_));
    EG_MPI_CHECK(MPI_Comm_free(&local));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    EG_CHECK(t.device().is_cpu(), "all_reduce over MPI takes CPU tensors, got ", t.str());
    const MPI_Datatype type = mpi_type(t.dtype());
    char* p = static_cast<char*>(t.raw());
    for (int64_t done = 0; done < t.numel(); done += kChunk) {
      const int n = int(std::min(kChunk, t.numel() - done));
      EG_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + done * int64_t(dtype_size(t.dtype())), n, type,
                                 mpi_op(op, t.dtype()), MPI_COMM_WORLD));
    }
  }
  void broadcast(Tensor& t, int root) override {
    EG_CHECK(t.device().is_cpu(), "broadcast over MPI takes CPU tensors, got ", t.str());
    EG_CHECK(root >= 0 && root < size_, "broadcast: no rank ", root, " in a world of ", size_);
    char* p = static_cast<char*>(t.raw());
    const int64_t bytes = int64_t(t.nbytes());
    for (int64_t done = 0; done < bytes; done += kChunk)
      EG_MPI_CHECK(MPI_Bcast(p + done, int(std::min(kChunk, bytes - done)), MPI_BYTE, root, MPI_COMM_WORLD));
  }
  void barrier() override { EG_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }
  std::vector<std::string> all_gather(const std::string& bytes) override {
    EG_CHECK(bytes.size() < size_t(INT_MAX), "all_gather takes small host data, got ", bytes.size(), " bytes");
    std::vector<int> sizes(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
    const int mine = int(bytes.size());
    EG_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD));
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) offsets[size_t(r)] = int(total), total += sizes[size_t(r)];
    EG_CHECK(total < INT_MAX, "all_gather takes small host data, got ", total, " bytes in all");
    std::string all(size_t(total), '\0');
    EG_MPI_CHECK(MPI_Allgatherv(bytes.data(), mine, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE,
                                MPI_COMM_WORLD));
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r) out.push_back(all.substr(size_t(offsets[size_t(r)]), size_t(sizes[size_t(r)])));
    return out;
  }

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi() { return std::make_unique<Mpi>(); }

void abort_job(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  std::fflush(stdout);
  std::fflush(stderr);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace eg::dist

#else  // a build without MPI

namespace eg::dist {

std::unique_ptr<Communicator> make_mpi() {
  EG_THROW(
      "this process was started by an MPI launcher, but this build of egeria has no MPI (rebuild with "
      "Debian's libopenmpi-dev installed)");
}

void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace eg::dist

#endif
