// Batch normalisation over (N, H, W) per channel, fast CPU path: vectorised OpenMP
// loops, parallel over channels (training forward, backward) or over (n, c) rows
// (inference forward). Layout: x, y [N, C, H, W] contiguous, viewed as [N, C, L];
// gamma, beta, statistics [C]. f32; rows of L are summed in float (SIMD lanes), rows
// are combined in double. bf16 activations (Note [bf16 kernels]) go through the same
// loops, loaded to f32 (f32 parameters and statistics): the blocked ones, or the plain
// ones where the channels are not a multiple of 16 (MobileNetV2's 24).
//
// Napkin math (128x16x32x32, 8 MB per tensor): one channel's slice (128 rows of 4 KB,
// 512 KB) fits in L2, so the training forward reads x from memory once (mean pass),
// re-reads it from L2 (variance and normalise passes) and writes y once: 16 MB of
// traffic; the backward reads dy and x once (sums), again from L2 (dx) and writes dx:
// 24 MB. At ~20 GB/s per core from DRAM that is ~0.8 and ~1.2 ms; measured with the
// tensors L3-resident, 0.44 and 0.65 ms on one core.
//
// Why not oneDNN: on NCHW, oneDNN 2.6 runs its generic ncsp_bnorm (measured 3.4 ms
// forward, 5.7 ms backward on one core); its fast JIT path wants nChw16c, i.e. two more
// reorders per call. It also keeps variance where we keep invstd, and has no
// inference-mode backward (statistics as constants), which these loops give for free.
//
// nChw16c (Note [Blocked activations]): x is [N, C/16, L, 16], so the loops below run
// over (n, channel block) tiles of L x 16 floats with the 16 channels in the SIMD lanes,
// parallel over tiles (ResNet-56's first stage has a single channel block: parallel over
// channels would leave a core idle). Each tile yields float partial sums per channel,
// combined per channel in double; the variance combines each tile's own mean and
// squared deviations (Chan et al.), so it needs no second pass over memory.
//
// NHWC (the int8 reference's convolutions write it, Note [int8 convolution pipeline] in
// quant/int8.cpp, and its batch norms on each batch's statistics, ReferenceBn::batch, sit
// between them; and the training convolutions where the CPU's pick it, Note [Activation
// layouts follow the convolutions] in conv2d.cpp): x is [N, L, C], one image's L rows of C
// channels a tile, the channels in the SIMD lanes, parallel over images; the statistics
// combine as the blocked ones do. Taking it as it comes spares a reorder to plain and one back.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16x16.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace eg::cpu {

