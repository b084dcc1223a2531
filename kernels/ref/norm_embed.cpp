// Layer norm (last dim), embedding, dropout, sum of squares and dtype casts,
// reference. f32 and f64; statistics accumulate in double.
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/ref/ref.h"

namespace eg::ref {

namespace {

template <class T>
void ln_fwd_t(const Tensor& x, const Tensor& g, const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd, double eps) {
  const int64_t d = x.size(-1), m = x.numel() / d;
  for (int64_t r = 0; r < m; ++r) {
    const T* in = x.data<T>() + r * d;
    double mu = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mu += double(in[i]);
    mu /= double(d);
    for (int64_t i = 0; i < d; ++i) var += (double(in[i]) - mu) * (double(in[i]) - mu);
    const double rs = 1.0 / std::sqrt(var / double(d) + eps);
    mean.data<T>()[r] = T(mu);
    rstd.data<T>()[r] = T(rs);
    for (int64_t i = 0; i < d; ++i)
      y.data<T>()[r * d + i] = T((double(in[i]) - mu) * rs * double(g.data<T>()[i]) + double(b.data<T>()[i]));
  }
}

template <class T>
void ln_bwd_t(const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& mean, const Tensor& rstd, Tensor& dx,
              Tensor& dg, Tensor& db) {
  const int64_t d = x.size(-1), m = x.numel() / d;
  std::vector<double> sg(size_t(d), 0.0), sb(size_t(d), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    const T *in = x.data<T>() + r * d, *gy = dy.data<T>() + r * d;
    const double mu = double(mean.data<T>()[r]), rs = double(rstd.data<T>()[r]);
    double s1 = 0, s2 = 0;  // sums of dxhat and dxhat * xhat
    for (int64_t i = 0; i < d; ++i) {
      const double xh = (double(in[i]) - mu) * rs, dxh = double(gy[i]) * double(g.data<T>()[i]);
      s1 += dxh;
      s2 += dxh * xh;
      sg[size_t(i)] += double(gy[i]) * xh;
      sb[size_t(i)] += double(gy[i]);
    }
    if (dx.defined())
      for (int64_t i = 0; i < d; ++i) {
        const double xh = (double(in[i]) - mu) * rs, dxh = double(gy[i]) * double(g.data<T>()[i]);
        dx.data<T>()[r * d + i] = T(rs * (dxh - s1 / double(d) - xh * s2 / double(d)));
      }
  }
  for (int64_t i = 0; i < d; ++i) {
    if (dg.defined()) dg.data<T>()[i] = T(sg[size_t(i)]);
    if (db.defined()) db.data<T>()[i] = T(sb[size_t(i)]);
  }
}

template <class T>
void emb_fwd_t(const Tensor& ids, const Tensor& table, Tensor& y) {
  const int64_t d = table.size(1);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = ids.data<int64_t>()[i];
    for (int64_t k = 0; k < d; ++k) y.data<T>()[i * d + k] = table.data<T>()[id * d + k];
  }
}

template <class T>
void emb_bwd_t(const Tensor& dy, const Tensor& ids, Tensor& dt) {
  const int64_t d = dt.size(1);
  T* p = dt.data<T>();
  for (int64_t i = 0; i < dt.numel(); ++i) p[i] = T(0);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = ids.data<int64_t>()[i];
    for (int64_t k = 0; k < d; ++k) p[id * d + k] += dy.data<T>()[i * d + k];
  }
}

template <class T>
void dropout_fwd_t(const Tensor& x, Tensor& y, Tensor& mask, double p, uint64_t seed, uint64_t offset) {
  const double s = 1.0 / (1.0 - p);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool keep = double(philox_uniform(seed, offset, uint64_t(i))) >= p;
    mask.data<uint8_t>()[i] = keep;
    y.data<T>()[i] = keep ? T(double(x.data<T>()[i]) * s) : T(0);
  }
}

template <class T>
void dropout_bwd_t(const Tensor& dy, const Tensor& mask, Tensor& dx, double p) {
  const double s = 1.0 / (1.0 - p);
  for (int64_t i = 0; i < dy.numel(); ++i)
    dx.data<T>()[i] = mask.data<uint8_t>()[i] ? T(double(dy.data<T>()[i]) * s) : T(0);
}

double read_as_double(const Tensor& x, int64_t i) {
  switch (x.dtype()) {
    case DType::f32: return x.data<float>()[i];
    case DType::f64: return x.data<double>()[i];
    case DType::bf16: return bf16_to_float(x.data<bf16_t>()[i]);
    case DType::f16: return f16_to_float(x.data<f16_t>()[i]);
    case DType::s8: return x.data<int8_t>()[i];
    case DType::u8: return x.data<uint8_t>()[i];
    case DType::s32: return x.data<int32_t>()[i];
    case DType::s64: return double(x.data<int64_t>()[i]);
  }
  return 0;
}

}  // namespace

