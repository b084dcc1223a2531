// Pooling, fast CPU path. Max pooling: OpenMP loops over (n, c) planes, vectorised
// along output columns (our s32 argmax indices, flat h*W+w in the input plane, are not
// oneDNN's workspace format); on NHWC and nChw16c inputs, loops vectorised along the
// channels (Note [Pooling in the convolutions' layout]). Average pooling: oneDNN 2.6
// pooling forward/backward in the input's layout. Global average pooling: vectorised
// row sums on NCHW. f32; bf16 max pooling forward as it comes, the rest through f32.
//
// Napkin math (max 3x3/s2/pad1 on 32x64x56x56): x is 25.7 MB, y and indices 6.4 MB
// each: ~39 MB of traffic, ~2 ms at ~20 GB/s per core; 14.5 M window compares are
// 0.9 M 16-lane vector compares, well under that. Measured on one core: forward
// 4.2 ms (ref 9.6 ms; oneDNN's avg pooling of the same shape 1.7 ms), backward 1.5 ms
// (zero-fill dx, 25.7 MB, then scatter dy through the indices).
//
// Note [Pooling in the convolutions' layout]
// A ResNet stem's max pool sits between convolutions whose activations are nChw16c or
// NHWC (Note [Activation layouts follow the convolutions] in kernels/cpu/conv2d.cpp):
// taking a plain copy of its input and handing the next convolution a plain output cost
// two reorders forward and two backward of the stem's largest tensors. Both layouts
// hold an image's (or a 16-channel block's) values as [H][W][c], channels innermost
// (NHWC: one group of C channels an image; nChw16c: C/16 groups of 16), so one kernel
// takes both, over N * groups "images" of c channels. Its indices mean what the plain
// kernel's do (h * W + w within the (n, channel) plane), held in x's layout, and each
// output visits its window in the same order with the same strict >, so output and
// indices are the plain kernel's exactly, in either layout and dtype.
// Global average pooling still takes a plain copy in either layout: a head's last feature
// map is about 0.1% of a ResNet step's bytes, and summing it in another order would change
// the last bits of every run's logits (the training model's, on nChw16c, and the int8
// reference's, on NHWC), so no run would repeat an earlier one bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/onednn.h"

namespace eg::cpu {

namespace {

// Max pooling of one (n, c) plane. The plane is first copied into `buf`, padded with
// -inf and split by column phase (column j lands in phase j % stride_w at j / stride_w),
// so that for a fixed kernel offset (r, s) the inputs of consecutive output columns are
// consecutive floats and the column loop vectorises without gathers. Each output starts
// at its window's first in-range element and then visits the window in row-major order
// with a strict >, so the first maximum wins exactly as in the reference (padding, at
// -inf, never does).
struct MaxPlane {
  int64_t H, W, P, Q, kh, kw, sh, sw, ph, pw;
  int64_t Hp, Wk;  // padded rows, floats per phase row

  MaxPlane(const Shape& x, const Shape& y, const ops::Pool2dParams& p)
      : H(x[2]),
        W(x[3]),
        P(y[2]),
        Q(y[3]),
        kh(p.kernel_h),
        kw(p.kernel_w),
        sh(p.stride_h),
        sw(p.stride_w),
        ph(p.pad_h),
        pw(p.pad_w) {
    Hp = std::max(H + 2 * ph, (P - 1) * sh + kh);
    // Room for whole blocks of output columns (the extra lanes read -inf, unused).
    Wk = std::max((W + 2 * pw + sw - 1) / sw, q_blocks() * kLanes + (kw - 1) / sw + 1);
  }

  // Blocks of 16 output columns as GCC/Clang vector types: one AVX-512 register (two
  // AVX2 ones elsewhere); comparisons give lane masks, ?: blends.
  static constexpr int kLanes = 16;
  using F16 = float __attribute__((vector_size(64)));
  using I16 = int32_t __attribute__((vector_size(64)));
  static constexpr I16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  int64_t q_blocks() const { return (Q + kLanes - 1) / kLanes; }
  size_t buf_floats() const { return size_t(Hp * sw * Wk); }  // scratch per thread

