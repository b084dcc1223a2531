// Layer norm, embedding, dropout, sum of squares and casts, fast CPU path (f32,
// OpenMP over rows / elements). Dropout draws the same Philox numbers as ref and CUDA.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/rng.h"
#include "kernels/cpu/cpu.h"
#include "kernels/ref/ref.h"

namespace eg::cpu {

void layernorm_fwd(const Tensor& x, const Tensor& g, const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd,
                   double eps) {
  const int64_t d = x.size(-1), m = x.numel() / d;
  const float *xp = x.data<float>(), *gp = g.data<float>(), *bp = b.data<float>();
  float *yp = y.data<float>(), *mp = mean.data<float>(), *rp = rstd.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
  for (int64_t r = 0; r < m; ++r) {
    const float* in = xp + r * d;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < d; ++i) s += in[i];
    const float mu = s / float(d);
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int64_t i = 0; i < d; ++i) v += (in[i] - mu) * (in[i] - mu);
    const float rs = 1.f / std::sqrt(v / float(d) + float(eps));
    mp[r] = mu;
    rp[r] = rs;
    float* out = yp + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) out[i] = (in[i] - mu) * rs * gp[i] + bp[i];
  }
}

void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& mean, const Tensor& rstd,
                   Tensor& dx, Tensor& dg, Tensor& db) {
  const int64_t d = x.size(-1), m = x.numel() / d;
  const float *xp = x.data<float>(), *gy = dy.data<float>(), *gp = g.data<float>();
  const float *mp = mean.data<float>(), *rp = rstd.data<float>();
  if (dx.defined()) {
    float* out = dx.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
    for (int64_t r = 0; r < m; ++r) {
      const float *in = xp + r * d, *gr = gy + r * d;
      const float mu = mp[r], rs = rp[r];
      float s1 = 0, s2 = 0;
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t i = 0; i < d; ++i) {
        const float dxh = gr[i] * gp[i];
        s1 += dxh;
        s2 += dxh * (in[i] - mu) * rs;
      }
      s1 /= float(d);
      s2 /= float(d);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) out[r * d + i] = rs * (gr[i] * gp[i] - s1 - (in[i] - mu) * rs * s2);
    }
  }
  if (dg.defined() || db.defined()) {
    // Column sums in double, each column's rows added in order: parallel over blocks of
    // columns, the rows streamed with the block's columns vectorised (contiguous reads).
    float* dgp = dg.defined() ? dg.data<float>() : nullptr;
    float* dbp = db.defined() ? db.data<float>() : nullptr;
    constexpr int64_t kCols = 64;
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
    for (int64_t i0 = 0; i0 < d; i0 += kCols) {
      const int64_t w = std::min(kCols, d - i0);
      double sg[kCols] = {}, sb[kCols] = {};
      for (int64_t r = 0; r < m; ++r) {
        const float *gr = gy + r * d + i0, *in = xp + r * d + i0;
        const float mu = mp[r], rs = rp[r];
#pragma omp simd
        for (int64_t j = 0; j < w; ++j) {
          sg[j] += double(gr[j]) * double((in[j] - mu) * rs);
          sb[j] += double(gr[j]);
        }
      }
      for (int64_t j = 0; j < w; ++j) {
        if (dgp) dgp[i0 + j] = float(sg[j]);
        if (dbp) dbp[i0 + j] = float(sb[j]);
      }
    }
  }
}

void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y) {
  const int64_t d = table.size(1), n = ids.numel();
  const int64_t* ip = ids.data<int64_t>();
  const float* tp = table.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static) if (n * d > 65536)
  for (int64_t i = 0; i < n; ++i) std::memcpy(yp + i * d, tp + ip[i] * d, size_t(d) * sizeof(float));
}

void token_mask(const Tensor& ids, Tensor& mask, int64_t value, bool equal) {
  const int64_t* ip = ids.data<int64_t>();
  uint8_t* mp = mask.data<uint8_t>();
  const int64_t n = ids.numel();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) mp[i] = (ip[i] == value) == equal ? 1 : 0;
}

void embedding_bwd(const Tensor& dy, const Tensor& ids, Tensor& dt) {
  // Scatter-add, parallel over embedding columns so no two threads touch a row slot.
  const int64_t d = dt.size(1), n = ids.numel();
  const int64_t* ip = ids.data<int64_t>();
  const float* gp = dy.data<float>();
  float* tp = dt.data<float>();
  std::memset(tp, 0, dt.nbytes());
#pragma omp parallel if (n * d > 65536)
  {
#ifdef _OPENMP
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
#else
    const int64_t nt = 1, t = 0;
#endif
    const int64_t c0 = d * t / nt, c1 = d * (t + 1) / nt;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = c0; k < c1; ++k) tp[ip[i] * d + k] += gp[i * d + k];
  }
}

