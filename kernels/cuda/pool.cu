// Pooling on CUDA: max pooling writing s32 argmax indices (flat h*W+w within the input
// plane, first maximum wins, as ref), its backward gathering each input's share from the
// outputs whose windows hold it (no atomics: the ref's order, any dtype); average
// pooling (count_include_pad as ops.h says) and its backward as a gather; global
// average pooling. One thread per output (forward) or input (backward) element, or per
// 8 channels of one for NHWC max pooling (maxpool_fwd_kernel<I, 8>). f32, or
// 16-bit x and y (dy and dx) computed in f32 (Note [16-bit CUDA kernels]); NCHW, or NHWC
// as the convolutions around them hand it (Note [Channels-last activations on CUDA]:
// ResNet's stem pool and head would otherwise reorder 100M-value activations, and cast
// them to f32 and back).
#include "kernels/cuda/common.cuh"

namespace eg::cudak {

// ---- kernels
namespace {
struct PoolGeom {
  int64_t n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  bool include_pad, nhwc;
};

// The offset of (n, ch, y, x) in an [N, C, H, W] tensor held in g's layout.
__device__ __forceinline__ int64_t at(const PoolGeom& g, int64_t n, int64_t ch, int64_t y, int64_t x, int64_t H,
                                      int64_t W) {
  return g.nhwc ? ((n * H + y) * W + x) * g.c + ch : ((n * g.c + ch) * H + y) * W + x;
}
// Element i of such a tensor -> (n, ch, y, x), dividing in I: uint32_t where every
// tensor of the call has fewer than 2^31 elements (a 64-bit division is several times
// the instructions, and these kernels do three per element).
template <class I>
__device__ __forceinline__ void coords(const PoolGeom& g, int64_t i64, int64_t H, int64_t W, int64_t& n, int64_t& ch,
                                       int64_t& y, int64_t& x) {
  I i = I(i64);
  const I c = I(g.c), h = I(H), w = I(W);
  if (g.nhwc) {
    ch = int64_t(i % c), i /= c, x = int64_t(i % w), i /= w, y = int64_t(i % h), n = int64_t(i / h);
  } else {
    x = int64_t(i % w), i /= w, y = int64_t(i % h), i /= h, ch = int64_t(i % c), n = int64_t(i / c);
  }
}
// The outputs whose windows hold input row (or column) v: [first, last].
__device__ __forceinline__ void covering(int64_t v, int64_t pad, int64_t k, int64_t stride, int64_t outs,
                                         int64_t& first, int64_t& last) {
  const int64_t lo = v + pad - k + 1;
  first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  last = min((v + pad) / stride, outs - 1);
}

// Max pooling: a thread per output (forward) or input (backward) value, or, with V = 8, per
// 8 channels of one (NHWC with C a multiple of 8 and every operand 16-byte aligned: a
// 16-bit network's stem pool, 64 channels), so that the index arithmetic is done once
// per 8 values and values and indices move in 16- and 32-byte accesses (Note [Vector
// loads]); per channel the same comparisons and sums in the same order either way.
//
// Vector t of an NHWC tensor of H x W pixels and cv vectors a pixel -> (n, y, x, vector).
template <class I>
__device__ __forceinline__ void pixel_vector(int64_t t, int64_t cv, int64_t H, int64_t W, int64_t& n, int64_t& y,
                                             int64_t& x, int64_t& v) {
  I r = I(t);
  v = int64_t(r % I(cv)), r /= I(cv);
  x = int64_t(r % I(W)), r /= I(W);
  y = int64_t(r % I(H)), n = int64_t(r / I(H));
}
// Thread t's (n, first channel, y, x) in a tensor of H x W pixels.
template <class I, int V>
__device__ __forceinline__ void thread_coords(const PoolGeom& g, int64_t t, int64_t H, int64_t W, int64_t& n,
                                              int64_t& ch, int64_t& y, int64_t& x) {
  if constexpr (V == 1) {
    coords<I>(g, t, H, W, n, ch, y, x);
  } else {
    int64_t v;
    pixel_vector<I>(t, g.c / V, H, W, n, y, x, v);
    ch = v * V;
  }
}
template <int V>
__device__ __forceinline__ void ld_idx(const int32_t* idx, int64_t i, int32_t (&k)[V]) {
  if constexpr (V == 1) {
    k[0] = idx[i];
  } else {
    const int4* q = reinterpret_cast<const int4*>(idx + i);
    const int4 a = q[0], b = q[1];
    k[0] = a.x, k[1] = a.y, k[2] = a.z, k[3] = a.w, k[4] = b.x, k[5] = b.y, k[6] = b.z, k[7] = b.w;
  }
}
template <int V>
__device__ __forceinline__ void st_idx(int32_t* idx, int64_t i, const int32_t (&k)[V]) {
  if constexpr (V == 1) {
    idx[i] = k[0];
  } else {
    int4* q = reinterpret_cast<int4*>(idx + i);
    q[0] = make_int4(k[0], k[1], k[2], k[3]);
    q[1] = make_int4(k[4], k[5], k[6], k[7]);
  }
}

template <class I, int V>
__global__ void maxpool_fwd_kernel(const void* x, int tx, void* y, int ty, int32_t* idx, PoolGeom g) {
  EG_CUDA_LOOP(t, g.n * g.c * g.oh * g.ow / V) {  // output values t V ... t V + V - 1
    int64_t n, ch, oy, ox;
    thread_coords<I, V>(g, t, g.oh, g.ow, n, ch, oy, ox);
    float best[V];
    int32_t arg[V];
    for (int e = 0; e < V; ++e) best[e] = -INFINITY, arg[e] = -1;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t yy = oy * g.sh - g.ph + ky;
      if (yy < 0 || yy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t xx = ox * g.sw - g.pw + kx;
        if (xx < 0 || xx >= g.w) continue;
        float v[V];
        ldv<V>(x, tx, at(g, n, ch, yy, xx, g.h, g.w), v);
        const int32_t here = int32_t(yy * g.w + xx);
        for (int e = 0; e < V; ++e)
          if (v[e] > best[e] || arg[e] < 0) best[e] = v[e], arg[e] = here;
      }
    }
    stv<V>(y, ty, t * V, best);
    st_idx<V>(idx, t * V, arg);
  }
}
template <class I, int V>
__global__ void maxpool_bwd_kernel(const void* dy, int tdy, const int32_t* idx, void* dx, int tdx, PoolGeom g) {
  EG_CUDA_LOOP(t, g.n * g.c * g.h * g.w / V) {  // input values t V ... t V + V - 1
    int64_t n, ch, yy, xx, oy0, oy1, ox0, ox1;
    thread_coords<I, V>(g, t, g.h, g.w, n, ch, yy, xx);
    covering(yy, g.ph, g.kh, g.sh, g.oh, oy0, oy1);
    covering(xx, g.pw, g.kw, g.sw, g.ow, ox0, ox1);
    const int32_t me = int32_t(yy * g.w + xx);
    float s[V] = {};
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const int64_t o = at(g, n, ch, oy, ox, g.oh, g.ow);
        int32_t k[V];
        ld_idx<V>(idx, o, k);
        bool mine = false;
        for (int e = 0; e < V; ++e) mine |= k[e] == me;
        if (!mine) continue;  // no channel took its maximum here: dy unread
        float d[V];
        ldv<V>(dy, tdy, o, d);
        for (int e = 0; e < V; ++e)
          if (k[e] == me) s[e] += d[e];
      }
    stv<V>(dx, tdx, t * V, s);
  }
}
__device__ __forceinline__ float avg_divisor(const PoolGeom& g, int64_t oy, int64_t ox) {
  if (g.include_pad) return float(g.kh * g.kw);
  const int64_t y0 = max(oy * g.sh - g.ph, int64_t(0)), y1 = min(oy * g.sh - g.ph + g.kh, g.h);
  const int64_t x0 = max(ox * g.sw - g.pw, int64_t(0)), x1 = min(ox * g.sw - g.pw + g.kw, g.w);
  return float(max((y1 - y0) * (x1 - x0), int64_t(1)));
}
template <class I>
__global__ void avgpool_fwd_kernel(const void* x, int tx, void* y, int ty, PoolGeom g) {
  EG_CUDA_LOOP(i, g.n * g.c * g.oh * g.ow) {
    int64_t n, ch, oy, ox;
    coords<I>(g, i, g.oh, g.ow, n, ch, oy, ox);
    float s = 0.f;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t yy = oy * g.sh - g.ph + ky;
      if (yy < 0 || yy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t xx = ox * g.sw - g.pw + kx;
        if (xx >= 0 && xx < g.w) s += ld(x, tx, at(g, n, ch, yy, xx, g.h, g.w));
      }
    }
    st(y, ty, i, s / avg_divisor(g, oy, ox));
  }
}
template <class I>
__global__ void avgpool_bwd_kernel(const void* dy, int tdy, void* dx, int tdx, PoolGeom g) {
  EG_CUDA_LOOP(i, g.n * g.c * g.h * g.w) {
    int64_t n, ch, yy, xx, oy0, oy1, ox0, ox1;
    coords<I>(g, i, g.h, g.w, n, ch, yy, xx);
    covering(yy, g.ph, g.kh, g.sh, g.oh, oy0, oy1);
    covering(xx, g.pw, g.kw, g.sw, g.ow, ox0, ox1);
    float s = 0.f;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox)
        s += ld(dy, tdy, at(g, n, ch, oy, ox, g.oh, g.ow)) / avg_divisor(g, oy, ox);
    st(dx, tdx, i, s);
  }
}
// NCHW: a block per plane; NHWC: a thread per (n, channel), consecutive threads on
// consecutive channels of each row.
__global__ void gap_fwd_kernel(const void* x, int tx, void* y, int ty, int64_t planes, int64_t hw) {
  for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < hw; i += blockDim.x) s += ld(x, tx, p * hw + i);
    s = block_sum(s);
    if (threadIdx.x == 0) st(y, ty, p, s / float(hw));
  }
}
__global__ void gap_fwd_nhwc_kernel(const void* x, int tx, void* y, int ty, int64_t n, int64_t c, int64_t hw) {
  EG_CUDA_LOOP(p, n * c) {
    const int64_t b = p / c, ch = p - b * c;
    float s = 0.f;
    for (int64_t i = 0; i < hw; ++i) s += ld(x, tx, (b * hw + i) * c + ch);
    st(y, ty, p, s / float(hw));
  }
}
__global__ void gap_bwd_kernel(const void* dy, int tdy, void* dx, int tdx, int64_t c, int64_t hw, int64_t total,
                               bool nhwc) {
  EG_CUDA_LOOP(i, total) {
    const int64_t p = nhwc ? (i / (hw * c)) * c + i % c : i / hw;  // (n, channel) of element i
    st(dx, tdx, i, ld(dy, tdy, p) / float(hw));
  }
}
PoolGeom geom(const Shape& x, const Shape& y, const ops::Pool2dParams& p, bool nhwc) {
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
          p.count_include_pad,
          nhwc};
}
bool fits_32(const Tensor& a, const Tensor& b) { return std::max(a.numel(), b.numel()) < (int64_t(1) << 31); }
// 16-bit data computes in the layout it comes in (a 16-bit network's activations are
// NHWC), f32 data NCHW.
Format layout_for(const Tensor& t) { return compute_layout(t, t.dtype() != DType::f32); }
// f(std::integral_constant<int, V>) with V = 8 where max pooling can take 8 channels a
// thread (NHWC, C a multiple of 8, every operand 16-byte aligned), else 1.
template <class F>
void with_max_vectors(const PoolGeom& g, std::initializer_list<const void*> ps, F&& f) {
  if (g.nhwc && g.c % 8 == 0 && aligned16(ps)) f(std::integral_constant<int, 8>{});
  else f(std::integral_constant<int, 1>{});
}
}  // namespace