  // `buf` holds buf_floats() floats, all -inf before the first plane: later planes
  // overwrite the same data cells, so the padding cells stay -inf.
  void run(const float* xi, float* yo, int32_t* io, float* buf) const {
    for (int64_t h = 0; h < H; ++h)
      for (int64_t f = 0; f < sw; ++f) {
        // Padded column k * sw + f holds input column k * sw + f - pw.
        float* dst = buf + ((h + ph) * sw + f) * Wk;
        const int64_t k0 = std::max<int64_t>((pw - f + sw - 1) / sw, 0);
        const int64_t k1 = std::min(Wk, (W + pw - f + sw - 1) / sw);
        const float* row = xi + h * W;
        const int64_t off = f - pw;
        if (sw == 1) std::copy(row + k0 + off, row + k1 + off, dst + k0);
        else if (sw == 2)  // constant stride: vectorised with permutes instead of a scalar loop
          for (int64_t k = k0; k < k1; ++k) dst[k] = row[2 * k + off];
        else
          for (int64_t k = k0; k < k1; ++k) dst[k] = row[k * sw + off];
      }
    for (int64_t op = 0; op < P; ++op) {
      // First in-range element: row max(op*sh - ph, 0); column q*sw - pw, or 0 when that
      // is padding (padded column pw: phase pw % sw, slot pw / sw).
      const int64_t h0 = std::max<int64_t>(op * sh - ph, 0);
      const float* row0 = buf + (h0 + ph) * sw * Wk;
      const float edge = row0[(pw % sw) * Wk + pw / sw];
      for (int64_t qb = 0; qb < Q; qb += kLanes) {
        // One block of output columns, held in registers across the whole window.
        F16 best;
        std::memcpy(&best, row0 + qb, sizeof best);
        I16 arg = int32_t(h0 * W + qb * sw - pw) + lane * int32_t(sw);
        for (int l = 0; qb * sw < pw && l < kLanes; ++l)  // leftmost block: windows starting in padding
          if ((qb + l) * sw < pw) best[l] = edge, arg[l] = int32_t(h0 * W);
        for (int64_t r = 0; r < kh; ++r) {
          const int64_t hp = op * sh + r;  // padded row
          if (hp < ph || hp >= H + ph) continue;
          for (int64_t s = 0; s < kw; ++s) {
            F16 v;
            std::memcpy(&v, buf + (hp * sw + s % sw) * Wk + s / sw + qb, sizeof v);
            const I16 better = v > best;
            best = better ? v : best;
            arg = better ? int32_t((hp - ph) * W + s - pw + qb * sw) + lane * int32_t(sw) : arg;
          }
        }
        float* yq = yo + op * Q + qb;
        int32_t* iq = io + op * Q + qb;
        if (qb + kLanes <= Q) {  // fixed-size copies: one vector store each
          std::memcpy(yq, &best, sizeof best);
          std::memcpy(iq, &arg, sizeof arg);
        } else {
          for (int64_t l = 0; l < Q - qb; ++l) yq[l] = best[l], iq[l] = arg[l];
        }
      }
    }
  }
};

void max_fwd(const Tensor& x, Tensor& y, Tensor& indices, const ops::Pool2dParams& p) {
  const MaxPlane plane(x.shape(), y.shape(), p);
  const int64_t planes = x.size(0) * x.size(1), HW = x.size(2) * x.size(3), PQ = y.size(2) * y.size(3);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  int32_t* ip = indices.defined() ? indices.data<int32_t>() : nullptr;
#pragma omp parallel
  {
    std::vector<float> buf(plane.buf_floats(), -INFINITY);
    std::vector<int32_t> unused(ip ? 0 : size_t(PQ));  // indices asked for by nobody
#pragma omp for schedule(static)
    for (int64_t pl = 0; pl < planes; ++pl)
      plane.run(xp + pl * HW, yp + pl * PQ, ip ? ip + pl * PQ : unused.data(), buf.data());
  }
}

void max_bwd(const Tensor& dy, const Tensor& indices, Tensor& dx) {
  const int64_t planes = dx.size(0) * dx.size(1), HW = dx.size(2) * dx.size(3), PQ = dy.size(2) * dy.size(3);
  const float* dyp = dy.data<float>();
  const int32_t* ip = indices.data<int32_t>();
  float* dxp = dx.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dxi = dxp + pl * HW;
    std::fill(dxi, dxi + HW, 0.f);
    const float* dyo = dyp + pl * PQ;
    const int32_t* io = ip + pl * PQ;
    for (int64_t i = 0; i < PQ; ++i) dxi[io[i]] += dyo[i];
  }
}

// ---- max pooling with the channels innermost (Note [Pooling in the convolutions' layout])

struct Inner {
  int64_t images, c;  // [images][H][W][c]
};
Inner inner_of(const Tensor& t) {
  const int64_t N = t.size(0), C = t.size(1);
  return t.format() == Format::nhwc ? Inner{N, C} : Inner{N * (C / kBlock), kBlock};
}

// x and y of one storage type T, compared in float (max is exact, so bf16 needs no
// widening pass of its own).
template <class T>
void max_fwd_inner(const Tensor& x, Tensor& y, Tensor& indices, const ops::Pool2dParams& p) {
  const Inner g = inner_of(x);
  const int64_t H = x.size(2), W = x.size(3), P = y.size(2), Q = y.size(3), c = g.c;
  y.set_format(x.format());
  if (indices.defined()) indices.set_format(x.format());
  const T* xp = x.data_any<T>();
  T* yp = y.data_any<T>();
  int32_t* ip = indices.defined() ? indices.data_any<int32_t>() : nullptr;
#pragma omp parallel
  {
    std::vector<float> best(static_cast<size_t>(c));
    std::vector<int32_t> unused(ip ? 0 : size_t(c));  // indices asked for by nobody
#pragma omp for collapse(2) schedule(static)
    for (int64_t n = 0; n < g.images; ++n)
      for (int64_t op = 0; op < P; ++op) {
        // The window's rows and columns in range (padding <= half the kernel: never empty).
        const int64_t h0 = std::max<int64_t>(op * p.stride_h - p.pad_h, 0),
                      h1 = std::min(op * p.stride_h - p.pad_h + p.kernel_h, H);
        for (int64_t oq = 0; oq < Q; ++oq) {
          const int64_t w0 = std::max<int64_t>(oq * p.stride_w - p.pad_w, 0),
                        w1 = std::min(oq * p.stride_w - p.pad_w + p.kernel_w, W);
          const int64_t o = (n * P + op) * Q + oq;
          T* yo = yp + o * c;
          int32_t* io = ip ? ip + o * c : unused.data();
          const T* x0 = xp + ((n * H + h0) * W + w0) * c;
          const int32_t at0 = int32_t(h0 * W + w0);
          float* b = best.data();
          for (int64_t k = 0; k < c; ++k) b[k] = ld(x0, k), io[k] = at0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = h == h0 ? w0 + 1 : w0; w < w1; ++w) {
              const T* xv = xp + ((n * H + h) * W + w) * c;
              const int32_t at = int32_t(h * W + w);
#pragma omp simd
              for (int64_t k = 0; k < c; ++k) {
                const float v = ld(xv, k);
                const bool better = v > b[k];
                b[k] = better ? v : b[k];
                io[k] = better ? at : io[k];
              }
            }
          // A bf16 input's maximum widened and rounded back is its own bits (exact).
          for (int64_t k = 0; k < c; ++k) st(yo, k, b[k]);
        }
      }
  }
}