namespace {

struct Tiles {
  int64_t N, C, CB, L;
  int64_t count() const { return N * CB; }
  // tile t = (n, cb) starts at t * L * 16 in the blocked buffer; its channels are cb*16..
  int64_t channel0(int64_t t) const { return (t % CB) * kBlock; }
};
Tiles tiles_of(const Tensor& x) {
  const int64_t C = x.size(1);
  return {x.size(0), C, C / kBlock, x.size(2) * x.size(3)};
}

// The fused activation (ops::BnAct) as a template argument: f(std::integral_constant).
template <class F>
void with_act(ops::BnAct a, F f) {
  using A = ops::BnAct;
  switch (a) {
    case A::none: return f(std::integral_constant<A, A::none>{});
    case A::relu: return f(std::integral_constant<A, A::relu>{});
    case A::relu6: return f(std::integral_constant<A, A::relu6>{});
  }
}

// The activation of a value: max(v, 0) as std::max gives it, ReLU6 as act.cpp's select
// (a NaN stays NaN, -0 stays -0 in both).
template <ops::BnAct A>
float act_of(float v) {
  if constexpr (A == ops::BnAct::relu) return std::max(v, 0.f);
  else if constexpr (A == ops::BnAct::relu6) return v < 0.f ? 0.f : (v > 6.f ? 6.f : v);
  else return v;
}
// Whether the gradient flows back through the activation whose output is r.
template <ops::BnAct A>
bool passes(float r) {
  if constexpr (A == ops::BnAct::relu6) return r > 0.f && r < 6.f;
  else return A == ops::BnAct::none || r > 0.f;
}

#if EG_BF16X16
template <ops::BnAct A>
__m512 act16(__m512 v) {
  using namespace bf16x16;
  // minps returns its second operand unless the first is less: act_of's select.
  if constexpr (A == ops::BnAct::relu6) return _mm512_min_ps(_mm512_set1_ps(6.f), relu(v));
  else if constexpr (A == ops::BnAct::relu) return relu(v);
  else return v;
}
#endif

// y = act(x * a + b (+ r)) over n values of one channel (a, b scalars) or of L x 16
// tile rows (a, b per lane: Lanes = 16). T: the activations' storage (f32 or bf16; Note
// [bf16 kernels]), the arithmetic in f32.
template <ops::BnAct A, bool Res, int64_t Lanes, class T>
void affine_rows(const T* x, const T* r, T* y, const float* a, const float* b, int64_t rows) {
#if EG_BF16X16
  if constexpr (std::is_same_v<T, bf16_t> && Lanes == kBlock) {
    using namespace bf16x16;
    const __m512 va = _mm512_loadu_ps(a), vb = _mm512_loadu_ps(b);
    for (int64_t k = 0; k < rows * kBlock; k += kBlock) {
      __m512 v = _mm512_fmadd_ps(load16(x + k), va, vb);
      if (Res) v = _mm512_add_ps(v, load16(r + k));
      store16(y + k, act16<A>(v));
    }
    return;
  }
#endif
  for (int64_t l = 0; l < rows; ++l)
#pragma omp simd
    for (int64_t j = 0; j < Lanes; ++j) {
      const int64_t k = l * Lanes + j;
      float v = ld(x, k) * a[j] + b[j];
      if (Res) v += ld(r, k);
      st(y, k, act_of<A>(v));
    }
}
template <int64_t Lanes, class T>
void affine_rows(const T* x, const T* r, T* y, const float* a, const float* b, int64_t rows, ops::BnAct act) {
  with_act(act, [&](auto a_) {
    constexpr ops::BnAct A = decltype(a_)::value;
    r ? affine_rows<A, true, Lanes>(x, r, y, a, b, rows) : affine_rows<A, false, Lanes>(x, r, y, a, b, rows);
  });
}

// Per-channel scale/shift applied to every tile: y = act(x * sc[c] + sh[c] (+ residual rp)).
template <class T>
void affine_blocked(const Tiles& t, const T* xp, T* yp, const float* sc, const float* sh, ops::BnAct act, const T* rp) {
#pragma omp parallel for schedule(static) if (t.count() * t.L * kBlock > 32768)
  for (int64_t i = 0; i < t.count(); ++i) {
    const int64_t off = i * t.L * kBlock;
    affine_rows<kBlock>(xp + off, rp ? rp + off : nullptr, yp + off, sc + t.channel0(i), sh + t.channel0(i), t.L, act);
  }
}

// Per channel of an L x 16 tile: the sum s and the squared deviations q from the tile's mean.
template <class T>
void tile_stats(const T* xr, int64_t L, float* s_out, float* q_out) {
  float s[kBlock] = {}, q[kBlock] = {}, mu[kBlock];
  for (int64_t l = 0; l < L; ++l)
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j) s[j] += ld(xr, l * kBlock + j);
#pragma omp simd
  for (int64_t j = 0; j < kBlock; ++j) mu[j] = s[j] / float(L);
  for (int64_t l = 0; l < L; ++l)
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j) {
      const float d = ld(xr, l * kBlock + j) - mu[j];
      q[j] += d * d;
    }
  for (int64_t j = 0; j < kBlock; ++j) s_out[j] = s[j], q_out[j] = q[j];
}
#if EG_BF16X16
inline void tile_stats(const bf16_t* xr, int64_t L, float* s_out, float* q_out) {
  using namespace bf16x16;
  __m512 s = _mm512_setzero_ps(), q = _mm512_setzero_ps();
  for (int64_t k = 0; k < L * kBlock; k += kBlock) s = _mm512_add_ps(s, load16(xr + k));
  const __m512 mu = _mm512_div_ps(s, _mm512_set1_ps(float(L)));
  for (int64_t k = 0; k < L * kBlock; k += kBlock) {
    const __m512 d = _mm512_sub_ps(load16(xr + k), mu);
    q = _mm512_fmadd_ps(d, d, q);
  }
  _mm512_storeu_ps(s_out, s);
  _mm512_storeu_ps(q_out, q);
}
#endif

// What a training forward writes per channel, and its parameters.
struct ChannelOut {
  const float *gp, *bp;  // gamma, beta
  float *sc, *sh, *mp, *ip, *rmp, *rvp;  // scale, shift, saved mean and invstd, running (may be null)
  double momentum, eps;
};

// Channel c from N tiles of L values each, tile n's sum and squared deviations from its own
// mean at s[n * stride], q[n * stride]: their mean and squared deviations combined (Chan
// et al.), then the scale and shift that normalise the channel and its statistics.
void finish_channel(int64_t c, const float* s, const float* q, int64_t N, int64_t stride, int64_t L,
                    const ChannelOut& o) {
  const double m = double(N * L);
  double sum = 0;
  for (int64_t n = 0; n < N; ++n) sum += double(s[n * stride]);
  const double mean = sum / m;
  double ss = 0;  // sum of the tiles' M2s plus the spread of their means
  for (int64_t n = 0; n < N; ++n) {
    const double d = double(s[n * stride]) / double(L) - mean;
    ss += double(q[n * stride]) + double(L) * d * d;
  }
  const double var = ss / m, invstd = 1.0 / std::sqrt(var + o.eps);
  o.sc[c] = float(invstd * double(o.gp[c]));
  o.sh[c] = float(double(o.bp[c]) - mean * invstd * double(o.gp[c]));
  o.mp[c] = float(mean);
  o.ip[c] = float(invstd);
  if (o.rmp) o.rmp[c] = float((1 - o.momentum) * double(o.rmp[c]) + o.momentum * mean);
  if (o.rvp) o.rvp[c] = float((1 - o.momentum) * double(o.rvp[c]) + o.momentum * ss / (m - 1));
}

