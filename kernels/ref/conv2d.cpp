// 2-D convolution, reference: forward, backward-data and backward-weight (+ bias grad)
// with stride, zero padding, dilation and groups (depthwise included).
// Layout: x [N, C, H, W], w [K, C/groups, R, S], y [N, K, P, Q], bias [K]; all NCHW,
// contiguous. f32 and f64, and bf16 through f64 (Note [bf16 kernels]). Plain loops; the
// weight gradient accumulates in double.
#include <algorithm>

#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

// Sizes of one convolution, unpacked once.
struct Geom {
  int64_t N, C, H, W, K, R, S, P, Q, G, Cg, Kg;
  int64_t sh, sw, ph, pw, dh, dw;
};

Geom geom(const Shape& x, const Shape& w, const Shape& y, const ops::Conv2dParams& p) {
  Geom g{};
  g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
  g.K = w[0], g.R = w[2], g.S = w[3], g.P = y[2], g.Q = y[3];
  g.G = p.groups, g.Cg = g.C / g.G, g.Kg = g.K / g.G;
  g.sh = p.stride_h, g.sw = p.stride_w, g.ph = p.pad_h, g.pw = p.pad_w, g.dh = p.dil_h, g.dw = p.dil_w;
  return g;
}

// Output positions o in [0, n_out) whose input position o*stride - pad + off lies in
// [0, n_in): returns [lo, hi).
std::pair<int64_t, int64_t> valid_range(int64_t n_out, int64_t n_in, int64_t stride, int64_t pad, int64_t off) {
  int64_t lo = 0, hi = n_out;
  while (lo < hi && lo * stride - pad + off < 0) ++lo;
  while (hi > lo && (hi - 1) * stride - pad + off >= n_in) --hi;
  return {lo, hi};
}

template <class T>
void fwd(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const ops::Conv2dParams& p) {
  const Geom g = geom(x.shape(), w.shape(), y.shape(), p);
  const T *xp = x.data<T>(), *wp = w.data<T>(), *bp = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = y.data<T>();
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t k = 0; k < g.K; ++k) {
      T* yo = yp + (n * g.K + k) * g.P * g.Q;
      std::fill(yo, yo + g.P * g.Q, bp ? bp[k] : T(0));
      const int64_t grp = k / g.Kg;
      for (int64_t c = 0; c < g.Cg; ++c) {
        const T* xi = xp + (n * g.C + grp * g.Cg + c) * g.H * g.W;
        for (int64_t r = 0; r < g.R; ++r) {
          auto [plo, phi] = valid_range(g.P, g.H, g.sh, g.ph, r * g.dh);
          for (int64_t s = 0; s < g.S; ++s) {
            auto [qlo, qhi] = valid_range(g.Q, g.W, g.sw, g.pw, s * g.dw);
            const T wv = wp[((k * g.Cg + c) * g.R + r) * g.S + s];
            for (int64_t pp = plo; pp < phi; ++pp) {
              const T* xr = xi + (pp * g.sh - g.ph + r * g.dh) * g.W - g.pw + s * g.dw;
              for (int64_t q = qlo; q < qhi; ++q) yo[pp * g.Q + q] += wv * xr[q * g.sw];
            }
          }
        }
      }
    }
}

template <class T>
void bwd_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ops::Conv2dParams& p) {
  const Geom g = geom(dx.shape(), w.shape(), dy.shape(), p);
  const T *dyp = dy.data<T>(), *wp = w.data<T>();
  T* dxp = dx.data<T>();
  std::fill(dxp, dxp + dx.numel(), T(0));
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t k = 0; k < g.K; ++k) {
      const T* dyo = dyp + (n * g.K + k) * g.P * g.Q;
      const int64_t grp = k / g.Kg;
      for (int64_t c = 0; c < g.Cg; ++c) {
        T* dxi = dxp + (n * g.C + grp * g.Cg + c) * g.H * g.W;
        for (int64_t r = 0; r < g.R; ++r) {
          auto [plo, phi] = valid_range(g.P, g.H, g.sh, g.ph, r * g.dh);
          for (int64_t s = 0; s < g.S; ++s) {
            auto [qlo, qhi] = valid_range(g.Q, g.W, g.sw, g.pw, s * g.dw);
            const T wv = wp[((k * g.Cg + c) * g.R + r) * g.S + s];
            for (int64_t pp = plo; pp < phi; ++pp) {
              T* dxr = dxi + (pp * g.sh - g.ph + r * g.dh) * g.W - g.pw + s * g.dw;
              for (int64_t q = qlo; q < qhi; ++q) dxr[q * g.sw] += wv * dyo[pp * g.Q + q];
            }
          }
        }
      }
    }
}