// dx in indices' layout (set by the caller); each dx element sums its dy values in
// output order, as the plain kernel does.
void max_bwd_inner(const Tensor& dy, const Tensor& indices, Tensor& dx) {
  const Inner g = inner_of(dx);
  const int64_t HW = dx.size(2) * dx.size(3), PQ = dy.size(2) * dy.size(3), c = g.c;
  const float* dyp = dy.data_any<float>();
  const int32_t* ip = indices.data_any<int32_t>();
  float* dxp = dx.data_any<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < g.images; ++n) {
    float* dxn = dxp + n * HW * c;
    std::fill(dxn, dxn + HW * c, 0.f);
    for (int64_t o = 0; o < PQ; ++o) {
      const float* d = dyp + (n * PQ + o) * c;
      const int32_t* io = ip + (n * PQ + o) * c;
      for (int64_t k = 0; k < c; ++k) dxn[int64_t(io[k]) * c + k] += d[k];
    }
  }
}

// ---- average pooling through oneDNN

using dnnl::memory;

struct AvgGeometry {
  memory::dims strides, kernel, pad;
  dnnl::algorithm alg;
};
AvgGeometry avg_geometry(const ops::Pool2dParams& p) {
  return {{p.stride_h, p.stride_w},
          {p.kernel_h, p.kernel_w},
          {p.pad_h, p.pad_w},
          p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                              : dnnl::algorithm::pooling_avg_exclude_padding};
}

