// The NCCL communicator: CUDA tensors all-reduced by NCCL, one GPU per rank, bootstrapped
// over the host communicator (MPI); host data and CPU tensors go through the host
// communicator (dist/communicator.h).
//
// Note [NCCL stream ordering]
// NCCL works on a communication stream of its own. An all-reduce is ordered after the
// gradients it reads by an event recorded on the compute stream (the autograd engine's
// current stream) at the moment the bucket is complete, and the compute stream waits for
// an event recorded after the all-reduce, so the optimizer's kernels read the reduced
// gradients. Nothing blocks the host: enqueued() is true, and the gradient sync launches
// each bucket from the training thread as backward enqueues its last gradient.
#include "dist/communicator.h"

#ifdef EG_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

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
  }
  ~Nccl() override {
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
    if (t.device().is_cpu()) return host_.all_reduce(t, op);
    check_device(t, "all_reduce");
    before();
    EG_NCCL_CHECK(
        ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op), comm_, stream_));
    after();
  }
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
    EG_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(device_), done_, 0));
  }

  Communicator& host_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
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
