// Activations on CUDA: relu, relu6, gelu (erf form) and their backward; each operand
// f32, bf16 or f16, computed in f32 (Note [16-bit CUDA kernels]).
// One thread per element; bandwidth-bound (8 B/elem forward, 12 B/elem backward:
// ~0.3 ms for 128x16x32x32 at ~3 TB/s on an H100). In any layout (Note [Channels-last
// activations on CUDA]): y in x's, dy converted to x's.
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

// ---- kernels
namespace {
__global__ void act_fwd_kernel(int act, const void* x, int tx, void* y, int ty, int64_t n) {
  EG_CUDA_LOOP(i, n) {
    const float v = ld(x, tx, i);
    st(y, ty, i,
       act == 0   ? fmaxf(v, 0.f)
       : act == 1 ? (v < 0.f ? 0.f : (v > 6.f ? 6.f : v))  // ref's (a NaN stays NaN)
                  : 0.5f * v * (1.f + erff(v * 0.70710678f)));
  }
}
// ReLU's and ReLU6's gradients are a select (ref's): 0 outside the linear range, even for
// a NaN or Inf dy.
__global__ void act_bwd_kernel(int act, const void* dy, int tdy, const void* x, int tx, void* dx, int tdx, int64_t n) {
  EG_CUDA_LOOP(i, n) {
    const float v = ld(x, tx, i);
    float r;
    if (act == 0) r = v > 0.f ? ld(dy, tdy, i) : 0.f;
    else if (act == 1) r = (v > 0.f && v < 6.f) ? ld(dy, tdy, i) : 0.f;
    else r = ld(dy, tdy, i) * (0.5f * (1.f + erff(v * 0.70710678f)) + v * expf(-0.5f * v * v) * 0.39894228f);
    st(dx, tdx, i, r);
  }
}
}  // namespace

// ---- launchers
void act_fwd(ops::Act a, const Tensor& x, Tensor& y) {
  const int tx = dt_code(x, "activation"), ty = dt_code(y, "activation");
  y.set_format(x.format());
  const int64_t n = x.numel();
  if (!n) return;
  act_fwd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(int(a), x.raw_any(), tx, y.raw_any(), ty, n);
  cuda::after_launch("act_fwd");
}

void act_bwd(ops::Act a, const Tensor& dy_in, const Tensor& x, Tensor& dx) {
  const char* op = "activation backward";
  const Tensor dy = dy_in.to_format(x.format());
  dx.set_format(x.format());
  const int tdy = dt_code(dy, op), tx = dt_code(x, op), tdx = dt_code(dx, op);
  const int64_t n = x.numel();
  if (!n) return;
  act_bwd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(int(a), dy.raw_any(), tdy, x.raw_any(), tx, dx.raw_any(),
                                                           tdx, n);
  cuda::after_launch("act_bwd");
}

}  // namespace eg::cudak