namespace {
// Every argument by value: the compiler vectorises the Philox rounds only when it can see
// that the stores alias none of them.
template <class T>
void dropout_loop(const T* xp, T* yp, uint8_t* mp, int64_t n, float s, float pf, uint64_t seed, uint64_t offset) {
  if constexpr (std::is_same_v<T, float>) {
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = philox_uniform(seed, offset, uint64_t(i)) >= pf;
      mp[i] = keep;
      st(yp, i, keep ? ld(xp, i) * s : 0.f);
    }
  } else {
    // bf16: the rounding's NaN branch in the same loop kept the Philox rounds scalar, so
    // a chunk's values go to floats first (that loop vectorises as f32's does), then
    // are rounded: the same bits.
    constexpr int64_t kChunk = 1024;
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t c = 0; c < n; c += kChunk) {
      float v[kChunk];
      const int64_t e = std::min(kChunk, n - c);
      for (int64_t i = 0; i < e; ++i) {
        const bool keep = philox_uniform(seed, offset, uint64_t(c + i)) >= pf;
        mp[c + i] = keep;
        v[i] = keep ? ld(xp, c + i) * s : 0.f;
      }
      for (int64_t i = 0; i < e; ++i) st(yp, c + i, v[i]);
    }
  }
}
template <class T>
void dropout_bwd_loop(const T* gp, const uint8_t* mp, T* out, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) st(out, i, mp[i] ? ld(gp, i) * s : 0.f);
}
}  // namespace

void dropout_fwd(const Tensor& x, Tensor& y, Tensor& mask, double p, const Tensor& rng, uint64_t offset) {
  if (!same_dtype({&x, &y})) return ref::dropout_fwd(x, y, mask, p, rng, offset);
  uint64_t seed = 0;
  offset = ref::dropout_counter(rng, offset, &seed);
  const float s = float(1.0 / (1.0 - p)), pf = float(p);
  with_storage(x, [&](auto t) {  // f32, or bf16 activations (Note [bf16 kernels])
    using T = decltype(t);
    dropout_loop(x.data<T>(), y.data<T>(), mask.data<uint8_t>(), x.numel(), s, pf, seed, offset);
  });
}

void dropout_bwd(const Tensor& dy, const Tensor& mask, Tensor& dx, double p) {
  if (!same_dtype({&dy, &dx})) return ref::dropout_bwd(dy, mask, dx, p);
  with_storage(dy, [&](auto t) {
    using T = decltype(t);
    dropout_bwd_loop(dy.data<T>(), mask.data<uint8_t>(), dx.data<T>(), dy.numel(), float(1.0 / (1.0 - p)));
  });
}

void sum_squares(const Tensor& x, Tensor& out) {
  if (x.dtype() != DType::f32) return ref::sum_squares(x, out);
  const float* xp = x.data<float>();
  const int64_t n = x.numel();
  double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s) if (n > 65536)
  for (int64_t b = 0; b < n; b += 4096) {
    float part = 0;
    const int64_t e = std::min(n, b + 4096);
#pragma omp simd reduction(+ : part)
    for (int64_t i = b; i < e; ++i) part += xp[i] * xp[i];
    s += part;
  }
  if (out.dtype() == DType::f64) out.data<double>()[0] = s;
  else out.data<float>()[0] = float(s);
}

// A plane (one image's channel) at a time, as the loader normalises a sample.
void image_normalize(const Tensor& x, const Tensor& scale, const Tensor& zero, Tensor& y) {
  EG_CHECK(x.dtype() == DType::u8 && x.dim() == 4 && y.dtype() == DType::f32 && scale.numel() == x.size(1) &&
               zero.numel() == x.size(1),
           "image_normalize: u8 [N, C, H, W] pixels, f32 scale and zero [C], f32 images; got ", x.str(), ", ",
           scale.str(), ", ", zero.str(), ", ", y.str());
  const int64_t c = x.size(1), hw = x.size(2) * x.size(3), planes = x.size(0) * c;
  const uint8_t* xp = x.data<uint8_t>();
  const float *sp = scale.data<float>(), *zp = zero.data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > 65536)
  for (int64_t p = 0; p < planes; ++p) {
    const float s = sp[p % c], z = zp[p % c];
    const uint8_t* in = xp + p * hw;
    float* out = yp + p * hw;
    for (int64_t i = 0; i < hw; ++i) out[i] = float(in[i]) * s + z;
  }
}

void cast(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (x.dtype() == DType::u8 && y.dtype() == DType::f32) {
    const uint8_t* xp = x.data<uint8_t>();
    float* yp = y.data<float>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) yp[i] = float(xp[i]);
    return;
  }
  if (x.dtype() == DType::f32 && y.dtype() == DType::bf16) {
    const float* xp = x.data<float>();
    bf16_t* yp = y.data<bf16_t>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) yp[i] = float_to_bf16(xp[i]);
    return;
  }
  if (x.dtype() == DType::bf16 && y.dtype() == DType::f32) {
    const bf16_t* xp = x.data<bf16_t>();
    float* yp = y.data<float>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) yp[i] = bf16_to_float(xp[i]);
    return;
  }
  ref::cast(x, y);
}

}  // namespace eg::cpu