template <class T>
void bwd_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, const ops::Conv2dParams& p) {
  const Shape wshape = dw.defined() ? dw.shape() : Shape{dy.size(1), 0, 0, 0};
  const Geom g = geom(x.shape(), wshape, dy.shape(), p);
  const T *dyp = dy.data<T>(), *xp = x.data<T>();
  if (db.defined()) {
    T* dbp = db.data<T>();
    for (int64_t k = 0; k < g.K; ++k) {
      double acc = 0;
      for (int64_t n = 0; n < g.N; ++n) {
        const T* dyo = dyp + (n * g.K + k) * g.P * g.Q;
        for (int64_t i = 0; i < g.P * g.Q; ++i) acc += double(dyo[i]);
      }
      dbp[k] = T(acc);
    }
  }
  if (!dw.defined()) return;
  T* dwp = dw.data<T>();
  for (int64_t k = 0; k < g.K; ++k)
    for (int64_t c = 0; c < g.Cg; ++c)
      for (int64_t r = 0; r < g.R; ++r) {
        auto [plo, phi] = valid_range(g.P, g.H, g.sh, g.ph, r * g.dh);
        for (int64_t s = 0; s < g.S; ++s) {
          auto [qlo, qhi] = valid_range(g.Q, g.W, g.sw, g.pw, s * g.dw);
          double acc = 0;
          for (int64_t n = 0; n < g.N; ++n) {
            const T* dyo = dyp + (n * g.K + k) * g.P * g.Q;
            const T* xi = xp + (n * g.C + (k / g.Kg) * g.Cg + c) * g.H * g.W;
            for (int64_t pp = plo; pp < phi; ++pp) {
              const T* xr = xi + (pp * g.sh - g.ph + r * g.dh) * g.W - g.pw + s * g.dw;
              for (int64_t q = qlo; q < qhi; ++q) acc += double(dyo[pp * g.Q + q]) * double(xr[q * g.sw]);
            }
          }
          dwp[((k * g.Cg + c) * g.R + r) * g.S + s] = T(acc);
        }
      }
}

}  // namespace

void conv2d_fwd(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const ops::Conv2dParams& p) {
  if (is_half(x.dtype())) {  // Note [bf16 kernels]
    Tensor y64 = wide_like(y);
    fwd<double>(widened(x), widened(w), widened(bias), y64, p);
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) fwd<double>(x, w, bias, y, p);
  else fwd<float>(x, w, bias, y, p);
}

void conv2d_bwd_data(const Tensor& dy, const Tensor& w, Tensor& dx, const ops::Conv2dParams& p) {
  if (!dx.defined()) return;
  if (is_half(dy.dtype())) {
    Tensor dx64 = wide_like(dx);
    bwd_data<double>(widened(dy), widened(w), dx64, p);
    return narrowed_into(dx64, dx);
  }
  if (dy.dtype() == DType::f64) bwd_data<double>(dy, w, dx, p);
  else bwd_data<float>(dy, w, dx, p);
}

void conv2d_bwd_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db, const ops::Conv2dParams& p) {
  if (is_half(dy.dtype())) {
    Tensor dw64 = wide_like(dw), db64 = wide_like(db);
    bwd_weight<double>(widened(dy), widened(x), dw64, db64, p);
    narrowed_into(dw64, dw);
    return narrowed_into(db64, db);
  }
  if (dy.dtype() == DType::f64) bwd_weight<double>(dy, x, dw, db, p);
  else bwd_weight<float>(dy, x, dw, db, p);
}

}  // namespace eg::ref
