// CUDA graphs (Note [Device graphs] in core/device_graph.h).
#include "core/device_graph.h"

#include <atomic>
#include <string>

#include "core/allocator.h"
#include "core/error.h"
#ifdef EG_WITH_CUDA
#include "core/cuda_context.h"
#endif

namespace eg {

GraphPool::GraphPool(Allocator& alloc) : alloc_(alloc), id_(alloc.create_pool()) {}

GraphPool::~GraphPool() {
  try {
    alloc_.release_pool(id_);
  } catch (...) {  // a destructor cannot throw: the pool's blocks stay where they are
  }
}

size_t GraphPool::bytes() const { return alloc_.pool_bytes(id_); }

namespace {
std::atomic<uint64_t> g_next_capture{1};
}  // namespace

struct DeviceGraph::Impl {
  std::shared_ptr<GraphPool> pool;
  uint64_t capture = g_next_capture++;  // its name in the pool (Note [Private pools])
  int64_t replays = 0;
#ifdef EG_WITH_CUDA
  cudaGraphExec_t exec = nullptr;
#endif
};

DeviceGraph::DeviceGraph(Device device, std::shared_ptr<GraphPool> pool)
    : device_(device), impl_(std::make_unique<Impl>()) {
  EG_CHECK(device.is_cuda(), "CUDA graphs run on a GPU, not on ", device.str());
#ifdef EG_WITH_CUDA
  Allocator& alloc = cuda_allocator(device.index);
  EG_CHECK(!pool || &pool->allocator() == &alloc, "internal: a graph on ", device.str(),
           " captures into a pool of another device's allocator");
  impl_->pool = pool ? std::move(pool) : std::make_shared<GraphPool>(alloc);
#else
  (void)pool;
  EG_THROW("CUDA graphs need a build with CUDA (this egeria was built without it)");
#endif
}

DeviceGraph::~DeviceGraph() {
  // A destructor cannot throw (it may run while an error unwinds, a sticky device error
  // among them): CUDA's results are left to the next check, the pool's release is tried.
  try {
#ifdef EG_WITH_CUDA
    if (impl_->exec) {
      // Replays still queued read the pool's blocks: they finish before the blocks are the
      // shared cache's.
      count_host_sync();
      (void)cudaSetDevice(device_.index);
      (void)cudaStreamSynchronize(cuda::current_stream(device_.index));
      (void)cudaGraphExecDestroy(impl_->exec);
      (void)cudaGetLastError();
    }
#endif
    if (impl_->pool) {
      // What only this graph used leaves the pool; the pool itself goes with its last holder.
      impl_->pool->allocator().end_capture(impl_->pool->id(), impl_->capture);
      impl_->pool.reset();
    }
  } catch (...) {
  }
}

bool DeviceGraph::captured() const {
#ifdef EG_WITH_CUDA
  return impl_->exec != nullptr;
#else
  return false;
#endif
}

int64_t DeviceGraph::replays() const { return impl_->replays; }

size_t DeviceGraph::pool_bytes() const { return impl_->pool ? impl_->pool->bytes() : 0; }

const std::shared_ptr<GraphPool>& DeviceGraph::pool() const { return impl_->pool; }

void DeviceGraph::capture(const std::function<void()>& body) {
  EG_CHECK(!captured(), "internal: a DeviceGraph is captured once");
#ifdef EG_WITH_CUDA
  cuda::set_device(device_.index);
  const cudaStream_t stream = cuda::current_stream(device_.index);
  // The thread's library handles exist before the capture: making one (cublasCreate,
  // cudnnCreate, the cuBLAS workspace's cudaMalloc) is no call a capture allows.
  (void)cuda::cublas_handle();
  (void)cuda::cudnn_handle();
  // Nothing goes back to the system while a pool fills (Note [Private pools]), so the
  // shared cache's idle blocks go now: blocks of other batch shapes' eager steps would
  // otherwise leave the capture's new ones no room.
  Allocator& alloc = impl_->pool->allocator();
  alloc.empty_cache();
  // Kernels the capture's tensors' blocks last served run before the capture's own.
  alloc.begin_pool(impl_->pool->id(), impl_->capture);
  cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    alloc.end_pool();
    (void)cudaGetLastError();
    EG_THROW("cannot start capturing a CUDA graph on cuda:", device_.index, ": ", cudaGetErrorString(e));
  }
  cudaGraph_t graph = nullptr;
  auto abandon = [&] {  // the stream out of capture mode, this thread out of the pool
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    alloc.end_pool();
  };
  try {
    body();
  } catch (const std::exception& ex) {
    abandon();
    EG_THROW("while capturing a CUDA graph on cuda:", device_.index, ": ", ex.what());
  } catch (...) {
    abandon();
    throw;
  }
  e = cudaStreamEndCapture(stream, &graph);
  alloc.end_pool();
  if (e != cudaSuccess) {
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    EG_THROW("capturing a CUDA graph on cuda:", device_.index, " failed: ", cudaGetErrorString(e),
             " (the captured work did what a capture forbids: a host sync, a copy from pageable memory, or work on "
             "a stream not ordered into the capture)");
  }
  // Auto-free on launch: memory a library allocated inside the capture (cudaMallocAsync)
  // is freed before each relaunch, as PyTorch instantiates its graphs.
  e = cudaGraphInstantiateWithFlags(&impl_->exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  (void)cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    impl_->exec = nullptr;
    (void)cudaGetLastError();
    EG_THROW("instantiating a CUDA graph on cuda:", device_.index, " failed: ", cudaGetErrorString(e));
  }
#else
  (void)body;
#endif
}

void DeviceGraph::replay() {
  EG_CHECK(captured(), "internal: replay of a DeviceGraph not captured");
#ifdef EG_WITH_CUDA
  cuda::set_device(device_.index);
  EG_CUDA_CHECK(cudaGraphLaunch(impl_->exec, cuda::current_stream(device_.index)));
  ++impl_->replays;
#endif
}

}  // namespace eg
