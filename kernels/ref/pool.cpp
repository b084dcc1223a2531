// Pooling, reference: 2-D max pooling (s32 argmax indices, flat h*W+w within the input
// plane; the first maximum in row-major window order wins), 2-D average pooling
// (count_include_pad or not), global average pooling, and their backward passes.
// Layout: NCHW contiguous; x [N, C, H, W], y [N, C, P, Q] (global: y [N, C]).
// f32 and f64; bf16 and f16 through the f64 path.
#include <algorithm>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

// The window of output (p, q), clipped to the input: rows [h0, h1), cols [w0, w1).
struct Window {
  int64_t h0, h1, w0, w1;
};
Window window(const ops::Pool2dParams& p, int64_t H, int64_t W, int64_t op, int64_t oq) {
  const int64_t hs = op * p.stride_h - p.pad_h, ws = oq * p.stride_w - p.pad_w;
  return {std::max<int64_t>(hs, 0), std::min(hs + p.kernel_h, H), std::max<int64_t>(ws, 0),
          std::min(ws + p.kernel_w, W)};
}

int64_t avg_divisor(const ops::Pool2dParams& p, const Window& win) {
  return p.count_include_pad ? p.kernel_h * p.kernel_w : (win.h1 - win.h0) * (win.w1 - win.w0);
}

template <class T>
void pool_fwd(const Tensor& x, Tensor& y, Tensor& indices, const ops::Pool2dParams& p) {
  const int64_t planes = x.size(0) * x.size(1), H = x.size(2), W = x.size(3), P = y.size(2), Q = y.size(3);
  const bool is_max = p.kind == ops::PoolKind::max;
  int32_t* ip = is_max && indices.defined() ? indices.data<int32_t>() : nullptr;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xi = x.data<T>() + pl * H * W;
    T* yo = y.data<T>() + pl * P * Q;
    for (int64_t op = 0; op < P; ++op)
      for (int64_t oq = 0; oq < Q; ++oq) {
        const Window win = window(p, H, W, op, oq);
        if (is_max) {
          int64_t best = win.h0 * W + win.w0;
          for (int64_t h = win.h0; h < win.h1; ++h)
            for (int64_t w = win.w0; w < win.w1; ++w)
              if (xi[h * W + w] > xi[best]) best = h * W + w;
          yo[op * Q + oq] = xi[best];
          if (ip) ip[pl * P * Q + op * Q + oq] = int32_t(best);
        } else {
          T sum = 0;
          for (int64_t h = win.h0; h < win.h1; ++h)
            for (int64_t w = win.w0; w < win.w1; ++w) sum += xi[h * W + w];
          yo[op * Q + oq] = sum / T(avg_divisor(p, win));
        }
      }
  }
}

template <class T>
void pool_bwd(const Tensor& dy, const Tensor& indices, Tensor& dx, const ops::Pool2dParams& p) {
  const int64_t planes = dx.size(0) * dx.size(1), H = dx.size(2), W = dx.size(3), P = dy.size(2), Q = dy.size(3);
  T* dxp = dx.data<T>();
  std::fill(dxp, dxp + dx.numel(), T(0));
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* dyo = dy.data<T>() + pl * P * Q;
    T* dxi = dxp + pl * H * W;
    for (int64_t op = 0; op < P; ++op)
      for (int64_t oq = 0; oq < Q; ++oq) {
        const T g = dyo[op * Q + oq];
        if (p.kind == ops::PoolKind::max) {
          dxi[indices.data<int32_t>()[pl * P * Q + op * Q + oq]] += g;
          continue;
        }
        const Window win = window(p, H, W, op, oq);
        const T share = g / T(avg_divisor(p, win));
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) dxi[h * W + w] += share;
      }
  }
}

template <class T>
void gap_fwd(const Tensor& x, Tensor& y) {
  const int64_t planes = x.size(0) * x.size(1), L = x.size(2) * x.size(3);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xi = x.data<T>() + pl * L;
    double sum = 0;
    for (int64_t i = 0; i < L; ++i) sum += double(xi[i]);
    y.data<T>()[pl] = T(sum / double(L));
  }
}

template <class T>
void gap_bwd(const Tensor& dy, Tensor& dx) {
  const int64_t planes = dx.size(0) * dx.size(1), L = dx.size(2) * dx.size(3);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T g = T(double(dy.data<T>()[pl]) / double(L));
    std::fill(dx.data<T>() + pl * L, dx.data<T>() + (pl + 1) * L, g);
  }
}

}  // namespace

// 16-bit tensors (Note [bf16 kernels]): the f64 path, each output rounded once.
void pool2d_fwd(const Tensor& x, Tensor& y, Tensor& indices, const ops::Pool2dParams& p) {
  if (is_half(x.dtype()) || is_half(y.dtype())) {
    Tensor y64 = wide_like(y);
    pool_fwd<double>(widened(x), y64, indices, p);
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) pool_fwd<double>(x, y, indices, p);
  else pool_fwd<float>(x, y, indices, p);
}

void pool2d_bwd(const Tensor& dy, const Tensor& indices, Tensor& dx, const ops::Pool2dParams& p) {
  if (is_half(dy.dtype()) || is_half(dx.dtype())) {
    Tensor dx64 = wide_like(dx);
    pool_bwd<double>(widened(dy), indices, dx64, p);
    return narrowed_into(dx64, dx);
  }
  if (dy.dtype() == DType::f64) pool_bwd<double>(dy, indices, dx, p);
  else pool_bwd<float>(dy, indices, dx, p);
}

void global_avgpool_fwd(const Tensor& x, Tensor& y) {
  if (is_half(x.dtype()) || is_half(y.dtype())) {
    Tensor y64 = wide_like(y);
    gap_fwd<double>(widened(x), y64);
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) gap_fwd<double>(x, y);
  else gap_fwd<float>(x, y);
}

void global_avgpool_bwd(const Tensor& dy, Tensor& dx) {
  if (is_half(dy.dtype()) || is_half(dx.dtype())) {
    Tensor dx64 = wide_like(dx);
    gap_bwd<double>(widened(dy), dx64);
    return narrowed_into(dx64, dx);
  }
  if (dy.dtype() == DType::f64) gap_bwd<double>(dy, dx);
  else gap_bwd<float>(dy, dx);
}

}  // namespace eg::ref