// ---- launchers
void pool2d_fwd(const Tensor& x_in, Tensor& y, Tensor& indices, const ops::Pool2dParams& p) {
  const char* op = "pool2d";
  const Format f = layout_for(x_in);
  const Tensor x = x_in.to_format(f);
  y.set_format(f);
  if (indices.defined()) indices.set_format(f);
  const PoolGeom g = geom(x.shape(), y.shape(), p, f == Format::nhwc);
  const int64_t n = y.numel();
  if (!n) return;
  const bool small = fits_32(x, y);
  if (p.kind == ops::PoolKind::max) {
    with_max_vectors(g, {x.raw_any(), y.raw_any(), indices.raw_any()}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      const auto k = small ? maxpool_fwd_kernel<uint32_t, V> : maxpool_fwd_kernel<int64_t, V>;
      k<<<blocks_for(n / V), kThreads, 0, stream()>>>(x.raw_any(), dt_code(x, op), y.raw_any(), dt_code(y, op),
                                                      indices.data_any<int32_t>(), g);
    });
  } else {
    const auto k = small ? avgpool_fwd_kernel<uint32_t> : avgpool_fwd_kernel<int64_t>;
    k<<<blocks_for(n), kThreads, 0, stream()>>>(x.raw_any(), dt_code(x, op), y.raw_any(), dt_code(y, op), g);
  }
  cuda::after_launch("pool2d_fwd");
}

