// Data-parallel training's one interface to the other processes (ranks): who this
// process is, and the collectives the training loop needs. Four implementations:
//   local  - world size 1, every collective the identity (a plain `egeria train`);
//   MPI    - OpenMPI's MPI_COMM_WORLD, CPU tensors (dist/mpi.cpp), when a launcher
//            (mpirun, srun) started the process;
//   thread group - N ranks as threads of one process, for unit tests (a test double);
//   NCCL   - CUDA tensors between GPU ranks, bootstrapped over MPI (dist/nccl.cpp).
// Every call is collective: all ranks make it, in the same order, with tensors of the
// same shape and dtype. Failures throw eg::Error naming the call.
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace eg::dist {

enum class ReduceOp { sum, max, min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's index among the ranks on its machine, and their number (one GPU each).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  virtual std::string backend() const = 0;  // "local", "mpi", "threads", "nccl"
  // True when a collective on a device tensor only enqueues the work on the device,
  // ordered after what the current stream has issued and before what it issues next
  // (NCCL): the host need not wait, nor call it from a thread of its own.
  virtual bool enqueues() const { return false; }

  // In place, over every rank's `t` (contiguous CPU f32, f64, s64 or bf16; with NCCL, CUDA
  // tensors of this rank's GPU too). bf16 values are combined in f32 and rounded to bf16
  // (by MPI at each step of its algorithm; by NCCL as it does).
  virtual void all_reduce(Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  // The same, for an enqueuing communicator, without making the current stream wait for
  // it: kernels issued after it (the rest of backward) run beside the all-reduce, and the
  // current stream waits for every one left unjoined at join(). `t` must not be written
  // meanwhile, nor its result read before join(). A host communicator reduces at once
  // and join() has nothing to do. Note [NCCL stream ordering] in dist/nccl.cpp.
  virtual void all_reduce_unjoined(Tensor& t, ReduceOp op = ReduceOp::sum) { all_reduce(t, op); }
  virtual void join() {}
  // Device seconds the current stream stood waiting in join() so far, timed by events and
  // read one join late (a join still running is counted at the next), and how many
  // joins that covers. 0 on a host communicator, whose waits the host times itself.
  virtual double join_wait_seconds() const { return 0; }
  virtual int64_t joins_timed() const { return 0; }
  // `t` becomes rank `root`'s.
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // Every rank's bytes, in rank order (small host data: decisions, layout hashes).
  virtual std::vector<std::string> all_gather(const std::string& bytes) = 0;
};

// World size 1.
std::unique_ptr<Communicator> make_local();

// N ranks as threads of this process, sharing a rendezvous: make_thread_group(n)[r] is
// rank r's communicator, to be used by one thread each.
std::vector<std::unique_ptr<Communicator>> make_thread_group(int n);

// True when an MPI launcher's environment is present (OMPI_COMM_WORLD_SIZE, PMI_SIZE,
// PMIX_RANK, MPI_LOCALNRANKS): only then is MPI initialised, so a plain run never
// calls MPI_Init (nor brings MPI's own allocations into a sanitizer build's tests).
bool launched_by_mpi();

// MPI_COMM_WORLD: initialises MPI (thread level MULTIPLE, errors returned, not fatal) on
// first use, and finalises it at exit. Throws when this build or process has no MPI.
std::unique_ptr<Communicator> make_mpi();

// CUDA tensors through NCCL on `device` (one GPU per rank), bootstrapped over `host`,
// which also carries host data and CPU tensors. Throws in a build without CUDA.
std::unique_ptr<Communicator> make_nccl(Communicator& host, Device device);

// The process's communicator: MPI under a launcher, else local. Made on first use.
Communicator& world();

// A process's failure, reported: "PROGRAM: error (rank R of N): WHAT" on stderr (the
// rank named under a launcher), and under several ranks the whole job ended at once
// (abort_job), since the others may be waiting for this one in a collective. Returns the
// exit status (1) for a single process.
int fail_process(const std::string& program, const std::exception& e);

// Ends every rank of the job now (MPI_Abort under MPI; exit otherwise): a rank that
// failed must not leave the others waiting in a collective.
[[noreturn]] void abort_job(int code);

}  // namespace eg::dist