std::string avg_key(const char* kind, Format f, const Shape& x, const Shape& y, const ops::Pool2dParams& p) {
  return std::string(kind) + "|" + std::to_string(int(f)) + "|" + onednn::key_of(x) + "|" + onednn::key_of(y) + "|" +
         std::to_string(p.kernel_h) + "," + std::to_string(p.kernel_w) + "," + std::to_string(p.stride_h) + "," +
         std::to_string(p.stride_w) + "," + std::to_string(p.pad_h) + "," + std::to_string(p.pad_w) +
         (p.count_include_pad ? "|incl" : "");
}

dnnl::pooling_forward::primitive_desc avg_fwd_pd(Format f, const Shape& x, const Shape& y, const ops::Pool2dParams& p) {
  const AvgGeometry g = avg_geometry(p);
  const memory::desc xm(onednn::dims(x), memory::data_type::f32, onednn::tag_of(f));
  const memory::desc ym(onednn::dims(y), memory::data_type::f32, onednn::tag_of(f));
  dnnl::pooling_forward::desc d(dnnl::prop_kind::forward_training, g.alg, xm, ym, g.strides, g.kernel, g.pad, g.pad);
  return dnnl::pooling_forward::primitive_desc(d, onednn::engine());
}

void avg_fwd(const Tensor& x, Tensor& y, const ops::Pool2dParams& p) {
  const Format f = x.format();
  y.set_format(f);
  auto& prim = onednn::cached<dnnl::pooling_forward>(avg_key("fwd", f, x.shape(), y.shape(), p), [&] {
    return dnnl::pooling_forward(avg_fwd_pd(f, x.shape(), y.shape(), p));
  });
  prim.execute(onednn::stream(), {{DNNL_ARG_SRC, onednn::wrap(x, onednn::tag_of(f))},
                                  {DNNL_ARG_DST, onednn::wrap(y, onednn::tag_of(f))}});
  onednn::stream().wait();
}

// dx in dy's layout (set by the caller).
void avg_bwd(const Tensor& dy, Tensor& dx, const ops::Pool2dParams& p) {
  const Format f = dy.format();
  auto& prim = onednn::cached<dnnl::pooling_backward>(avg_key("bwd", f, dx.shape(), dy.shape(), p), [&] {
    const AvgGeometry g = avg_geometry(p);
    const memory::desc xm(onednn::dims(dx.shape()), memory::data_type::f32, onednn::tag_of(f));
    const memory::desc ym(onednn::dims(dy.shape()), memory::data_type::f32, onednn::tag_of(f));
    dnnl::pooling_backward::desc d(g.alg, xm, ym, g.strides, g.kernel, g.pad, g.pad);
    return dnnl::pooling_backward(
        dnnl::pooling_backward::primitive_desc(d, onednn::engine(), avg_fwd_pd(f, dx.shape(), dy.shape(), p)));
  });
  prim.execute(onednn::stream(), {{DNNL_ARG_DIFF_DST, onednn::wrap(dy, onednn::tag_of(f))},
                                  {DNNL_ARG_DIFF_SRC, onednn::wrap(dx, onednn::tag_of(f))}});
  onednn::stream().wait();
}

}  // namespace