void pool2d_bwd(const Tensor& dy_in, const Tensor& indices, Tensor& dx, const ops::Pool2dParams& p) {
  const char* op = "pool2d backward";
  // Max pooling's layout is its indices' (the forward's); average pooling's dy's.
  const Format f = p.kind == ops::PoolKind::max ? indices.format() : layout_for(dy_in);
  const Tensor dy = dy_in.to_format(f);
  dx.set_format(f);
  const PoolGeom g = geom(dx.shape(), dy.shape(), p, f == Format::nhwc);
  if (!dx.numel()) return;
  const bool small = fits_32(dx, dy);
  const int64_t n = dx.numel();
  if (p.kind == ops::PoolKind::max) {
    with_max_vectors(g, {dy.raw_any(), dx.raw_any(), indices.raw_any()}, [&](auto v) {
      constexpr int V = decltype(v)::value;
      const auto k = small ? maxpool_bwd_kernel<uint32_t, V> : maxpool_bwd_kernel<int64_t, V>;
      k<<<blocks_for(n / V), kThreads, 0, stream()>>>(dy.raw_any(), dt_code(dy, op), indices.data_any<int32_t>(),
                                                      dx.raw_any(), dt_code(dx, op), g);
    });
  } else {
    const auto k = small ? avgpool_bwd_kernel<uint32_t> : avgpool_bwd_kernel<int64_t>;
    k<<<blocks_for(n), kThreads, 0, stream()>>>(dy.raw_any(), dt_code(dy, op), dx.raw_any(), dt_code(dx, op), g);
  }
  cuda::after_launch("pool2d_bwd");
}

