// The NCCL communicator: CUDA tensors all-reduced by NCCL, one GPU per rank, bootstrapped
// over the host communicator (MPI); host data and CPU tensors go through the host
// communicator (dist/communicator.h).
//
// Note [NCCL stream ordering]
// NCCL works on a communication stream of its own. An all-reduce is ordered after the
// gradients it reads by an event recorded on the compute stream (the autograd engine's
// current stream) at the moment the bucket is complete. all_reduce() then makes the
// compute stream wait for an event recorded after it; the gradient sync's buckets use
// all_reduce_unjoined() instead, so the rest of backward runs beside them, and join(),
// after backward, makes the compute stream wait once, for the last of them (the
// communication stream runs them in order): the optimizer's kernels read the reduced
// gradients. Nothing blocks the host: enqueues() is true, and the gradient sync launches
// each bucket from the training thread as backward enqueues its last gradient.
// join() is timed by a pair of timing events around the compute stream's wait, read at
// a later join once they have completed (a query, never a host sync).
#include "dist/communicator.h"

#ifdef EG_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <array>
#include <cstring>

#include "core/cuda_context.h"

#define EG_NCCL_CHECK(expr) EG_CHECK_GEN(expr, ncclSuccess, ncclGetErrorString)

namespace eg::dist {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::s64: return ncclInt64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    default: EG_THROW("NCCL collectives take f32, f64, f16, bf16 or s64 tensors, got ", dtype_name(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : op == ReduceOp::max ? ncclMax : ncclMin; }

class Nccl final : public Communicator {
 public:
  Nccl(Communicator& host, Device device) : host_(host), device_(device.index) {
    EG_CHECK(device.is_cuda(), "NCCL communicates between CUDA devices, not ", device.str());
    cuda::set_device(device_);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (host.rank() == 0) EG_NCCL_CHECK(ncclGetUniqueId(&id));
    const auto all = host.all_gather(std::string(reinterpret_cast<const char*>(&id), sizeof id));
    EG_CHECK(all[0].size() == sizeof id, "NCCL bootstrap: rank 0 sent ", all[0].size(), " bytes of unique id");
    std::memcpy(&id, all[0].data(), sizeof id);
    EG_NCCL_CHECK(ncclCommInitRank(&comm_, host.size(), id, host.rank()));
    EG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    EG_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    EG_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    for (JoinTimer& t : timers_) {
      EG_CUDA_CHECK(cudaEventCreate(&t.start));
      EG_CUDA_CHECK(cudaEventCreate(&t.end));
    }
  }
  ~Nccl() override {
    for (JoinTimer& t : timers_) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.end);
    }
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  int local_rank() const override { return host_.local_rank(); }
  int local_size() const override { return host_.local_size(); }
  std::string backend() const override { return "nccl"; }
  bool enqueues() const override { return true; }

  void all_reduce(Tensor& t, ReduceOp op) override {
    all_reduce_unjoined(t, op);
    if (!t.device().is_cpu()) wait_done();
  }
  void all_reduce_unjoined(Tensor& t, ReduceOp op) override {
    if (t.device().is_cpu()) return host_.all_reduce(t, op);
    check_device(t, "all_reduce");
    before();
    EG_NCCL_CHECK(
        ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), comm_, stream_));
    EG_CUDA_CHECK(cudaEventRecord(done_, stream_));
    unjoined_ = true;
  }
  void join() override {
    if (!unjoined_) return;
    const cudaStream_t compute = cuda::current_stream(device_);
    JoinTimer& t = timers_[next_timer_];
    next_timer_ = (next_timer_ + 1) % timers_.size();
    harvest(t);  // before its events are recorded again
    EG_CUDA_CHECK(cudaEventRecord(t.start, compute));
    EG_CUDA_CHECK(cudaStreamWaitEvent(compute, done_, 0));
    EG_CUDA_CHECK(cudaEventRecord(t.end, compute));
    t.recorded = true;
    unjoined_ = false;
    for (JoinTimer& o : timers_) harvest(o);  // the earlier joins that have completed
  }
  double join_wait_seconds() const override { return wait_seconds_; }
  int64_t joins_timed() const override { return joins_timed_; }
  void broadcast(Tensor& t, int root) override {
    if (t.device().is_cpu()) return host_.broadcast(t, root);
    check_device(t, "broadcast");
    EG_CHECK(root >= 0 && root < size(), "broadcast: no rank ", root, " in a world of ", size());
    before();
    EG_NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), t.nbytes(), ncclUint8, root, comm_, stream_));
    after();
  }
  void barrier() override { host_.barrier(); }
  std::vector<std::string> all_gather(const std::string& bytes) override { return host_.all_gather(bytes); }

 private:
  void check_device(const Tensor& t, const char* call) const {
    EG_CHECK(t.device().index == device_, call, ": a tensor on ", t.device().str(), ", but this rank's NCCL ",
             "communicator is on cuda:", device_);
  }
  // See Note [NCCL stream ordering].
  void before() {
    EG_CUDA_CHECK(cudaEventRecord(ready_, cuda::current_stream(device_)));
    EG_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  void after() {
    EG_CUDA_CHECK(cudaEventRecord(done_, stream_));
    wait_done();
  }
  // The compute stream waits for the last collective (and so, the stream running in
  // order, for every one all_reduce_unjoined left): an untimed join.
  void wait_done() {
    EG_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(device_), done_, 0));
    unjoined_ = false;
  }
  // A timed join's wait, once both its events have completed; a join still running is
  // left for a later call, and one whose events are about to be recorded again uncounted.
  struct JoinTimer {
    cudaEvent_t start = nullptr, end = nullptr;
    bool recorded = false;
  };
  void harvest(JoinTimer& t) {
    if (!t.recorded) return;
    const cudaError_t q = cudaEventQuery(t.end);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not ready is no error
      return;
    }
    EG_CUDA_CHECK(q);
    float ms = 0;
    EG_CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.end));
    wait_seconds_ += double(ms) / 1e3;
    ++joins_timed_;
    t.recorded = false;
  }

  Communicator& host_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  bool unjoined_ = false;  // an all-reduce the compute stream has not been made to wait for
  std::array<JoinTimer, 4> timers_;
  size_t next_timer_ = 0;
  double wait_seconds_ = 0;
  int64_t joins_timed_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl(Communicator& host, Device device) {
  return std::make_unique<Nccl>(host, device);
}

}  // namespace eg::dist

#else  // a build without CUDA

#include "core/error.h"

namespace eg::dist {

std::unique_ptr<Communicator> make_nccl(Communicator&, Device) {
  EG_THROW(
      "data-parallel training on GPUs needs NCCL, and this build of egeria has no CUDA (rebuild with -DEG_CUDA=ON)");
}

}  // namespace eg::dist

#endif