namespace {
// bf16 (Note [bf16 kernels]): the f32 kernels between a widening and one rounding of
// each output, in the tensors' own layout; pooling is a small share of a step's bytes (a
// stem's max pool, a head's global average), and the casts are the ones autocast made
// before pooling took bf16.
bool any_half(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype() != DType::f32) return true;
  return false;
}
Tensor f32_of(const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor w = Tensor::empty(t.shape(), DType::f32, t.device());
  if (t.format() == Format::plain) {
    cast(t, w);
    return w;
  }
  EG_CHECK(t.dtype() == DType::bf16, "internal: pooling of ", t.str(), " in a kernels' layout");
  w.set_format(t.format());
  const bf16_t* s = t.data_any<bf16_t>();
  float* d = w.data_any<float>();
  const int64_t n = t.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
  return w;
}
// y = w rounded, in w's layout.
void narrow_into(const Tensor& w, Tensor& y) {
  if (w.format() == Format::plain) {
    y.set_format(Format::plain);
    return cast(w, y);
  }
  EG_CHECK(y.dtype() == DType::bf16, "internal: pooling into ", y.str(), " in a kernels' layout");
  y.set_format(w.format());
  const float* s = w.data_any<float>();
  bf16_t* d = y.data_any<bf16_t>();
  const int64_t n = w.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
}
}  // namespace

// Pooling takes its input in any CPU layout and writes its output in the same
// (kernels/registry.cpp lists it with the ops between convolutions).
// EG_DNNL_TRY names its first parameter `what`, the same token as dnnl::error::what(),
// so the op name is passed as a variable of that name to keep the expansion valid.
void pool2d_fwd(const Tensor& x, Tensor& y, Tensor& indices, const ops::Pool2dParams& p) {
  if (p.kind == ops::PoolKind::max && x.format() != Format::plain && x.dtype() == y.dtype()) {
    if (x.dtype() == DType::bf16) return max_fwd_inner<bf16_t>(x, y, indices, p);
    if (x.dtype() == DType::f32) return max_fwd_inner<float>(x, y, indices, p);
  }
  if (any_half({&x, &y})) {
    Tensor y32 = Tensor::empty(y.shape(), DType::f32, y.device());
    pool2d_fwd(f32_of(x), y32, indices, p);
    return narrow_into(y32, y);
  }
  if (p.kind == ops::PoolKind::max) return max_fwd(x, y, indices, p);
  const char* what = "pool2d_fwd (avg)";
  EG_DNNL_TRY(what, avg_fwd(x, y, p));
}

// dx in the forward's layout: the indices' (max) or dy's (average).
void pool2d_bwd(const Tensor& dy_in, const Tensor& indices, Tensor& dx, const ops::Pool2dParams& p) {
  if (any_half({&dy_in, &dx})) {
    Tensor dx32 = Tensor::empty(dx.shape(), DType::f32, dx.device());
    pool2d_bwd(f32_of(dy_in), indices, dx32, p);
    return narrow_into(dx32, dx);
  }
  const bool max = p.kind == ops::PoolKind::max;
  const Format f = max ? indices.format() : dy_in.format();
  Tensor keep;
  const Tensor& dy = in_format(dy_in, f, keep);
  dx.set_format(f);
  if (max) return f == Format::plain ? max_bwd(dy, indices, dx) : max_bwd_inner(dy, indices, dx);
  const char* what = "pool2d_bwd (avg)";
  EG_DNNL_TRY(what, avg_bwd(dy, dx, p));
}

// Global average pooling: 4 bytes read per input element, one row sum per (n, c).
void global_avgpool_fwd(const Tensor& x, Tensor& y) {
  if (any_half({&x, &y})) {
    Tensor y32 = Tensor::empty(y.shape(), DType::f32, y.device());
    global_avgpool_fwd(f32_of(x), y32);
    return cast(y32, y);
  }
  const int64_t planes = x.size(0) * x.size(1), L = x.size(2) * x.size(3);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > 32768)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xr = xp + pl * L;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < L; ++i) sum += xr[i];
    yp[pl] = sum / float(L);
  }
}

void global_avgpool_bwd(const Tensor& dy, Tensor& dx) {
  if (any_half({&dy, &dx})) {
    Tensor dx32 = Tensor::empty(dx.shape(), DType::f32, dx.device());
    global_avgpool_bwd(f32_of(dy), dx32);
    return cast(dx32, dx);
  }
  const int64_t planes = dx.size(0) * dx.size(1), L = dx.size(2) * dx.size(3);
  const float* dyp = dy.data<float>();
  float* dxp = dx.data<float>();
#pragma omp parallel for schedule(static) if (dx.numel() > 32768)
  for (int64_t pl = 0; pl < planes; ++pl) std::fill(dxp + pl * L, dxp + (pl + 1) * L, dyp[pl] / float(L));
}

}  // namespace eg::cpu