template <class T>
void bn_fwd_train_blocked(const Tensor& x, const float* gp, const float* bp, Tensor& y, float* mp, float* ip,
                          float* rmp, float* rvp, double momentum, double eps, ops::BnAct act, const T* resp) {
  const Tiles t = tiles_of(x);
  const T* xp = x.data_any<T>();
  y.set_format(Format::nchw16c);
  T* yp = y.data_any<T>();
  // Per tile and channel: sum and squared deviations from the tile's mean.
  std::vector<float> tsum(size_t(t.count() * kBlock)), tm2(size_t(t.count() * kBlock));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < t.count(); ++i)
    tile_stats(xp + i * t.L * kBlock, t.L, tsum.data() + i * kBlock, tm2.data() + i * kBlock);
  std::vector<float> sc(size_t(t.C)), sh(size_t(t.C));
  const ChannelOut o{gp, bp, sc.data(), sh.data(), mp, ip, rmp, rvp, momentum, eps};
  for (int64_t c = 0; c < t.C; ++c)  // tile (n, cb)'s lane j at (n CB + cb) 16 + j
    finish_channel(c, tsum.data() + c, tm2.data() + c, t.N, t.CB * kBlock, t.L, o);
  affine_blocked(t, xp, yp, sc.data(), sh.data(), act, resp);
}

// One tile of the blocked backward. A: the activation the forward fused, whose output is
// rr, so the gradient is dy where it passes (rr is not read without one).
template <ops::BnAct A, class T>
float grad_at(const T* rr, const T* dr, int64_t k) {
  return A == ops::BnAct::none || passes<A>(ld(rr, k)) ? ld(dr, k) : 0.f;
}

// Per-channel sum of the gradient and of gradient * (x - mu) over a tile. Store: the
// gradient is also written to go (the residual's gradient, which the dx pass then
// reads instead of dy and the mask).
template <ops::BnAct A, bool Store, class T>
void tile_sums(const T* dr, const T* rr, const T* xr, const float* mu, int64_t L, float* a, float* b, T* go) {
  for (int64_t l = 0; l < L; ++l)
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j) {
      const float g = grad_at<A>(rr, dr, l * kBlock + j);
      if (Store) st(go, l * kBlock + j, g);
      a[j] += g;
      b[j] += g * (ld(xr, l * kBlock + j) - mu[j]);
    }
}

// dx = gi g - a (x - mu) - b over a tile, per-channel gi, a, b.
template <ops::BnAct A, class T>
void tile_dx(const T* dr, const T* rr, const T* xr, const float* mu, const float* gi, const float* a, const float* b,
             int64_t L, T* o) {
  for (int64_t l = 0; l < L; ++l)
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j)
      st(o, l * kBlock + j,
         gi[j] * grad_at<A>(rr, dr, l * kBlock + j) - a[j] * (ld(xr, l * kBlock + j) - mu[j]) - b[j]);
}

#if EG_BF16X16
// The gradient of a row: dy, or dy where the fused activation's output rr passes it.
template <ops::BnAct A>
__m512 grad16(const bf16_t* dr, const bf16_t* rr, int64_t k) {
  using namespace bf16x16;
  const __m512 g = load16(dr + k);
  if constexpr (A == ops::BnAct::none) return g;
  const __m512 r = load16(rr + k);
  __mmask16 on = _mm512_cmp_ps_mask(r, _mm512_setzero_ps(), _CMP_GT_OQ);
  if constexpr (A == ops::BnAct::relu6) on = _mm512_mask_cmp_ps_mask(on, r, _mm512_set1_ps(6.f), _CMP_LT_OQ);
  return _mm512_maskz_mov_ps(on, g);
}

template <ops::BnAct A, bool Store>
void tile_sums(const bf16_t* dr, const bf16_t* rr, const bf16_t* xr, const float* mu, int64_t L, float* a, float* b,
               bf16_t* go) {
  using namespace bf16x16;
  const __m512 vmu = _mm512_loadu_ps(mu);
  __m512 va = _mm512_loadu_ps(a), vb = _mm512_loadu_ps(b);
  for (int64_t k = 0; k < L * kBlock; k += kBlock) {
    const __m512 g = grad16<A>(dr, rr, k);
    if (Store) store16(go + k, g);
    va = _mm512_add_ps(va, g);
    vb = _mm512_fmadd_ps(g, _mm512_sub_ps(load16(xr + k), vmu), vb);
  }
  _mm512_storeu_ps(a, va);
  _mm512_storeu_ps(b, vb);
}

