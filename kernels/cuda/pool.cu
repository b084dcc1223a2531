// Pooling on CUDA, f32: max pooling writing s32 argmax indices (flat h*W+w within the
// input plane, first maximum wins, as ref), its backward by atomic scatter; average
// pooling (count_include_pad as ops.h says) and its backward as a gather; global
// average pooling. One thread per output (forward) or input (avg backward) element.
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

// ---- kernels
namespace {
struct PoolGeom {
  int64_t n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  bool include_pad;
};

__global__ void maxpool_fwd_kernel(const float* x, float* y, int32_t* idx, PoolGeom g) {
  EG_CUDA_LOOP(i, g.n * g.c * g.oh * g.ow) {
    const int64_t ox = i % g.ow, oy = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const float* in = x + plane * g.h * g.w;
    float best = -INFINITY;
    int32_t arg = -1;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t yy = oy * g.sh - g.ph + ky;
      if (yy < 0 || yy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t xx = ox * g.sw - g.pw + kx;
        if (xx < 0 || xx >= g.w) continue;
        const float v = in[yy * g.w + xx];
        if (v > best || arg < 0) best = v, arg = int32_t(yy * g.w + xx);
      }
    }
    y[i] = best;
    idx[i] = arg;
  }
}
__global__ void maxpool_bwd_kernel(const float* dy, const int32_t* idx, float* dx, PoolGeom g) {
  EG_CUDA_LOOP(i, g.n * g.c * g.oh * g.ow) {
    const int64_t plane = i / (g.ow * g.oh);
    if (idx[i] >= 0) atomicAdd(&dx[plane * g.h * g.w + idx[i]], dy[i]);
  }
}
__device__ __forceinline__ float avg_divisor(const PoolGeom& g, int64_t oy, int64_t ox) {
  if (g.include_pad) return float(g.kh * g.kw);
  const int64_t y0 = max(oy * g.sh - g.ph, int64_t(0)), y1 = min(oy * g.sh - g.ph + g.kh, g.h);
  const int64_t x0 = max(ox * g.sw - g.pw, int64_t(0)), x1 = min(ox * g.sw - g.pw + g.kw, g.w);
  return float(max((y1 - y0) * (x1 - x0), int64_t(1)));
}
__global__ void avgpool_fwd_kernel(const float* x, float* y, PoolGeom g) {
  EG_CUDA_LOOP(i, g.n * g.c * g.oh * g.ow) {
    const int64_t ox = i % g.ow, oy = (i / g.ow) % g.oh, plane = i / (g.ow * g.oh);
    const float* in = x + plane * g.h * g.w;
    float s = 0.f;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t yy = oy * g.sh - g.ph + ky;
      if (yy < 0 || yy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t xx = ox * g.sw - g.pw + kx;
        if (xx >= 0 && xx < g.w) s += in[yy * g.w + xx];
      }
    }
    y[i] = s / avg_divisor(g, oy, ox);
  }
}
__global__ void avgpool_bwd_kernel(const float* dy, float* dx, PoolGeom g) {
  EG_CUDA_LOOP(i, g.n * g.c * g.h * g.w) {
    const int64_t xx = i % g.w, yy = (i / g.w) % g.h, plane = i / (g.w * g.h);
    float s = 0.f;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      const int64_t ky = yy + g.ph - oy * g.sh;
      if (ky < 0 || ky >= g.kh) continue;
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const int64_t kx = xx + g.pw - ox * g.sw;
        if (kx >= 0 && kx < g.kw) s += dy[(plane * g.oh + oy) * g.ow + ox] / avg_divisor(g, oy, ox);
      }
    }
    dx[i] = s;
  }
}
__global__ void gap_fwd_kernel(const float* x, float* y, int64_t planes, int64_t hw) {
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) s += x[p * hw + i];
    s = block_sum(s);
    if (threadIdx.x == 0) y[p] = s / float(hw);
  }
}
__global__ void gap_bwd_kernel(const float* dy, float* dx, int64_t planes, int64_t hw) {
  EG_CUDA_LOOP(i, planes * hw) dx[i] = dy[i / hw] / float(hw);
}
PoolGeom geom(const Shape& x, const Shape& y, const ops::Pool2dParams& p) {
  return {x[0],
          x[1],
          x[2],
          x[3],
          y[2],
          y[3],
          p.kernel_h,
          p.kernel_w,
          p.stride_h,
          p.stride_w,
          p.pad_h,
          p.pad_w,
          p.count_include_pad};
}
}  // namespace

// ---- launchers
void pool2d_fwd(const Tensor& x, Tensor& y, Tensor& indices, const ops::Pool2dParams& p) {
  require_f32(x, "pool2d");
  PoolGeom g = geom(x.shape(), y.shape(), p);
  const int64_t n = y.numel();
  if (!n) return;
  if (p.kind == ops::PoolKind::max)
    maxpool_fwd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x.data<float>(), y.data<float>(),
                                                                 indices.data<int32_t>(), g);
  else avgpool_fwd_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(x.data<float>(), y.data<float>(), g);
  cuda::after_launch("pool2d_fwd");
}

void pool2d_bwd(const Tensor& dy, const Tensor& indices, Tensor& dx, const ops::Pool2dParams& p) {
  require_f32(dy, "pool2d backward");
  PoolGeom g = geom(dx.shape(), dy.shape(), p);
  if (p.kind == ops::PoolKind::max) {
    EG_CUDA_CHECK(cudaMemsetAsync(dx.raw(), 0, dx.nbytes(), stream()));
    if (!dy.numel()) return;
    maxpool_bwd_kernel<<<blocks_for(dy.numel()), kThreads, 0, stream()>>>(dy.data<float>(), indices.data<int32_t>(),
                                                                          dx.data<float>(), g);
  } else {
    if (!dx.numel()) return;
    avgpool_bwd_kernel<<<blocks_for(dx.numel()), kThreads, 0, stream()>>>(dy.data<float>(), dx.data<float>(), g);
  }
  cuda::after_launch("pool2d_bwd");
}

void global_avgpool_fwd(const Tensor& x, Tensor& y) {
  require_f32(x, "global_avg_pool");
  const int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
  if (!planes) return;
  gap_fwd_kernel<<<unsigned(std::min<int64_t>(planes, 65535)), kThreads, 0, stream()>>>(x.data<float>(),
                                                                                        y.data<float>(), planes, hw);
  cuda::after_launch("global_avgpool_fwd");
}

void global_avgpool_bwd(const Tensor& dy, Tensor& dx) {
  require_f32(dy, "global_avg_pool backward");
  const int64_t planes = dx.size(0) * dx.size(1), hw = dx.size(2) * dx.size(3);
  if (!dx.numel()) return;
  gap_bwd_kernel<<<blocks_for(planes * hw), kThreads, 0, stream()>>>(dy.data<float>(), dx.data<float>(), planes, hw);
  cuda::after_launch("global_avgpool_bwd");
}

}  // namespace eg::cudak