void global_avgpool_fwd(const Tensor& x_in, Tensor& y) {
  const char* op = "global_avg_pool";
  const Tensor x = x_in.to_format(layout_for(x_in));
  const int64_t n = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  if (!n || !c) return;
  if (x.format() == Format::nhwc)
    gap_fwd_nhwc_kernel<<<blocks_for(n * c), kThreads, 0, stream()>>>(x.raw_any(), dt_code(x, op), y.raw_any(),
                                                                      dt_code(y, op), n, c, hw);
  else
    gap_fwd_kernel<<<unsigned(std::min<int64_t>(n * c, 65535)), kThreads, 0, stream()>>>(
        x.raw_any(), dt_code(x, op), y.raw_any(), dt_code(y, op), n * c, hw);
  cuda::after_launch("global_avgpool_fwd");
}

// dx in the layout the convolutions before it use (16-bit: NHWC unless channels-last is
// off), so their batch norm's backward reads it as it comes.
void global_avgpool_bwd(const Tensor& dy, Tensor& dx) {
  const char* op = "global_avg_pool backward";
  const bool nhwc = dx.dtype() != DType::f32 && dx.nhwc_capable() && channels_last();
  dx.set_format(nhwc ? Format::nhwc : Format::plain);
  const int64_t c = dx.size(1), hw = dx.size(2) * dx.size(3);
  if (!dx.numel()) return;
  gap_bwd_kernel<<<blocks_for(dx.numel()), kThreads, 0, stream()>>>(dy.raw_any(), dt_code(dy, op), dx.raw_any(),
                                                                    dt_code(dx, op), c, hw, dx.numel(), nhwc);
  cuda::after_launch("global_avgpool_bwd");
}

}  // namespace eg::cudak