template <ops::BnAct A>
void tile_dx(const bf16_t* dr, const bf16_t* rr, const bf16_t* xr, const float* mu, const float* gi, const float* a,
             const float* b, int64_t L, bf16_t* o) {
  using namespace bf16x16;
  const __m512 vmu = _mm512_loadu_ps(mu), vg = _mm512_loadu_ps(gi), va = _mm512_loadu_ps(a), vb = _mm512_loadu_ps(b);
  for (int64_t k = 0; k < L * kBlock; k += kBlock) {
    const __m512 v = _mm512_fnmadd_ps(va, _mm512_sub_ps(load16(xr + k), vmu), _mm512_mul_ps(vg, grad16<A>(dr, rr, k)));
    store16(o + k, _mm512_sub_ps(v, vb));
  }
}
#endif

// The backward's per-channel results from its sums over the m = N x L values of a channel
// (sdy: of the gradient, sdyx: of the gradient x (x - mu)): dgamma and dbeta where wanted,
// and dx's terms, dx = gi dy - a (x - mu) - b (b folds the mean term).
struct DxTerms {
  std::vector<float> gi, a, b;
};
DxTerms finish_sums(const std::vector<double>& sdy, const std::vector<double>& sdyx, const float* gp, const float* ip,
                    double m, bool training, float* dgp, float* dbp) {
  const size_t C = sdy.size();
  DxTerms k{std::vector<float>(C), std::vector<float>(C), std::vector<float>(C)};
  for (size_t c = 0; c < C; ++c) {
    const double sx = sdyx[c] * double(ip[c]);
    if (dgp) dgp[c] = float(sx);
    if (dbp) dbp[c] = float(sdy[c]);
    k.gi[c] = gp[c] * ip[c];
    k.a[c] = training ? float(double(k.gi[c]) * double(ip[c]) * sx / m) : 0.f;
    k.b[c] = training ? float(double(k.gi[c]) * sdy[c] / m) : 0.f;
  }
  return k;
}

// act, ryp: the fused activation and its output (nullptr without one); the gradient is
// dy where it passes. dres (defined: wanted): the gradient of the forward's residual,
// that masked dy.
template <class T>
void bn_bwd_blocked(const Tensor& dy, const Tensor& x, const float* gp, const float* mp, const float* ip, Tensor& dx,
                    float* dgp, float* dbp, bool training, ops::BnAct act, const T* ryp, Tensor& dres) {
  const Tiles t = tiles_of(x);
  const T *dyp = dy.data_any<T>(), *xp = x.data_any<T>();
  T* drp = nullptr;
  if (dres.defined()) {
    dres.set_format(Format::nchw16c);
    drp = dres.data_any<T>();
  }
  const bool need_sums = dgp || dbp || (dx.defined() && training);
  std::vector<double> sdy(size_t(t.C)), sdyx(size_t(t.C));
  if (need_sums || drp) {
    std::vector<float> pa(size_t(t.count() * kBlock)), pb(size_t(t.count() * kBlock));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < t.count(); ++i) {
      const int64_t off = i * t.L * kBlock;
      const T *dr = dyp + off, *xr = xp + off, *rr = ryp ? ryp + off : nullptr;
      const float* mu = mp + t.channel0(i);
      float a[kBlock] = {}, b[kBlock] = {};
      with_act(act, [&](auto a_) {
        constexpr ops::BnAct A = decltype(a_)::value;
        if (drp) tile_sums<A, true>(dr, rr, xr, mu, t.L, a, b, drp + off);
        else tile_sums<A, false>(dr, rr, xr, mu, t.L, a, b, static_cast<T*>(nullptr));
      });
      for (int64_t j = 0; j < kBlock; ++j) pa[size_t(i * kBlock + j)] = a[j], pb[size_t(i * kBlock + j)] = b[j];
    }
    for (int64_t i = 0; i < t.count(); ++i)
      for (int64_t j = 0; j < kBlock; ++j) {
        sdy[size_t(t.channel0(i) + j)] += double(pa[size_t(i * kBlock + j)]);
        sdyx[size_t(t.channel0(i) + j)] += double(pb[size_t(i * kBlock + j)]);
      }
  }
  const DxTerms k = finish_sums(sdy, sdyx, gp, ip, double(t.N * t.L), training, dgp, dbp);
  if (!dx.defined()) return;
  dx.set_format(Format::nchw16c);
  T* dxp = dx.data_any<T>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < t.count(); ++i) {
    const int64_t c0 = t.channel0(i);
    const float *g = k.gi.data() + c0, *a = k.a.data() + c0, *b = k.b.data() + c0, *mu = mp + c0;
    const int64_t off = i * t.L * kBlock;
    const T* xr = xp + off;
    T* o = dxp + off;
    if (drp) {  // already masked
      tile_dx<ops::BnAct::none>(drp + off, static_cast<const T*>(nullptr), xr, mu, g, a, b, t.L, o);
      continue;
    }
    with_act(act, [&](auto a_) {
      constexpr ops::BnAct A = decltype(a_)::value;
      tile_dx<A>(dyp + off, ryp ? ryp + off : nullptr, xr, mu, g, a, b, t.L, o);
    });
  }
}