uint64_t dropout_counter(const Tensor& rng, uint64_t offset, uint64_t* seed) {
  EG_CHECK(rng.dtype() == DType::s64 && rng.numel() == 2 && rng.device().is_cpu(),
           "dropout: the random state is s64 [2] {seed, base} where the input is, got ", rng.str());
  const int64_t* v = rng.data<int64_t>();
  *seed = uint64_t(v[0]);
  return uint64_t(v[1]) + offset;
}

void layernorm_fwd(const Tensor& x, const Tensor& g, const Tensor& b, Tensor& y, Tensor& mean, Tensor& rstd,
                   double eps) {
  if (x.dtype() == DType::f64) ln_fwd_t<double>(x, g, b, y, mean, rstd, eps);
  else ln_fwd_t<float>(x, g, b, y, mean, rstd, eps);
}
void layernorm_bwd(const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& mean, const Tensor& rstd,
                   Tensor& dx, Tensor& dg, Tensor& db) {
  if (x.dtype() == DType::f64) ln_bwd_t<double>(dy, x, g, mean, rstd, dx, dg, db);
  else ln_bwd_t<float>(dy, x, g, mean, rstd, dx, dg, db);
}
void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y) {
  if (table.dtype() == DType::f64) emb_fwd_t<double>(ids, table, y);
  else emb_fwd_t<float>(ids, table, y);
}
void embedding_bwd(const Tensor& dy, const Tensor& ids, Tensor& dt) {
  if (dt.dtype() == DType::f64) emb_bwd_t<double>(dy, ids, dt);
  else emb_bwd_t<float>(dy, ids, dt);
}
void token_mask(const Tensor& ids, Tensor& mask, int64_t value, bool equal) {
  const int64_t* ip = ids.data<int64_t>();
  uint8_t* mp = mask.data<uint8_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) mp[i] = (ip[i] == value) == equal ? 1 : 0;
}
void dropout_fwd(const Tensor& x, Tensor& y, Tensor& mask, double p, const Tensor& rng, uint64_t offset) {
  uint64_t seed = 0;
  offset = dropout_counter(rng, offset, &seed);
  if (any_bf16({&x, &y})) {  // Note [bf16 kernels]
    Tensor y64 = wide_like(y);
    dropout_fwd_t<double>(widened(x), y64, mask, p, seed, offset);
    return narrowed_into(y64, y);
  }
  if (x.dtype() == DType::f64) dropout_fwd_t<double>(x, y, mask, p, seed, offset);
  else dropout_fwd_t<float>(x, y, mask, p, seed, offset);
}
void dropout_bwd(const Tensor& dy, const Tensor& mask, Tensor& dx, double p) {
  if (any_bf16({&dy, &dx})) {
    Tensor dx64 = wide_like(dx);
    dropout_bwd_t<double>(widened(dy), mask, dx64, p);
    return narrowed_into(dx64, dx);
  }
  if (dy.dtype() == DType::f64) dropout_bwd_t<double>(dy, mask, dx, p);
  else dropout_bwd_t<float>(dy, mask, dx, p);
}

void sum_squares(const Tensor& x, Tensor& out) {
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) s += read_as_double(x, i) * read_as_double(x, i);
  if (out.dtype() == DType::f64) out.data<double>()[0] = s;
  else out.data<float>()[0] = float(s);
}

Tensor widened(const Tensor& t) { return t.defined() ? t.to_plain().to(DType::f64) : t; }

void narrowed_into(const Tensor& wide, Tensor& out) {
  if (out.defined()) cast(wide, out);
}

Tensor wide_like(const Tensor& out) { return out.defined() ? Tensor::empty(out.shape(), DType::f64) : Tensor(); }

void image_normalize(const Tensor& x, const Tensor& scale, const Tensor& zero, Tensor& y) {
  EG_CHECK(x.dtype() == DType::u8 && x.dim() == 4 && y.dtype() == DType::f32 && scale.numel() == x.size(1) &&
               zero.numel() == x.size(1),
           "image_normalize: u8 [N, C, H, W] pixels, f32 scale and zero [C], f32 images; got ", x.str(), ", ",
           scale.str(), ", ", zero.str(), ", ", y.str());
  const int64_t c = x.size(1), hw = x.size(2) * x.size(3);
  const uint8_t* xp = x.data<uint8_t>();
  const float *sp = scale.data<float>(), *zp = zero.data<float>();
  float* yp = y.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t ch = i / hw % c;
    yp[i] = float(xp[i]) * sp[ch] + zp[ch];
  }
}
void cast(const Tensor& x, Tensor& y) {
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = read_as_double(x, i);
    switch (y.dtype()) {
      case DType::f32: y.data<float>()[i] = float(v); break;
      case DType::f64: y.data<double>()[i] = v; break;
      case DType::bf16: y.data<bf16_t>()[i] = float_to_bf16(float(v)); break;
      case DType::f16: y.data<f16_t>()[i] = float_to_f16(float(v)); break;
      default: EG_THROW("cast: unsupported destination dtype ", dtype_name(y.dtype()));
    }
  }
}

}  // namespace eg::ref
