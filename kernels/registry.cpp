// The one place that wires implementations to ops. Every op has all three: ref
// (ground truth), cpu (fast path) and, in CUDA builds, cuda.
#include <atomic>

#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"
#ifdef EG_WITH_CUDA
#include "kernels/cuda/cuda.h"
#endif

namespace eg::ops {

#ifdef EG_WITH_CUDA
#define EG_CUDA_IMPL(name) &cudak::name
#else
#define EG_CUDA_IMPL(name) nullptr
#endif

#define EG_DEFINE_OP(name, Fn) const Op<Fn> name{#name, {&ref::name, &cpu::name, EG_CUDA_IMPL(name)}};
EG_OP_LIST(EG_DEFINE_OP)
#undef EG_DEFINE_OP

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::ref: return "ref";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

namespace {
thread_local int g_forced = -1;
}
void set_forced_cpu_backend(int b) { g_forced = b; }
int forced_cpu_backend() { return g_forced; }

Backend pick_backend(bool has_cpu, const Tensor& key) {
  if (key.is_cuda()) return Backend::cuda;
  if (g_forced >= 0) return Backend(g_forced);
  return has_cpu && key.dtype() == DType::f32 ? Backend::cpu : Backend::ref;
}

}  // namespace eg::ops