// NHWC [N, L, C] (Note [Activation layouts follow the convolutions] in conv2d.cpp): per
// image, float partial sums over its L rows with the channels in the SIMD lanes, combined per
// channel in double, then dx row by row; ryp and dres as bn_bwd_blocked's.
template <class T>
void bn_bwd_nhwc(const Tensor& dy, const Tensor& x, const float* gp, const float* mp, const float* ip, Tensor& dx,
                 float* dgp, float* dbp, bool training, ops::BnAct act, const T* ryp, Tensor& dres) {
  const int64_t N = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
  const T *dyp = dy.data_any<T>(), *xp = x.data_any<T>();
  T* drp = nullptr;
  if (dres.defined()) {
    dres.set_format(Format::nhwc);
    drp = dres.data_any<T>();
  }
  const bool need_sums = dgp || dbp || (dx.defined() && training);
  std::vector<double> sdy(static_cast<size_t>(C)), sdyx(static_cast<size_t>(C));
  with_act(act, [&](auto a_) {
    constexpr ops::BnAct A = decltype(a_)::value;
    if (!need_sums && !drp) return;
    std::vector<float> pa(static_cast<size_t>(N * C)), pb(static_cast<size_t>(N * C));
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float *a = pa.data() + n * C, *b = pb.data() + n * C;
      for (int64_t l = 0; l < L; ++l) {
        const int64_t off = (n * L + l) * C;
        const T *dr = dyp + off, *xr = xp + off, *rr = ryp ? ryp + off : nullptr;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float g = grad_at<A>(rr, dr, c);
          if (drp) st(drp + off, c, g);
          a[c] += g;
          b[c] += g * (ld(xr, c) - mp[c]);
        }
      }
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        sdy[size_t(c)] += double(pa[size_t(n * C + c)]);
        sdyx[size_t(c)] += double(pb[size_t(n * C + c)]);
      }
  });
  const DxTerms k = finish_sums(sdy, sdyx, gp, ip, double(N * L), training, dgp, dbp);
  if (!dx.defined()) return;
  dx.set_format(Format::nhwc);
  T* dxp = dx.data_any<T>();
  const float *g = k.gi.data(), *a = k.a.data(), *b = k.b.data();
  with_act(drp ? ops::BnAct::none : act, [&](auto a_) {  // a stored residual gradient is already masked
    constexpr ops::BnAct A = decltype(a_)::value;
    const T* src = drp ? drp : dyp;
    const T* rrp = drp ? nullptr : ryp;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * L; ++r) {
      const T *dr = src + r * C, *xr = xp + r * C, *rr = rrp ? rrp + r * C : nullptr;
      T* o = dxp + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) st(o, c, g[c] * grad_at<A>(rr, dr, c) - a[c] * (ld(xr, c) - mp[c]) - b[c]);
    }
  });
}

// Inference on blocked x: the running statistics folded into one scale and shift per channel.
template <class T>
void bn_infer_blocked(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                      const Tensor& running_var, Tensor& y, double eps, ops::BnAct act, const T* resp) {
  const Tiles t = tiles_of(x);
  const float *gp = gamma.data<float>(), *bp = beta.data<float>();
  const float *mp = running_mean.data<float>(), *vp = running_var.data<float>();
  std::vector<float> sc(size_t(t.C)), sh(size_t(t.C));
  for (int64_t c = 0; c < t.C; ++c) {
    const double sd = double(gp[c]) / std::sqrt(double(vp[c]) + eps);
    sc[size_t(c)] = float(sd), sh[size_t(c)] = float(double(bp[c]) - double(mp[c]) * sd);
  }
  y.set_format(Format::nchw16c);
  affine_blocked(t, x.data_any<T>(), y.data_any<T>(), sc.data(), sh.data(), act, resp);
}

// NHWC [N, L, C]: y = act(x * sc[c] + sh[c] (+ residual rp)) per row of C channels.
template <class T>
void affine_nhwc(int64_t N, int64_t L, int64_t C, const T* xp, T* yp, const float* sc, const float* sh, ops::BnAct act,
                 const T* rp) {
  with_act(act, [&](auto a_) {
    constexpr ops::BnAct A = decltype(a_)::value;
#pragma omp parallel for schedule(static) if (N * L * C > 32768)
    for (int64_t r = 0; r < N * L; ++r) {
      const T* x = xp + r * C;
      T* y = yp + r * C;
      const T* res = rp ? rp + r * C : nullptr;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        float v = ld(x, c) * sc[c] + sh[c];
        if (res) v += ld(res, c);
        st(y, c, act_of<A>(v));
      }
    }
  });
}

