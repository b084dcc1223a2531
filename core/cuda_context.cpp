// CUDA execution context: per-device streams and library handles, copies, and the
// launch check. Only compiled in CUDA builds.
#include "core/cuda_context.h"

#include <cstdlib>
#include <mutex>
#include <vector>

namespace eg::cuda {

namespace {

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
  DeviceState& s = state(device);
  if (!s.stream) EG_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  return s.stream;
}

cublasHandle_t cublas_handle() {
  cudaStream_t st = current_stream();
  std::lock_guard<std::mutex> l(g_mu);
  DeviceState& s = state(-1);
  if (!s.cublas) {
    EG_CUBLAS_CHECK(cublasCreate(&s.cublas));
    EG_CUBLAS_CHECK(cublasSetStream(s.cublas, st));
    // A workspace of its own, set once (32 MiB, NVIDIA's advice for Hopper): cuBLAS then
    // allocates none inside a CUDA graph's capture (Note [Device graphs]). Kept as long as
    // the handle, which is never destroyed.
    void* ws = nullptr;
    const size_t bytes = size_t(32) << 20;
    EG_CUDA_CHECK(cudaMalloc(&ws, bytes));
    EG_CUBLAS_CHECK(cublasSetWorkspace(s.cublas, ws, bytes));
  }
  return s.cublas;
}

cudnnHandle_t cudnn_handle() {
  cudaStream_t st = current_stream();
  std::lock_guard<std::mutex> l(g_mu);
  DeviceState& s = state(-1);
  if (!s.cudnn) {
    EG_CUDNN_CHECK(cudnnCreate(&s.cudnn));
    EG_CUDNN_CHECK(cudnnSetStream(s.cudnn, st));
  }
  return s.cudnn;
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
