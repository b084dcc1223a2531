// CUDA execution context (internal; never included by public headers): the current
// stream per device, cuBLAS/cuDNN handles bound to it, and the status-check macros.
// Library code never synchronises on the hot path; EG_SYNC_DEBUG=1 in the environment
// makes eg::cuda::after_launch() synchronise and check after every kernel.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "core/device.h"
#include "core/error.h"

namespace eg::cuda {

const char* cublas_status_string(cublasStatus_t s);

int device_count();  // 0 when there is no driver or no device
int compute_capability(int device);  // major * 10 + minor, e.g. 90 for an H100
std::string device_name(int device);  // "NVIDIA H100 80GB HBM3"
// The stream this thread's work on `device` goes to (-1: the current device): the
// device's compute stream, or the side stream the thread has borrowed there.
cudaStream_t current_stream(int device = -1);
cublasHandle_t cublas_handle();  // for the current device, bound to current_stream()
cudnnHandle_t cudnn_handle();
// Lends this thread a side stream of `device` (made current), returned, until
// return_side_stream() on the same thread: eg::SideStream's implementation (Note [Side
// streams] in core/side_stream.h).
cudaStream_t borrow_side_stream(int device);
void return_side_stream() noexcept;
void set_device(int device);
void memcpy(void* dst, Device dd, const void* src, Device sd, size_t n);
void memset_zero(void* p, size_t n, Device d);
void synchronize();  // current stream; for tests, tools and D2H reads
void after_launch(const char* what);  // checks the launch; syncs when EG_SYNC_DEBUG=1
// [N, C, L] <-> [N, L, C] of `elem`-byte elements (2 or 4) on the current stream: a
// tensor to and from NHWC (Note [Channels-last activations on CUDA] in core/tensor.h;
// defined in kernels/cuda/layout.cu).
void reorder_nhwc(const void* src, void* dst, int64_t n, int64_t c, int64_t l, size_t elem, bool to_nhwc);

}  // namespace eg::cuda

// A failed CUDA call also sets the thread's last error, which the next launch check
// (after_launch) would report as its kernel's: it is cleared here, where it is reported
// (a sticky error, a kernel's fault, stays: every later call reports it).
#define EG_CUDA_CHECK(expr)                                                                              \
  do {                                                                                                   \
    const cudaError_t eg_cuda_status_ = (expr);                                                          \
    if (eg_cuda_status_ != cudaSuccess) {                                                                \
      (void)cudaGetLastError();                                                                          \
      ::eg::detail::throw_error(__FILE__, __LINE__,                                                      \
                                ::eg::detail::concat(#expr, ": ", cudaGetErrorString(eg_cuda_status_))); \
    }                                                                                                    \
  } while (0)
#define EG_CUDNN_CHECK(expr) EG_CHECK_GEN(expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)
#define EG_CUBLAS_CHECK(expr) EG_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS, ::eg::cuda::cublas_status_string)