template <class T>
void bn_fwd_train_nhwc(const Tensor& x, const float* gp, const float* bp, Tensor& y, float* mp, float* ip, float* rmp,
                       float* rvp, double momentum, double eps, ops::BnAct act, const T* resp) {
  const int64_t N = x.size(0), C = x.size(1), L = x.size(2) * x.size(3);
  const T* xp = x.data_any<T>();
  y.set_format(Format::nhwc);
  T* yp = y.data_any<T>();
  // Per image and channel: the sum and the squared deviations from the image's mean.
  std::vector<float> tsum(size_t(N * C)), tm2(size_t(N * C));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = xp + n * L * C;
    float* s = tsum.data() + n * C;
    float* q = tm2.data() + n * C;
    for (int64_t l = 0; l < L; ++l)
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) s[c] += ld(xr, l * C + c);
    std::vector<float> mu(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) mu[size_t(c)] = s[c] / float(L);
    for (int64_t l = 0; l < L; ++l)
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float d = ld(xr, l * C + c) - mu[size_t(c)];
        q[c] += d * d;
      }
  }
  std::vector<float> sc(static_cast<size_t>(C)), sh(static_cast<size_t>(C));
  const ChannelOut o{gp, bp, sc.data(), sh.data(), mp, ip, rmp, rvp, momentum, eps};
  for (int64_t c = 0; c < C; ++c) finish_channel(c, tsum.data() + c, tm2.data() + c, N, C, L, o);
  affine_nhwc(N, L, C, xp, yp, sc.data(), sh.data(), act, resp);
}

template <class T>
void bn_infer_nhwc(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                   const Tensor& running_var, Tensor& y, double eps, ops::BnAct act, const T* resp) {
  const int64_t C = x.size(1);
  const float *gp = gamma.data<float>(), *bp = beta.data<float>();
  const float *mp = running_mean.data<float>(), *vp = running_var.data<float>();
  std::vector<float> sc(static_cast<size_t>(C)), sh(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    const double sd = double(gp[c]) / std::sqrt(double(vp[c]) + eps);
    sc[size_t(c)] = float(sd), sh[size_t(c)] = float(double(bp[c]) - double(mp[c]) * sd);
  }
  y.set_format(Format::nhwc);
  affine_nhwc(x.size(0), x.size(2) * x.size(3), C, x.data_any<T>(), y.data_any<T>(), sc.data(), sh.data(), act, resp);
}

struct Dims {
  int64_t N, C, L;
};
Dims dims_of(const Tensor& x) { return {x.size(0), x.size(1), x.numel() / (x.size(0) * x.size(1))}; }

// Row sums in float (SIMD lanes); callers combine rows in double.
template <class T>
float row_sum(const T* a, int64_t L) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < L; ++i) s += ld(a, i);
  return s;
}

template <class T>
float row_sq_dev(const T* a, float mu, int64_t L) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < L; ++i) s += (ld(a, i) - mu) * (ld(a, i) - mu);
  return s;
}

// sum dy and sum dy * (x - mu) in one pass.
template <class T>
void row_dy_sums(const T* dy, const T* x, float mu, int64_t L, float& sdy, float& sdyx) {
  float a = 0, b = 0;
#pragma omp simd reduction(+ : a, b)
  for (int64_t i = 0; i < L; ++i) {
    a += ld(dy, i);
    b += ld(dy, i) * (ld(x, i) - mu);
  }
  sdy = a, sdyx = b;
}

// The plain layout [N, C, L], parallel over channels.
template <class T>
void bn_fwd_train_plain(const Tensor& x, const float* gp, const float* bp, Tensor& y, float* mp, float* ip, float* rmp,
                        float* rvp, double momentum, double eps, ops::BnAct act, const T* resp) {
  const Dims d = dims_of(x);
  const T* xp = x.data_any<T>();
  y.set_format(Format::plain);
  T* yp = y.data_any<T>();
  const double m = double(d.N * d.L);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < d.C; ++c) {
    const int64_t stride = d.C * d.L;  // between rows of one channel
    const T* xc = xp + c * d.L;
    double sum = 0;
    for (int64_t n = 0; n < d.N; ++n) sum += double(row_sum(xc + n * stride, d.L));
    const double mean = sum / m;
    const float mf = float(mean);
    // Squared deviations from the float mean, corrected for its rounding (exact in
    // exact arithmetic: sum (x - mf)^2 - m (mean - mf)^2).
    double ss = 0;
    for (int64_t n = 0; n < d.N; ++n) ss += double(row_sq_dev(xc + n * stride, mf, d.L));
    const double dm = mean - double(mf);
    ss -= m * dm * dm;
    const double var = ss > 0 ? ss / m : 0.0, invstd = 1.0 / std::sqrt(var + eps);
    const float scale = float(invstd * double(gp[c])), shift = float(double(bp[c]) - mean * invstd * double(gp[c]));
    for (int64_t n = 0; n < d.N; ++n) {
      const int64_t off = c * d.L + n * stride;
      affine_rows<1>(xp + off, resp ? resp + off : nullptr, yp + off, &scale, &shift, d.L, act);
    }
    mp[c] = mf;
    ip[c] = float(invstd);
    if (rmp) rmp[c] = float((1 - momentum) * double(rmp[c]) + momentum * mean);
    if (rvp) rvp[c] = float((1 - momentum) * double(rvp[c]) + momentum * ss / (m - 1));
  }
}

