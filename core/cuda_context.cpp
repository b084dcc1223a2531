// CUDA execution context: per-device streams and library handles, copies, and the
// launch check. Only compiled in CUDA builds.
#include "core/cuda_context.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

namespace eg::cuda {

namespace {

// A stream and the library handles bound to it. The compute stream's is the device's
// one; side streams' (Note [Side streams] in core/side_stream.h) are lent to one thread at
// a time. Neither is ever destroyed: the caching allocator keys cached blocks by stream.
struct DeviceState {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
};

std::mutex g_mu;
std::vector<DeviceState>& states() {
  static std::vector<DeviceState> s(size_t(std::max(device_count(), 1)));
  return s;
}

int current_device() {
  int d = 0;
  EG_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

DeviceState& state(int device) {
  if (device < 0) device = current_device();
  auto& s = states();
  EG_CHECK(device < int(s.size()), "CUDA device ", device, " does not exist (", s.size(), " visible)");
  return s[size_t(device)];
}

// The side stream this thread has borrowed (device -1: none), and the idle ones by device.
struct SideLoan {
  int device = -1;
  DeviceState* state = nullptr;
};
thread_local SideLoan t_side;
std::vector<std::vector<DeviceState*>>& idle_side_states() {
  static auto* v = new std::vector<std::vector<DeviceState*>>(size_t(std::max(device_count(), 1)));
  return *v;  // never destroyed, as the streams in it
}

// The state work from this thread on `device` (-1: the current one) goes to; its stream
// exists on return. Called with g_mu held.
DeviceState& active_state_locked(int device) {
  if (device < 0) device = current_device();
  if (t_side.state && t_side.device == device) return *t_side.state;
  DeviceState& s = state(device);
  if (!s.stream) EG_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  return s;
}

// The handles of `s`, bound to its stream, made where missing (cuBLAS with a workspace of
// its own, set once: 32 MiB, NVIDIA's advice for Hopper; cuBLAS then allocates none
// inside a CUDA graph's capture, Note [Device graphs]. Kept as long as the handle, which
// is never destroyed).
void make_cublas(DeviceState& s) {
  if (s.cublas) return;
  EG_CUBLAS_CHECK(cublasCreate(&s.cublas));
  EG_CUBLAS_CHECK(cublasSetStream(s.cublas, s.stream));
  void* ws = nullptr;
  const size_t bytes = size_t(32) << 20;
  EG_CUDA_CHECK(cudaMalloc(&ws, bytes));
  EG_CUBLAS_CHECK(cublasSetWorkspace(s.cublas, ws, bytes));
}
void make_cudnn(DeviceState& s) {
  if (s.cudnn) return;
  EG_CUDNN_CHECK(cudnnCreate(&s.cudnn));
  EG_CUDNN_CHECK(cudnnSetStream(s.cudnn, s.stream));
}

bool sync_debug() {
  static const bool on = [] {
    const char* e = std::getenv("EG_SYNC_DEBUG");
    return e && std::string(e) == "1";
  }();
  return on;
}

}  // namespace

const char* cublas_status_string(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

int compute_capability(int device) {
  int major = 0, minor = 0;
  EG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  EG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  EG_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

int device_count() {
  // No driver (35) or no device (100) means "no GPU". cudaGetLastError clears the
  // error so it does not resurface at the next unrelated check.
  static const int n = [] {
    int c = 0;
    cudaError_t e = cudaGetDeviceCount(&c);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return c;
  }();
  return n;
}

cudaStream_t current_stream(int device) {
  EG_CHECK(device_count() > 0, "no CUDA GPU is available");
  std::lock_guard<std::mutex> l(g_mu);
  return active_state_locked(device).stream;
}

cublasHandle_t cublas_handle() {
  EG_CHECK(device_count() > 0, "no CUDA GPU is available");
  std::lock_guard<std::mutex> l(g_mu);
  DeviceState& s = active_state_locked(-1);
  make_cublas(s);
  return s.cublas;
}

cudnnHandle_t cudnn_handle() {
  EG_CHECK(device_count() > 0, "no CUDA GPU is available");
  std::lock_guard<std::mutex> l(g_mu);
  DeviceState& s = active_state_locked(-1);
  make_cudnn(s);
  return s.cudnn;
}

cudaStream_t borrow_side_stream(int device) {
  EG_CHECK(device_count() > 0, "no CUDA GPU is available");
  EG_CHECK(t_side.device < 0, "a thread borrows one side stream at a time (it has one on cuda:", t_side.device, ")");
  EG_CHECK(device >= 0 && device < device_count(), "CUDA device ", device, " does not exist (", device_count(),
           " visible)");
  set_device(device);
  DeviceState* s = nullptr;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto& idle = idle_side_states()[size_t(device)];
    if (!idle.empty()) {
      s = idle.back();
      idle.pop_back();
    }
  }
  if (!s) {
    // Made outside the lock: every launch of the training thread takes it to find its
    // stream, and a cuDNN handle takes long to make. The same default priority as the
    // compute stream: a higher one for training would also rank it above NCCL's kernels.
    auto made = std::make_unique<DeviceState>();
    EG_CUDA_CHECK(cudaStreamCreateWithFlags(&made->stream, cudaStreamNonBlocking));
    make_cublas(*made);
    make_cudnn(*made);
    s = made.release();  // never destroyed (see DeviceState)
  }
  std::lock_guard<std::mutex> l(g_mu);
  t_side = {device, s};
  return s->stream;
}

void return_side_stream() noexcept {
  std::lock_guard<std::mutex> l(g_mu);
  if (t_side.device < 0) return;
  idle_side_states()[size_t(t_side.device)].push_back(t_side.state);
  t_side = {};
}

void set_device(int device) { EG_CUDA_CHECK(cudaSetDevice(device)); }

void memcpy(void* dst, Device dd, const void* src, Device sd, size_t n) {
  const int dev = dd.is_cuda() ? dd.index : sd.index;
  set_device(dev);
  cudaStream_t st = current_stream(dev);
  cudaMemcpyKind kind =
      dd.is_cuda() ? (sd.is_cuda() ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice) : cudaMemcpyDeviceToHost;
  EG_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind, st));
  // The host may read (D2H) or free/reuse (H2D from pageable memory) its buffer as
  // soon as we return.
  if (kind != cudaMemcpyDeviceToDevice) EG_CUDA_CHECK(cudaStreamSynchronize(st));
}

void memset_zero(void* p, size_t n, Device d) {
  set_device(d.index);
  EG_CUDA_CHECK(cudaMemsetAsync(p, 0, n, current_stream(d.index)));
}

void synchronize() {
  count_host_sync();  // Note [Host syncs] in core/device.h
  EG_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

void after_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  EG_CHECK(e == cudaSuccess, "CUDA kernel ", what, " failed to launch: ", cudaGetErrorString(e));
  if (sync_debug()) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    EG_CUDA_CHECK(cudaStreamIsCapturing(current_stream(), &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return;  // a capture runs nothing (Note [Device graphs])
    e = cudaStreamSynchronize(current_stream());
    EG_CHECK(e == cudaSuccess, "CUDA kernel ", what, " failed: ", cudaGetErrorString(e), " (EG_SYNC_DEBUG=1)");
  }
}

}  // namespace eg::cuda
