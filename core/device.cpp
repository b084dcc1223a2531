// Device queries and raw copies. The only core file that branches on EG_WITH_CUDA
// besides the CUDA context and allocator.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/gpu_info.h"
#include "core/tensor.h"
#ifdef EG_WITH_CUDA
#include "core/cuda_context.h"
#endif

namespace eg {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    const std::string n = s.substr(5);
    char* end = nullptr;
    long i = n.empty() ? -1 : std::strtol(n.c_str(), &end, 10);
    if (!n.empty() && end && *end == '\0' && i >= 0) return cuda(int(i));
  }
  EG_THROW("unknown device '", s, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

bool built_with_cuda() {
#ifdef EG_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef EG_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

int cuda_compute_capability(int index) {
#ifdef EG_WITH_CUDA
  return index < cuda_device_count() ? cuda::compute_capability(index) : 0;
#else
  (void)index;
  return 0;
#endif
}

std::string cuda_device_name(int index) {
#ifdef EG_WITH_CUDA
  return index < cuda_device_count() ? cuda::device_name(index) : "";
#else
  (void)index;
  return "";
#endif
}

namespace {
std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{[] {
    const char* e = std::getenv("EG_ALLOW_TF32");
    return e && std::string(e) == "1";
  }()};
  return flag;
}
std::atomic<bool>& winograd_flag() {
  static std::atomic<bool> flag{[] {
    const char* e = std::getenv("EG_CPU_WINOGRAD");
    return !(e && std::string(e) == "0");
  }()};
  return flag;
}
std::atomic<CpuLayout>& layout_setting() {
  static std::atomic<CpuLayout> setting{[] {
    const char* e = std::getenv("EG_CPU_LAYOUT");
    const std::string v = e ? e : "";
    if (v.empty() || v == "auto") return CpuLayout::automatic;
    if (v == "blocked") return CpuLayout::blocked;
    EG_CHECK(v == "nhwc", "EG_CPU_LAYOUT must be auto, blocked or nhwc, got '", v, "'");
    return CpuLayout::nhwc;
  }()};
  return setting;
}
}  // namespace

void set_cpu_layout(CpuLayout layout) { layout_setting().store(layout); }
CpuLayout cpu_layout() { return layout_setting().load(); }
const char* cpu_layout_name(CpuLayout layout) {
  switch (layout) {
    case CpuLayout::automatic: return "auto";
    case CpuLayout::blocked: return "blocked";
    case CpuLayout::nhwc: return "nhwc";
  }
  return "?";
}

void set_allow_tf32(bool on) { tf32_flag().store(on); }
bool allow_tf32() { return tf32_flag().load(); }
void set_cpu_winograd(bool on) { winograd_flag().store(on); }
bool cpu_winograd() { return winograd_flag().load(); }

namespace {
thread_local int64_t g_host_syncs = 0;
thread_local Device g_training_device = Device::cpu();
}  // namespace
int64_t host_syncs() { return g_host_syncs; }
void count_host_sync() { ++g_host_syncs; }
Device set_training_device(Device d) {
  const Device prev = g_training_device;
  g_training_device = d;
  return prev;
}
bool host_is_training_device() { return g_training_device.is_cpu(); }

void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t n) {
  if (n == 0) return;
  if (dd.is_cpu() && sd.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
#ifdef EG_WITH_CUDA
  cuda::memcpy(dst, dd, src, sd, n);
#else
  EG_THROW("this build of egeria has no CUDA support (copy between ", sd.str(), " and ", dd.str(), ")");
#endif
}

void Tensor::zero_() {
  if (nbytes() == 0) return;
  if (device().is_cpu()) {
    std::memset(raw_any(), 0, nbytes());  // zero in any format
  } else {
#ifdef EG_WITH_CUDA
    cuda::memset_zero(raw_any(), nbytes(), device());  // zero in any format
#endif
  }
  ++impl().version;
}

#ifndef EG_WITH_CUDA
Allocator& cuda_allocator(int) { EG_THROW("this build of egeria has no CUDA support; rebuild with -DEG_CUDA=ON"); }
Allocator& pinned_allocator() { return cpu_allocator(); }
#endif

}  // namespace eg