template <class T>
void bn_infer_plain(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                    const Tensor& running_var, Tensor& y, double eps, ops::BnAct act, const T* resp) {
  const Dims d = dims_of(x);
  const T* xp = x.data_any<T>();
  const float *gp = gamma.data<float>(), *bp = beta.data<float>();
  const float *mp = running_mean.data<float>(), *vp = running_var.data<float>();
  y.set_format(Format::plain);
  T* yp = y.data_any<T>();
  // 8 bytes per element, one streaming pass.
#pragma omp parallel for collapse(2) schedule(static) if (x.numel() > 32768)
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c) {
      const double sd = double(gp[c]) / std::sqrt(double(vp[c]) + eps);
      const float scale = float(sd), shift = float(double(bp[c]) - double(mp[c]) * sd);
      const int64_t off = (n * d.C + c) * d.L;
      affine_rows<1>(xp + off, resp ? resp + off : nullptr, yp + off, &scale, &shift, d.L, act);
    }
}

// dy: the gradient, already masked by the fused activation.
template <class T>
void bn_bwd_plain(const Tensor& dy, const Tensor& x, const float* gp, const float* mp, const float* ip, Tensor& dx,
                  float* dgp, float* dbp, bool training) {
  const Dims d = dims_of(x);
  const T *dyp = dy.data_any<T>(), *xp = x.data_any<T>();
  T* dxp = nullptr;
  if (dx.defined()) {
    dx.set_format(Format::plain);
    dxp = dx.data_any<T>();
  }
  const bool need_sums = dgp || dbp || (dxp && training);
  const double m = double(d.N * d.L);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < d.C; ++c) {
    const int64_t stride = d.C * d.L;  // between rows of one channel
    const T* xc = xp + c * d.L;
    const T* dyc = dyp + c * d.L;
    const float mu = mp[c], is = ip[c];
    double sdy = 0, sdyx = 0;
    if (need_sums)
      for (int64_t n = 0; n < d.N; ++n) {
        float a, b;
        row_dy_sums(dyc + n * stride, xc + n * stride, mu, d.L, a, b);
        sdy += double(a), sdyx += double(b);
      }
    sdyx *= double(is);
    if (dgp) dgp[c] = float(sdyx);
    if (dbp) dbp[c] = float(sdy);
    if (!dxp) continue;
    const float gi = gp[c] * is;
    // dx = gi * dy - a * (x - mu) - b, with the statistics' terms folded into a and b.
    const float a = training ? float(double(gi) * double(is) * sdyx / m) : 0.f;
    const float b = training ? float(double(gi) * sdy / m) : 0.f;
    for (int64_t n = 0; n < d.N; ++n) {
      const T *dyr = dyc + n * stride, *xr = xc + n * stride;
      T* dxr = dxp + c * d.L + n * stride;
#pragma omp simd
      for (int64_t i = 0; i < d.L; ++i) st(dxr, i, gi * ld(dyr, i) - a * (ld(xr, i) - mu) - b);
    }
  }
}

// Whether the loops run blocked: bf16 is held nChw16c where its channels allow (Note
// [bf16 kernels]); f32 as it comes (x, or a gradient dy that arrives blocked).
bool runs_blocked(const Tensor& x, const Tensor& dy = Tensor()) {
  return x.dtype() == DType::bf16 ? x.blockable() : x.is_blocked() || (dy.defined() && dy.is_blocked());
}

}  // namespace

void batchnorm_fwd_train(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, Tensor& save_mean,
                         Tensor& save_invstd, Tensor& running_mean, Tensor& running_var, double momentum, double eps,
                         ops::BnAct act, const Tensor& residual_in) {
  if (!same_dtype({&x, &y, &residual_in})) {  // mixed f32 / bf16: not on a hot path
    y.set_format(Format::plain);
    return ref::batchnorm_fwd_train(x.to_plain(), gamma, beta, y, save_mean, save_invstd, running_mean, running_var,
                                    momentum, eps, act, residual_in.defined() ? residual_in.to_plain() : Tensor());
  }
  float* rmp = running_mean.defined() ? running_mean.data<float>() : nullptr;
  float* rvp = running_var.defined() ? running_var.data<float>() : nullptr;
  const bool nhwc = x.format() == Format::nhwc, blocked = !nhwc && runs_blocked(x);
  Tensor kx, kr;  // x and the residual in the layout computed in
  const Tensor& xs = nhwc ? x : in_format(x, blocked ? Format::nchw16c : Format::plain, kx);
  const Tensor& rs = in_format(residual_in, xs.format(), kr);
  return with_storage(x, [&](auto t) {
    using T = decltype(t);
    const T* resp = rs.defined() ? rs.data_any<T>() : nullptr;
    if (nhwc)
      bn_fwd_train_nhwc(xs, gamma.data<float>(), beta.data<float>(), y, save_mean.data<float>(),
                        save_invstd.data<float>(), rmp, rvp, momentum, eps, act, resp);
    else if (blocked)
      bn_fwd_train_blocked(xs, gamma.data<float>(), beta.data<float>(), y, save_mean.data<float>(),
                           save_invstd.data<float>(), rmp, rvp, momentum, eps, act, resp);
    else
      bn_fwd_train_plain(xs, gamma.data<float>(), beta.data<float>(), y, save_mean.data<float>(),
                         save_invstd.data<float>(), rmp, rvp, momentum, eps, act, resp);
  });
}

void batchnorm_fwd_infer(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                         const Tensor& running_var, Tensor& y, double eps, ops::BnAct act, const Tensor& residual_in) {
  if (!same_dtype({&x, &y, &residual_in})) {
    y.set_format(Format::plain);
    return ref::batchnorm_fwd_infer(x.to_plain(), gamma, beta, running_mean, running_var, y, eps, act,
                                    residual_in.defined() ? residual_in.to_plain() : Tensor());
  }
  const bool nhwc = x.format() == Format::nhwc, blocked = !nhwc && runs_blocked(x);
  Tensor kx, kr;
  const Tensor& xs = nhwc ? x : in_format(x, blocked ? Format::nchw16c : Format::plain, kx);
  const Tensor& rs = in_format(residual_in, xs.format(), kr);
  return with_storage(x, [&](auto t) {
    using T = decltype(t);
    const T* resp = rs.defined() ? rs.data_any<T>() : nullptr;
    if (nhwc) bn_infer_nhwc(xs, gamma, beta, running_mean, running_var, y, eps, act, resp);
    else if (blocked) bn_infer_blocked(xs, gamma, beta, running_mean, running_var, y, eps, act, resp);
    else bn_infer_plain(xs, gamma, beta, running_mean, running_var, y, eps, act, resp);
  });
}

// dbeta = sum dy, dgamma = sum dy * xhat with xhat = (x - mean) * invstd;
// training: dx = gamma * invstd * (dy - (dbeta + xhat * dgamma) / M);
// inference: dx = gamma * invstd * dy (the statistics are constants).
void batchnorm_bwd(const Tensor& dy_in, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& invstd,
                   Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool training, ops::BnAct act, const Tensor& act_y,
                   Tensor& dresidual) {
  if (!same_dtype({&dy_in, &x, &dx, &act_y, &dresidual})) {
    for (Tensor* out : {&dx, &dresidual})
      if (out->defined()) out->set_format(Format::plain);
    return ref::batchnorm_bwd(dy_in.to_plain(), x.to_plain(), gamma, mean, invstd, dx, dgamma, dbeta, training, act,
                              act_y.defined() ? act_y.to_plain() : Tensor(), dresidual);
  }
  float* dgp = dgamma.defined() ? dgamma.data<float>() : nullptr;
  float* dbp = dbeta.defined() ? dbeta.data<float>() : nullptr;
  if (x.format() == Format::nhwc || dy_in.format() == Format::nhwc) {
    Tensor kx, kdy, kry;
    const Tensor& xn = in_format(x, Format::nhwc, kx);
    const Tensor& dyn = in_format(dy_in, Format::nhwc, kdy);
    const Tensor& ryn = in_format(act_y, Format::nhwc, kry);
    return with_storage(x, [&](auto t) {
      using T = decltype(t);
      bn_bwd_nhwc(dyn, xn, gamma.data<float>(), mean.data<float>(), invstd.data<float>(), dx, dgp, dbp, training, act,
                  ryn.defined() ? ryn.data_any<T>() : static_cast<T*>(nullptr), dresidual);
    });
  }
  const bool blocked = runs_blocked(x, dy_in);
  if (blocked) {
    Tensor kx, kdy, kry;
    const Tensor& xb = in_format(x, Format::nchw16c, kx);
    const Tensor& dyb = in_format(dy_in, Format::nchw16c, kdy);
    const Tensor& ryb = in_format(act_y, Format::nchw16c, kry);
    return with_storage(x, [&](auto t) {
      using T = decltype(t);
      bn_bwd_blocked(dyb, xb, gamma.data<float>(), mean.data<float>(), invstd.data<float>(), dx, dgp, dbp, training,
                     act, ryb.defined() ? ryb.data_any<T>() : static_cast<T*>(nullptr), dresidual);
    });
  }
  // Plain layout: the fused activation's mask as its own pass (act_bwd on its output,
  // whose mask is its input's: ops::BatchNormBwd; into the residual's gradient when that
  // is wanted), then the plain loops.
  Tensor masked;
  const bool has_act = act != ops::BnAct::none;
  if (has_act) {
    masked = dresidual.defined() ? dresidual : Tensor::empty(dy_in.shape(), dy_in.dtype());
    act_bwd(ops::unfused(act), dy_in, act_y, masked);
  } else if (dresidual.defined()) {
    dresidual.copy_(dy_in);
  }
  const Tensor& dy = has_act ? masked : dy_in;
  return with_storage(x, [&](auto t) {
    using T = decltype(t);
    bn_bwd_plain<T>(dy, x, gamma.data<float>(), mean.data<float>(), invstd.data<float>(), dx, dgp, dbp, training);
  });
}

}  // namespace eg::cpu
